"""A sixteenth pass over malformed input (an independent audit of flag combinations, YAML oddities
and plan files): a plan file whose `plan:` was no mapping, or that lacked the layout every plan file
gives, was refused only after a note on the model and system it left to defaults, two lines for one
mistake; `--save`, `megatron -o` and `sweep -o` wrote files and folders whose names held a newline
or a tab; `sweep -o LINK` to nowhere said only 'cannot create the folder LINK (File exists)'; a YAML `!!binary`
value was read as the text it encodes (a model or system named `!!binary aGVsbG8=` printed as
'hello'); a free batch capped below the pinned dp was refused without naming the cap; `--plan` beside
`--stage-recompute-layers` (or, for megatron, `--pipeline-layout`) asked for --pipeline-layout or
--pp instead of saying that a plan file is given alone."""
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


@pytest.mark.parametrize("command, flag, named", [("estimate", "--save", "save:"), ("megatron", "-o", "output:")])
def test_a_file_name_with_a_control_character_is_refused_before_it_is_written(tmp_path, command, flag, named):
    """`estimate --save $'a\\nb.yaml'` and `megatron -o $'meg\\tout.sh'` wrote files of those names
    (exit 0, the `wrote ...` line broken in two), where `sweep --name` refuses control characters."""
    job = [command, "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "16", "--tp", "2"]
    for name in ("a\nb.yaml", "a\tb.yaml", "a\x1bb.yaml"):
        one_line_error(run([*job, flag, str(tmp_path / name)]), named, "is not one line of visible text")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_output_folder_with_a_control_character_is_refused(tmp_path):
    """`sweep -o $'sw\\nnl'` created the folder and its CSV and plots, as `--name` with a newline is refused."""
    one_line_error(run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "64", "--vary", "gpus=8",
                        "-o", str(tmp_path / "sw\nnl")]), "out:", "is not one line of visible text")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_output_folder_that_is_a_link_to_nowhere_says_so(tmp_path):
    """`sweep -o swr6`, swr6 a symbolic link to a missing folder, said 'out: cannot create the folder
    swr6 (File exists)', where `ls` shows no folder: the link is named as the -m/-s readers name one."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    one_line_error(run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "64", "--vary", "gpus=8", "-o", str(link)]),
                   "out:", "is a symbolic link that leads to no folder")
    assert not (tmp_path / "nowhere").exists()


def test_a_yaml_binary_value_is_refused_as_binary_data(tmp_path):
    """`name: !!binary aGVsbG8=` in a model or system file passed as the name 'hello' (exit 0), and a
    plan file's `tp: !!binary ...` was refused in pydantic's words ('unable to parse string as an
    integer'): a value of no field's kind, said so in one line."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    model, system = tmp_path / "m.yaml", tmp_path / "s.yaml"
    model.write_text((root / "planner/presets/llama3-8b.yaml").read_text().replace(
        "name: llama3-8b", "name: !!binary aGVsbG8="))
    system.write_text((root / "hardware/presets/h100-sxm.yaml").read_text().replace(
        "name: h100-sxm", "name: !!binary aGVsbG8="))
    job = ["count", "-g", "8", "-b", "16"]
    for args in (["-m", str(model), "-s", "h100-sxm"], ["-m", "llama3-8b", "-s", str(system)]):
        one_line_error(run([*job, *args]), "name: expected text (a name), got binary data (a YAML !!binary value)")
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: {tp: !!binary aGVsbG8=, pp: 1, dp: 8, global_batch: 16}\nmodel: llama3-8b\n"
                    "system: h100-sxm\n")
    one_line_error(run(["estimate", "--plan", str(plan)]), "tp: expected a number, got binary data")


@pytest.mark.parametrize("command", ["plan", "check"])
def test_a_free_batch_cap_below_the_pinned_dp_is_named_as_the_reason(command):
    """`plan --free-batch --max-global-batch 4 --dp 8` said only 'your pins (dp=8) leave no valid
    layout; without them there are 8,010 mappings', where a fixed batch names the batch rule."""
    line = one_line_error(run([command, "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--free-batch",
                               "--max-global-batch", "4", "--dp", "8"]), "your pins (dp=8)")
    assert "batch: --max-global-batch 4 is below micro_batch·dp for every dp in [8]" in line, line


@pytest.mark.parametrize("command, flag, value", [
    ("estimate", "--stage-recompute-layers", "1"), ("megatron", "--stage-recompute-layers", "1"),
    ("megatron", "--pipeline-layout", "16,16"),
])
def test_a_layout_flag_beside_a_plan_file_is_named_as_a_plan_flag(tmp_path, command, flag, value):
    """`megatron --plan F --pipeline-layout 16,16` said 'pipeline-layout: give --pp too', and
    `--stage-recompute-layers` beside --plan 'needs --pipeline-layout', where the file holds the layout
    and every other plan flag beside --plan is refused as 'give either --plan or plan flags'."""
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: {tp: 2, pp: 2, dp: 2, global_batch: 16}\nmodel: llama3-8b\nsystem: h100-sxm\n")
    one_line_error(run([command, "--plan", str(plan), flag, value]),
                   f"plan: give either --plan or plan flags (got --plan and {flag})")
