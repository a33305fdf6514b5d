from pathlib import Path

import pytest

from hardware import load_system
from planner.model import load_model

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "measured_runs.yaml"


@pytest.fixture(scope="session")
def gpt3():
    return load_model("gpt3-175b")


@pytest.fixture(scope="session")
def a100():
    return load_system("a100-80g")
