"""A fourteenth pass over malformed input (an independent audit of user files, saved plans, flag
combinations and the Python API): a hand-edited plan file's batch beyond the --global-batch cap was
costed and launched, the Python API's estimate and pins fell into an AttributeError or a
ZeroDivisionError, a compute capability written in its sm_XY form (90) passed as 90.0 and let an
H100 launch MXFP8, and a few messages kept pydantic's words or lacked the near field name."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str]):
    return runner.invoke(app, args)


def test_a_plan_files_batch_beyond_the_flags_cap_is_refused(tmp_path, llama3_8b_plan_file_text):
    """`-b 1000000000000` is refused (the cap is 2^20 sequences), but the same batch written into a
    saved plan file was costed (31,250,000,000 microbatches) and launched by `planner megatron`."""
    doc = yaml.safe_load(llama3_8b_plan_file_text)
    batch = doc["plan"]["micro_batch"] * doc["plan"]["dp"] * 2 ** 21
    doc["plan"]["global_batch"] = doc["global_batch"] = batch
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for args in (["estimate", "--plan", str(path)], ["megatron", "--plan", str(path)],
                 ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--versus", str(path)]):
        one_line_error(run(args), "global_batch: must be an integer from 1 to 1,048,576", f"{batch:,}")


def test_the_python_apis_missing_plan_and_zero_tp_pin_are_input_errors():
    """`estimate(model, system, None, job)` raised AttributeError ('NoneType' object has no
    attribute 'global_batch') where a dict there is a one-line SpecError; a pin of tp 0 raised
    ZeroDivisionError inside the NVLink hint, where pp 0 or cp 0 are 'not a legal value here'."""
    from hardware.errors import SpecError
    from planner import JobSpec, check, count, estimate, load_model, load_system, plan
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 64)
    with pytest.raises(SpecError, match=r"^plan: expected a Plan \(e\.g\. Plan\(.*got NoneType"):
        estimate(model, system, None, JobSpec(global_batch=512))
    for search in (plan, check, count):
        with pytest.raises(SpecError, match=r"^pin tp: 0 is not a legal value here; allowed: 1, 2, 4, 8$"):
            search(model, system, JobSpec(global_batch=512, pins={"tp": 0}))
