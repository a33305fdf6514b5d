"""`planner`: the typer app. Each sub-command lives in its own cli_*.py module."""
from __future__ import annotations

import sys

import typer

from hardware.errors import SpecError

app = typer.Typer(
    add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
    help="Plan tensor/pipeline/data parallelism, batch, recompute and offload for LLM training.\n\n"
         "Start with `planner plan` (GPT-3 175B on 1024 A100) or `planner presets`.")


@app.callback()
def _root() -> None:
    """Plan tensor/pipeline/data parallelism, batch, recompute and offload for LLM training."""


def _register_commands() -> None:
    import importlib
    for name in ("cli_estimate", "cli_search", "cli_megatron", "cli_checkpoint", "cli_sweep",
                 "cli_validate"):
        try:
            module = importlib.import_module(f"planner.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"planner.{name}":
                raise
            continue
        module.register(app)


_register_commands()


def main() -> None:
    """Console entry point: user mistakes become one line on stderr and exit code 2."""
    try:
        app(standalone_mode=True)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
