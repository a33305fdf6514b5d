"""What `planner plan` prints fits an 80-column terminal without breaking a plan's items apart."""
from typer.testing import CliRunner

from planner.cli import app
from planner.report import fold_at_separators

runner = CliRunner()


def test_fold_breaks_only_between_items():
    text = "TP 8 · PP 4 · DP 32 · micro-batch 3 · global batch 1536 (16 microbatches) · VPP 8 · SP"
    folded = fold_at_separators(text, 40)
    lines = folded.splitlines()
    assert all(len(line) <= 40 for line in lines), lines
    # a line of two or more items keeps room for its trailing separator (one item may be wider)
    for width in range(20, 90):
        assert all(len(line) <= width for line in fold_at_separators(text, width).splitlines()
                   if " · " in line), width
    # lines break only at separators: rejoined there, they are the text again
    assert folded.replace(" ·\n", " · ") == text
    assert len(lines) > 1
    assert fold_at_separators(text, 200) == text
    # an item wider than the line keeps a line of its own
    assert fold_at_separators("a · " + "x" * 50 + " · b", 10).splitlines() == ["a ·", "x" * 50 + " ·", "b"]


def test_plan_header_and_next_best_table_at_80_columns():
    r = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "128", "-k", "3"],
                      terminal_width=80)
    assert r.exit_code == 0, r.output
    header = r.output.splitlines()[1:3]
    assert header[0].startswith("TP ")
    # no item of the plan line is split across lines: each line ends with a separator or the end
    assert all(line.rstrip().endswith("·") for line in header[:-1] if "ZeRO" not in line)
    # one global batch: the table ranks by step time alone, without batch or tokens/s columns
    table = r.output[r.output.index("Next best"):]
    assert "tokens/s" not in table.splitlines()[1] and "why it lost" in table
