"""Property-based guard of issue 10 item 3: any value of any numeric flag of any sub-command ends
in exit 0, 1 or 2, never a traceback, and output under --json is strict JSON (one object)."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from hardware import load_system
from hardware.errors import SpecError
from planner.analytical import estimate
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec, make_plan

runner = CliRunner()

# What a user (or a script) may type: zero, negative, huge, NaN, inf, a float for an int, text.
HOSTILE = ["0", "-1", "-7", "1048577", "1000000000000", "1e30", "99999999999999999999999999999",
           "nan", "inf", "-inf", "2.5", "0.0001", "abc", "", "0x10", "1_000"]
VALUE = st.one_of(st.sampled_from(HOSTILE), st.integers(-2, 40).map(str),
                  st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr))

# Small, fast bases (Llama 3 8B on 8 H100: every search is a fraction of a second).
BASE = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "8"]
PIN_FLAGS = ["--tp", "--pp", "--dp", "--cp", "--ep", "--micro-batch", "--vpp", "--zero-stage",
             "--offload-weights", "--offload-activations", "--offload-optimizer"]
COMMANDS = {
    "estimate": (BASE + ["--tp", "1", "--pp", "1"], ["-g", "--seq-length", "-b", "--hbm-reserve-gib",
                                                      "--recompute-num-layers", "--bf16-layers", *PIN_FLAGS]),
    "plan": (BASE + ["-b", "64", "--top", "2"], ["-g", "--seq-length", "-b", "--max-global-batch",
                                                 "--hbm-reserve-gib", "--top", *PIN_FLAGS]),
    "check": (BASE + ["-b", "64"], ["-g", "--seq-length", "-b", "--max-global-batch", "--hbm-reserve-gib",
                                    *PIN_FLAGS]),
    "count": (BASE + ["--free-batch"], ["-g", "--seq-length", "--max-global-batch"]),
    "checkpoint": (BASE, ["-g", "--tp", "--pp", "--dp", "--cp", "--zero-stage", "--write-gb-per-s",
                          "--read-gb-per-s", "--target-write-s", "--gpu-mtbf-hours", "--restart-s"]),
    "megatron": (BASE + ["--tp", "1", "--pp", "1", "-b", "64"], ["-g", "--seq-length", "-b", *PIN_FLAGS]),
}
JSON_COMMANDS = ("estimate", "plan", "check", "count", "checkpoint")


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"non-JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(command=st.sampled_from(sorted(COMMANDS)), data=st.data(), as_json=st.booleans())
def test_any_flag_value_gives_a_clean_exit(command, data, as_json):
    base, flags = COMMANDS[command]
    chosen = data.draw(st.lists(st.sampled_from(flags), min_size=1, max_size=2, unique=True))
    args = [command, *base]
    for flag in chosen:
        args += [flag, data.draw(VALUE)]
    as_json = as_json and command in JSON_COMMANDS
    if as_json:
        args.append("--json")
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, (args, result.output)
    if as_json:
        assert isinstance(_strict_json(result.stdout), dict), (args, result.stdout)
    elif result.exit_code == 2:
        assert len([line for line in result.output.splitlines() if line.strip()]) == 1, (args, result.output)


# Every hostile value on every flag, one test each (the list is short: no sampling needed). A
# sweep that accepts its input runs and plots a point (~1 s), so the six flags inside one test
# made it the suite's longest; apart, the test workers share them.
@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("flag", ["-g", "-b", "--max-global-batch", "-j", "--time-limit", "--vary"])
def test_sweep_flag_values_give_a_clean_exit(tmp_path, flag, value):
    out = tmp_path
    vary = f"gpus={value}" if flag == "--vary" else "gpus=8"
    args = ["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "--vary", vary, "--out", str(out / flag),
            "--no-explain", "-j", "1", "--json"]
    if flag != "--vary":
        args += [flag, value]
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 1, 2), (args, result.output)
    assert "Traceback" not in result.output
    assert isinstance(_strict_json(result.stdout), dict), (args, result.stdout)


# ---- the Python API: bad values are SpecError / pydantic ValidationError, nothing else ------------

KNOB = st.one_of(st.integers(-2, 70), st.sampled_from([0, 10**12, math.nan, math.inf, 2.5, -0.5, True, "x"]))


@pytest.fixture(scope="module")
def small_inputs():
    return load_model("llama3-8b"), load_system("h100-sxm", 8)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(knobs=st.fixed_dictionaries({}, optional={k: KNOB for k in (
    "tp", "pp", "dp", "cp", "ep", "micro_batch", "vpp", "zero_stage", "offload_weights", "global_batch")}),
       reserve=st.sampled_from([0.0, 2.0, -1.0, math.nan, math.inf]))
def test_api_bad_values_raise_input_errors_only(small_inputs, knobs, reserve):
    model, system = small_inputs
    fields = {"tp": 1, "pp": 1, "dp": 8, "global_batch": 64, **knobs}
    try:
        plan = make_plan(**fields)
        job = JobSpec(hbm_reserve_gib=reserve)
    except (SpecError, ValidationError):
        return
    est = estimate(model, system, plan, job)  # a plan that validated must estimate without raising
    assert est.feasible == (not est.violations)
