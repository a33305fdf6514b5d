"""What the per-process caches (eighteenth session) must not change: each caller still gets its
own reference records, a preset's overrides still apply per call, and every CLI command still
parses its own flags after another command ran in the same process."""
from typer.testing import CliRunner

from planner.cli import app
from planner.model import load_model
from planner.reference import DEFAULT_REFERENCES, load_records


def test_reference_records_are_each_callers_own():
    path = DEFAULT_REFERENCES[0]
    first, _ = load_records(path)
    record_id = first[0]["id"]
    first[0]["id"] = "changed by a caller"
    first.clear()
    again, _ = load_records(path)
    assert again and again[0]["id"] == record_id


def test_reference_records_follow_the_files_content(tmp_path):
    text = DEFAULT_REFERENCES[0].read_text()
    copy = tmp_path / "runs.yaml"
    copy.write_text(text)
    n = len(load_records(copy)[0])
    # the same path, new content (the same size and, on a coarse clock, the same mtime)
    copy.write_text(text.replace("records:", "records: []\nold_records:", 1))
    assert n > 0 and load_records(copy)[0] == []


def test_preset_overrides_apply_per_call():
    plain = load_model("llama3-8b")
    longer = load_model("llama3-8b", {"seq_length": 2 * plain.seq_length})
    assert longer.seq_length == 2 * plain.seq_length
    assert load_model("llama3-8b").seq_length == plain.seq_length
    assert load_model("llama3-8b", {"seq_length": None}) == plain  # None: keep the preset's


def test_each_command_parses_its_own_flags_after_another_ran():
    runner = CliRunner()
    first = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--tp", "2",
                                "--pp", "1", "-b", "16", "--json"])
    assert first.exit_code == 0, first.output
    # `--top` is plan's, not estimate's: refused there, taken here, in the same process
    assert runner.invoke(app, ["estimate", "--top", "2"]).exit_code == 2
    second = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "2",
                                 "--json"])
    assert second.exit_code == 0, second.output
    again = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--tp", "2",
                                "--pp", "1", "-b", "16", "--json"])
    assert again.stdout == first.stdout
