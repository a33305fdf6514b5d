from pathlib import Path

import pytest

from hardware import load_system
from planner.model import load_model

from planner.reference import REFERENCE_DIR
from tests.megatron_parser import CheckedBatches

# The packaged copy of the published runs (planner/data/reference); the shared original beside the
# repository, when there is one, must equal it (tests/test_reference_loader.py).
REFERENCE = REFERENCE_DIR / "measured_runs.yaml"
SHARED_REFERENCE_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference"


@pytest.fixture(scope="session")
def gpt3():
    return load_model("gpt3-175b")


@pytest.fixture(scope="session")
def a100():
    return load_system("a100-80g")


def one_line_error(result, *words):
    """A CLI result that is a user error: exit 2, exactly one `error:` line naming `words`."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="session")
def megatron_checked(tmp_path_factory):
    """Every module's Megatron argument lists through one checker process (tests/megatron_parser.py)."""
    return CheckedBatches(tmp_path_factory)
