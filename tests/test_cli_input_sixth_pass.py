"""A sixth pass over malformed input (an audit of about 700 commands): each case names the field
the user wrote (a flag, or a plan file's key) with what is allowed, in one line with exit 2, and
a what-is-missing answer names the rule that binds, not another."""
from __future__ import annotations

import copy
import json

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

runner = CliRunner()


def run(args: list[str]):
    return runner.invoke(app, args)


@pytest.fixture
def saved_plan(llama3_8b_plan_file_text) -> dict:
    return yaml.safe_load(llama3_8b_plan_file_text)


def _edited(tmp_path, saved: dict, edit, name: str = "edited.yaml") -> str:
    data = copy.deepcopy(saved)
    edit(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# ---- check: the binding rule ------------------------------------------------------------------

def test_check_names_expert_folding_not_the_batch_when_etp_ep_pp_cannot_divide_the_gpus():
    """etp 4 · ep 8 · pp 1 = 32 does not divide 16 GPUs: the batch (1536 = 96·16) is not the problem."""
    out = run(["check", "-m", "mixtral-8x7b", "-s", "h100-sxm", "-g", "16", "-b", "1536", "--ep", "8", "--etp", "4",
               "--tp", "1", "--pp", "1", "--json"])
    assert out.exit_code == 2, out.output  # the pins contradict the GPU count: a mistake in the input
    error = json.loads(out.output)["error"]
    assert "etp·ep·pp must divide 16" in error and "batch:" not in error, error


def test_an_etp_that_cannot_divide_the_gpus_is_not_offered():
    """Mixtral's expert FFN (14336 = 2^11·7) divides by 7, but 7 never divides 16 GPUs."""
    line = one_line_error(run(["plan", "-m", "mixtral-8x7b", "-s", "h100-sxm", "-g", "16", "-b", "64", "--etp", "3"]))
    allowed = line.split("allowed: ")[1].split(",")
    assert [a.strip() for a in allowed] == ["1", "2", "4", "8"], line


def test_the_batch_reason_names_the_pinned_dp():
    out = run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--allow-idle-gpus",
               "--tp", "1", "--pp", "1", "--dp", "3"])
    line = one_line_error(out)
    assert "any dp in [3]" in line, line


# ---- plan files -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["estimate", "megatron"])
def test_a_plan_files_reserve_larger_than_the_hbm_is_refused_as_the_files(tmp_path, saved_plan, command):
    path = _edited(tmp_path, saved_plan, lambda d: d["job"].update(hbm_reserve_gib=100))
    line = one_line_error(run([command, "--plan", path]))
    assert "job: hbm_reserve_gib" in line and "allowed: 0 <= reserve < 79.6" in line, line


@pytest.mark.parametrize("command", ["estimate", "megatron"])
def test_a_reserve_flag_larger_than_the_hbm_is_refused(command):
    line = one_line_error(run([command, "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1",
                               "--pp", "1", "--hbm-reserve-gib", "100"]))
    assert line.startswith("error: hbm-reserve-gib:"), line


@pytest.mark.parametrize("key, name, word", [("model", "nope", "unknown preset 'nope'"),
                                             ("system", "h100-sxn", "did you mean h100-sxm?")])
def test_an_unknown_preset_in_a_plan_file_is_named_as_a_preset_of_the_file(tmp_path, saved_plan, key, name, word):
    path = _edited(tmp_path, saved_plan, lambda d: d.update({key: name}))
    line = one_line_error(run(["estimate", "--plan", path]))
    assert f"plan {path}: {key}:" in line and word in line and "allowed:" in line, line


def test_a_plan_file_without_gpus_is_told_where_the_count_came_from(tmp_path, saved_plan):
    path = _edited(tmp_path, saved_plan, lambda d: d.pop("gpus"))
    line = one_line_error(run(["estimate", "--plan", path]))
    assert "gives no gpus" in line and "--gpus 8" in line and "the file says" not in line, line


@pytest.mark.parametrize("key, value, word", [("step_time_s", "fast", "step_time_s"),
                                              ("step_time_s", float("nan"), "step_time_s"),
                                              ("objective", "xyz", "objective")])
def test_a_plan_files_saved_results_are_what_plan_writes(tmp_path, saved_plan, key, value, word):
    path = _edited(tmp_path, saved_plan, lambda d: d.update({key: value}))
    assert word in one_line_error(run(["estimate", "--plan", path]))


def test_a_plan_file_costed_with_other_parameter_bytes_is_not_launched(tmp_path, saved_plan):
    """Megatron keeps 16-bit parameters: a plan costed at 3 B per weight is not what it would run."""
    path = _edited(tmp_path, saved_plan, lambda d: d["job"]["bytes_per_param"].update(weights=3.0))
    assert "bytes_per_param.weights" in one_line_error(run(["megatron", "--plan", path]))
    assert run(["estimate", "--plan", path]).exit_code == 0  # costing it is the user's what-if


