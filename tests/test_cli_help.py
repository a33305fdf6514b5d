"""-h is --help everywhere, and --version names the package."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()


@pytest.mark.parametrize("command", [[], ["plan"], ["estimate"], ["megatron"], ["sweep"], ["validate"]])
def test_short_help_is_help(command):
    short, long = runner.invoke(app, [*command, "-h"]), runner.invoke(app, [*command, "--help"])
    assert short.exit_code == long.exit_code == 0
    assert short.output == long.output and "Usage: " in short.output


def test_version():
    from importlib.metadata import version
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"parplan {version('parplan')}"
