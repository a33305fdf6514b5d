"""A sixteenth pass over malformed input (an independent audit of flag combinations, YAML oddities
and plan files): a plan file whose `plan:` was no mapping, or that lacked the layout every plan file
gives, was refused only after a note on the model and system it left to defaults, two lines for one
mistake."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

runner = CliRunner()


def run(args: list[str]):
    return runner.invoke(app, args)


@pytest.mark.parametrize("text, said", [
    ("plan:\n", "plan: expected a mapping of plan fields, got null"),
    ("plan: [tp, pp]\n", "plan: expected a mapping of plan fields, got a list"),
    ('{"plan": {"tp": 2,}}\n', "missing pp, dp, global_batch"),
])
@pytest.mark.parametrize("command", ["estimate", "megatron"])
def test_a_plan_file_that_is_no_plan_is_one_line_without_a_note_on_defaults(tmp_path, text, said, command):
    """`planner estimate --plan F` with `plan:` empty (or a list, or a layout of tp alone) printed
    'note: plan F names no model and no system; using gpt3-175b ..., a100-80g ...' (or 'looks cut
    short ... costing it with this command's settings') and then refused the file: a note on how the
    file would be costed, above an error saying it will not be."""
    path = tmp_path / "p.yaml"
    path.write_text(text + ("" if text.startswith("{") else "seq_length: 8192\nglobal_batch: 16\n"))
    one_line_error(run([command, "--plan", str(path)]), said)