def test_a_nan_offload_fraction_is_refused_as_not_finite(tmp_path, saved_plan):
    path = _edited(tmp_path, saved_plan, lambda d: d["plan"].update(offload_activations=float("nan")))
    line = one_line_error(run(["estimate", "--plan", path]))
    assert "offload_activations" in line and "finite" in line, line


# ---- flags ------------------------------------------------------------------------------------

def test_the_divisibility_hint_names_the_defaulted_knob():
    # no layout flag: the default example's tp 8 pp 8, which 8 GPUs cannot hold
    line = one_line_error(run(["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64"]))
    assert "tp 8, pp 8 by default" in line and "set --tp or --pp" in line and "--dp" not in line, line
    # a layout flag given: the rest is tp=pp=cp=1, as `planner megatron` reads it (was pp 8: refused)
    tp2 = run(["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "2", "--json"])
    assert tp2.exit_code == 0 and json.loads(tp2.stdout)["plan"]["pp"] == 1, tp2.output


def test_an_unknown_dtype_is_named_as_the_flag():
    line = one_line_error(run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--dtype", "fp64"]))
    assert line.startswith("error: dtype: unknown 'fp64'; allowed: bf16"), line


def test_the_moe_overlap_on_a_dense_model_says_why():
    line = one_line_error(run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64",
                               "--moe-a2a-overlap"]))
    assert "MoE models only" in line and ": true is" in line, line


def test_megatron_offload_on_a_system_without_a_tier_says_so():
    line = one_line_error(run(["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "2",
                               "--pp", "1", "--offload-activations", "0.5"]))
    assert "no offload memory tier" in line, line


def test_sweep_names_a_bad_vary_value_before_existing_outputs(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.csv").write_text("precious\n")
    line = one_line_error(run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "64", "--vary", "nvlink_domain=0",
                               "-g", "8", "-o", str(out)]))
    assert "nvlink_domain" in line, line
    assert (out / "sweep.csv").read_text() == "precious\n"


def test_a_plan_file_that_breaks_a_layout_rule_is_an_input_error_as_the_flags_are(tmp_path, saved_plan):
    """vpp 2 at pp 1: the same flags are refused (exit 2); the file said 'Not feasible' with exit 1."""
    path = _edited(tmp_path, saved_plan, lambda d: d["plan"].update(vpp=2, pp=1))
    assert "vpp_needs_pp" in one_line_error(run(["estimate", "--plan", path]))
    flags = run(["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1", "--pp", "1",
                 "--vpp", "2"])
    assert flags.exit_code == 2


@pytest.mark.parametrize("model, gpus, pins, idle, word", [
    # pp 2 and dp 1 leave tp·cp = 12, which no tp and cp of the domains give
    ("llama3-8b", 24, {"pp": 2, "dp": 1}, False, "gpus: no tp in"),
    # each rule can hold alone, not all at once: tp 1 · pp 3 with etp 4 folds over 12 GPUs only,
    # which are not whole 8-GPU nodes (idle GPUs allowed: 3 or 6 GPUs, whole-node counts)
    ("qwen3-30b-a3b", 12, {"tp": 1, "pp": 3, "etp": 4}, True, "layout: no layout meets"),
    # ep 16 needs pp 1 on 16 GPUs (etp 1: biased experts), and then tp 1 · dp 1 leaves cp 16
    ("gpt-oss-20b", 16, {"tp": 1, "ep": 16, "dp": 1}, False, "layout: no layout meets"),
])
def test_check_names_the_layout_rule_that_binds_not_the_batch(model, gpus, pins, idle, word):
    """Where no layout exists at any batch, the batch is not what binds (each of these was told
    'the global batch 64 is not a multiple of micro_batch·dp'); at a batch every dp divides, the
    same pins still leave no layout."""
    from constraints.space import build_space, layouts
    from hardware.load import load_system
    from planner.model import load_model
    from planner.plan import JobSpec
    from planner.search import check
    m, s = load_model(model), load_system("h100-sxm", gpus)
    job = JobSpec(global_batch=64, pins=pins, allow_idle_gpus=idle)
    res = check(m, s, job)
    assert not res.feasible and any(r.startswith(word) for r in res.reasons), res.reasons
    assert not any(r.startswith("batch:") for r in res.reasons), res.reasons
    any_batch = job.model_copy(update={"global_batch": 2**10 * 3 * 5 * 7})  # every dp up to 16 divides it
    assert len(layouts(build_space(m, s, any_batch))["tp"]) == 0
