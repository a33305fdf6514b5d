import copy
import functools
import os
from pathlib import Path

import pytest

from hardware import load_system
from hardware.errors import safe_load_packaged
from planner.model import load_model

from planner.reference import REFERENCE_DIR
from tests.megatron_parser import CheckedBatches

# The packaged copy of the published runs (planner/data/reference); the shared original beside the
# repository, when there is one, must equal it (tests/test_reference_loader.py).
REFERENCE = REFERENCE_DIR / "measured_runs.yaml"
SHARED_REFERENCE_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference"


def pytest_configure(config):
    """Compile the project's packages once, in the process that starts the run, so that the xdist
    workers and the processes the tests start read byte code instead of each compiling every
    module again, as they would where PYTHONDONTWRITEBYTECODE is set (about 15 s of a run on 2
    cores). __pycache__ is ignored by git; a tree that cannot be written is left as it is."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has done it
        # The workers already fill the CPUs, as `planner sweep`'s do (planner.threads): extra
        # search threads only contend with the other worker (the oracle cases took 13 % longer).
        # tests/test_threads.py sets the variable itself where it tests the threads.
        from planner.threads import THREADS_ENV  # noqa: PLC0415
        os.environ.setdefault(THREADS_ENV, "1")
        return
    import compileall  # noqa: PLC0415
    root = Path(__file__).resolve().parents[1]
    for package in ("planner", "constraints", "hardware"):
        compileall.compile_dir(root / package, quiet=2)


def reference_yaml(path: Path) -> dict:
    """A reference file's YAML document, parsed once per test process (PyYAML's C parser where it
    has one; the pure-Python safe_load took ~3 s for the three files, and six tests each re-read
    them). A new top-level mapping each call; the records inside are shared: deep-copy one
    before changing it."""
    return dict(_parsed_yaml(str(Path(path).resolve())))


def reference_copy(path: Path) -> dict:
    """A reference file's YAML document as `reference_yaml` reads it, deep-copied: the caller may
    change any record (a test building its own reference file from the packaged one)."""
    return copy.deepcopy(_parsed_yaml(str(Path(path).resolve())))


@functools.lru_cache(maxsize=None)
def _parsed_yaml(path: str) -> dict:
    return safe_load_packaged(Path(path).read_text())


@pytest.fixture(scope="session")
def reference_accuracy_rows():
    """planner.calibration.accuracy_rows of every packaged reference case, computed once per test
    process (~5 s; four modules read it). Read-only: filter or copy, never change a row."""
    from planner.calibration import accuracy_rows, load_reference  # noqa: PLC0415
    return accuracy_rows(load_reference()[0])


@pytest.fixture(scope="session")
def prepared_reference():
    """planner.fit.prepare of every packaged reference case, once per test process (the
    calibration fit's input; two modules read it). Read-only: the fits and Batched only read it."""
    from planner.fit import prepare  # noqa: PLC0415
    from planner.reference import load_reference  # noqa: PLC0415
    return prepare(load_reference()[0])


@pytest.fixture(scope="session")
def gpt3():
    return load_model("gpt3-175b")


@pytest.fixture(scope="session")
def a100():
    return load_system("a100-80g")


# Hugging Face config fixtures (tests/fixtures/hf/<name>/config.json)
HF_FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def hf_fixture_config(name: str) -> dict:
    """A fixture's config.json as a dict (a new one each call: the caller may change it)."""
    import json  # noqa: PLC0415
    return json.loads((HF_FIXTURES / name / "config.json").read_text())


def write_hf_config(tmp_path: Path, cfg: dict, name: str = "config.json") -> Path:
    """`cfg` written as JSON to tmp_path/name, for `-m PATH`."""
    import json  # noqa: PLC0415
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def one_line_error(result, *words) -> str:
    """A CLI result that is a user error: exit 2, exactly one `error:` line naming `words` (no
    traceback, no internal error, no warning beside it); the line."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    for leak in ("Traceback", "internal error", "Warning"):
        assert leak not in result.output, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="session")
def megatron_checked(tmp_path_factory):
    """Every module's Megatron argument lists through one checker process (tests/megatron_parser.py)."""
    return CheckedBatches(tmp_path_factory)


@pytest.fixture(scope="session")
def llama3_8b_plan_file_text(tmp_path_factory) -> str:
    """A plan file as `planner plan --save` writes it (Llama-3 8B on 8 H100, batch 64), as text."""
    from typer.testing import CliRunner

    from planner.cli.app import app
    path = tmp_path_factory.mktemp("plan") / "p.yaml"
    result = CliRunner().invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1",
                                      "--save", str(path)])
    assert result.exit_code == 0, result.output
    return path.read_text()
