"""Checkpoint sizing, storage bandwidth and interval, against hand calculations."""
from __future__ import annotations

import json
import math

import pytest
import typer
from typer.testing import CliRunner

from hardware import load_system
from hardware.errors import SpecError
from planner import checkpoint as ck
from planner.model import load_model
from planner.cli import app
from planner.plan import BytesPerParam, Plan, make_plan

GPT3_PARAMS = 174_615_846_912  # planner/presets/gpt3-175b.yaml (Narayanan et al.: 174.6B)


@pytest.fixture(scope="module")
def gpt3():
    return load_model("gpt3-175b")


def plan(tp=8, pp=8, dp=16, cp=1, zero_stage=0) -> Plan:
    return Plan(tp=tp, pp=pp, dp=dp, cp=cp, zero_stage=zero_stage, global_batch=dp)


# ---- size ------------------------------------------------------------------------------------
def test_gpt3_checkpoint_is_14_bytes_per_param(gpt3):
    assert gpt3.num_params == GPT3_PARAMS
    assert ck.checkpoint_bytes_per_param() == 14.0  # 2 weights + 4 master + 8 Adam m, v
    size = ck.checkpoint_bytes(gpt3)
    assert size == GPT3_PARAMS * 14
    assert size == pytest.approx(174.6e9 * 14, rel=1e-3)  # ~2.44 TB
    assert ck.checkpoint_weights_bytes(gpt3) + ck.checkpoint_optimizer_bytes(gpt3) == size


def test_weights_only_and_custom_accounting(gpt3):
    assert ck.checkpoint_bytes(gpt3, include_optimizer=False) == GPT3_PARAMS * 2
    fp32 = BytesPerParam(weights=4, master=0, optimizer=8)
    assert ck.checkpoint_bytes(gpt3, fp32) == GPT3_PARAMS * 12


def test_size_independent_of_gpus_and_plan(gpt3):
    sizes = set()
    for gpus, p in ((1024, plan(8, 8, 16)), (512, plan(8, 1, 64, zero_stage=1)),
                    (64, plan(4, 4, 2, cp=2, zero_stage=3))):
        system = load_system("a100-80g", gpus)
        report = ck.checkpoint_report(gpt3, system, p, write_gb_per_s=100, read_gb_per_s=100)
        sizes.add(report.checkpoint_bytes)
    assert sizes == {GPT3_PARAMS * 14}


# ---- who writes ------------------------------------------------------------------------------
def test_writers_every_rank_under_torch_dist_fully_parallel_save(gpt3):
    """Megatron's default torch_dist format saves fully parallel over the dp·cp group (megatron-core
    0.19 training_config.py fully_parallel_save True), with or without the distributed optimizer:
    every rank writes an even share. (An audit, 2026-11-28, found the legacy format's one replica
    counted for ZeRO 0 and weights-only checkpoints.)"""
    for zero in (0, 1, 3):
        p = plan(8, 8, 16, zero_stage=zero)
        assert ck.writer_ranks(p) == ck.checkpoint_files(p) == 1024
        assert ck.writer_ranks(p, include_optimizer=False) == 1024
        assert ck.bytes_per_writer(gpt3, p) == pytest.approx(GPT3_PARAMS * 14 / 1024)
    assert ck.model_parallel_shards(plan(8, 8, 16)) == 64  # 8 DGX nodes hold one copy of the model


def test_restore_read_bytes(gpt3):
    w, o = GPT3_PARAMS * 2, GPT3_PARAMS * 12
    assert ck.restore_read_bytes(gpt3, plan(zero_stage=0)) == 16 * (w + o)  # each replica: all
    assert ck.restore_read_bytes(gpt3, plan(zero_stage=1)) == 16 * w + o    # optimizer once
    assert ck.restore_read_bytes(gpt3, plan(zero_stage=3)) == w + o         # everything once
    assert ck.restore_time_s(2e12, 100) == pytest.approx(20.0)


# ---- bandwidth -------------------------------------------------------------------------------
def test_write_time_and_bandwidth_needed(gpt3):
    size = ck.checkpoint_bytes(gpt3)
    assert ck.write_time_s(size, 100) == pytest.approx(size / 100e9)   # ~24.4 s
    assert ck.write_time_s(size, 1000) == pytest.approx(size / 1e12)   # ~2.4 s
    assert ck.write_bandwidth_needed_gb_per_s(size, 60) == pytest.approx(size / 60 / 1e9)  # ~40.7
    # round trip: writing at the needed bandwidth takes the target time
    assert ck.write_time_s(size, ck.write_bandwidth_needed_gb_per_s(size, 42)) == pytest.approx(42)
    for bad in (0, -1, float("nan")):
        with pytest.raises(SpecError):
            ck.write_time_s(size, bad)


# ---- reliability -----------------------------------------------------------------------------
def test_job_mtbf_scales_inversely_with_gpus():
    assert ck.job_mtbf_s(1024, 50_000) == pytest.approx(50_000 * 3600 / 1024)  # 175,781.25 s
    assert ck.job_mtbf_s(2048, 50_000) == pytest.approx(ck.job_mtbf_s(1024, 50_000) / 2)
    assert ck.job_mtbf_s(1024) == ck.job_mtbf_s(1024, ck.DEFAULT_GPU_MTBF_HOURS)
    assert ck.job_mtbf_s(1024, node_mtbf_hours=1000, gpus_per_node=8) == pytest.approx(1000 * 3600 / 128)
    with pytest.raises(SpecError):
        ck.job_mtbf_s(1024, 50_000, 1000)


def test_young_interval():
    assert ck.young_interval_s(60, 30_000) == pytest.approx(math.sqrt(3.6e6))  # 1897.37 s
    assert ck.young_interval_s(60, 30_000) == pytest.approx(1897.3666, rel=1e-7)


def test_daly_interval_hand_case():
    # C = 300 s, M = 30,000 s: C/2M = 0.005, sqrt(2CM) = 4242.6407,
    # factor 1 + 0.0707107/3 + 0.005/9 = 1.0241258 -> 4344.9977 - 300 = 4044.9977 s
    assert ck.daly_interval_s(300, 30_000) == pytest.approx(4044.9977, rel=1e-6)
    assert ck.daly_interval_s(300, 30_000) < ck.young_interval_s(300, 30_000)
    assert ck.daly_interval_s(1000, 400) == 400  # C >= 2M: checkpoint every MTBF


def test_goodput_is_dalys_complete_model():
    """Daly (2006): T_w = M e^(R/M) (e^((tau+C)/M) - 1) T_s / tau under exponential failures."""
    # tau 1000, C 10, M 1e5, R 100, by hand: 1000 / (1e5 · 1.0010005 · 0.0101512) = 0.984123
    assert ck.goodput_fraction(1000, 10, 1e5, 100) == pytest.approx(
        1000 / (1e5 * math.exp(0.001) * (math.exp(0.0101) - 1)), rel=1e-12)
    assert ck.goodput_fraction(1000, 10, 1e5, 100) == pytest.approx(0.984123, abs=1e-6)
    # where tau, C, R << M it agrees with the first-order 1 - C/tau - ((tau + C)/2 + R)/M = 0.98395
    assert ck.goodput_fraction(1000, 10, 1e5, 100) == pytest.approx(0.98395, abs=3e-4)
    # Daly's interval is the optimum of this model, not Young's
    for c, m, r in ((10, 1e5, 100), (48.89, 3515.6, 905.6), (300, 2000, 600)):
        daly = ck.daly_interval_s(c, m)
        best = ck.goodput_fraction(daly, c, m, r)
        assert best >= ck.goodput_fraction(ck.young_interval_s(c, m), c, m, r)
        assert best >= ck.goodput_fraction(0.95 * daly, c, m, r) and best >= ck.goodput_fraction(1.05 * daly, c, m, r)
    # the audit's case (GPT-3 175B on 4,096 A100, 500 h node MTBF): 65.09 % at Young, 65.11 % at Daly;
    # the first-order form had said 56.87 / 56.84 %
    assert ck.goodput_fraction(586.3, 48.89, 3515.6, 905.6) == pytest.approx(0.6509, abs=2e-4)
    assert ck.goodput_fraction(1e9, 10, 1e5) == 0.0  # no progress, no overflow


def test_report_gpt3_1024(gpt3):
    system = load_system("a100-80g", 1024)
    r = ck.checkpoint_report(gpt3, system, plan(8, 8, 16, zero_stage=0), write_gb_per_s=100,
                             read_gb_per_s=200, target_write_s=30, gpu_mtbf_hours=50_000, restart_s=300)
    assert r.model_copy_gpus == 64 and r.model_copy_nodes == 8 and r.files == 1024
    assert r.write_s == pytest.approx(GPT3_PARAMS * 14 / 100e9)
    assert r.write_gb_per_s_needed == pytest.approx(GPT3_PARAMS * 14 / 30e9)
    assert r.restore_s == pytest.approx(16 * GPT3_PARAMS * 14 / 200e9)
    assert r.recovery_s == pytest.approx(300 + r.restore_s)
    assert r.young_interval_s == pytest.approx(math.sqrt(2 * r.write_s * 50_000 * 3600 / 1024))
    with pytest.raises(SpecError, match="must equal the number of GPUs"):
        ck.checkpoint_report(gpt3, system, plan(8, 8, 8), write_gb_per_s=100, read_gb_per_s=100)


# ---- CLI -------------------------------------------------------------------------------------
runner = CliRunner()


def invoke(*args: str):
    from planner.cli import app
    # With only one sub-command registered typer runs it as the app itself (no group).
    is_group = hasattr(typer.main.get_command(app), "commands")
    return runner.invoke(app, (["checkpoint"] if is_group else []) + list(args))


def test_cli_table():
    result = invoke("--model", "gpt3-175b", "--system", "a100-80g", "--gpus", "1024",
                    "--tp", "8", "--pp", "8", "--zero-stage", "0")
    assert result.exit_code == 0, result.output
    assert "2.44 TB" in result.output and "Young" in result.output and "Daly" in result.output
    assert "64 GPUs = 8 nodes" in result.output


def test_cli_json_defaults_layout():
    result = invoke("--gpus", "1024", "--pp", "8", "--json", "--write-gb-per-s", "1000")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["plan"].startswith("tp8 pp8 dp16")
    assert data["checkpoint_bytes"] == GPT3_PARAMS * 14
    assert data["writer_ranks"] == 1024  # default zero_stage 1: distributed optimizer
    assert data["write_s"] == pytest.approx(GPT3_PARAMS * 14 / 1e12)


@pytest.mark.parametrize("args", [
    ("--write-gb-per-s", "-5"),
    ("--read-gb-per-s", "0"),
    ("--tp", "8", "--pp", "8", "--dp", "8"),
    ("--gpu-mtbf-hours", "50000", "--node-mtbf-hours", "1000"),
    ("--tp", "3"),
    ("--restart-s", "-1"),
    ("--model", "no-such-model"),
])
def test_cli_bad_input_exit_2(args):
    result = invoke("--gpus", "1024", *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "error:" in result.output


def test_moe_checkpoint_reads_each_expert_shard_in_its_own_replicas():
    """A routed expert's shard lives in dp*cp/ep replicas, not dp*cp: DeepSeek-V3's restore had been
    priced as if every replica held every expert (401 TB at tp4 dp288, ep ignored)."""
    from planner.checkpoint import expert_params, restore_read_bytes
    from planner.cli.checkpoint import default_ep
    m = load_model("deepseek-v3")
    experts = expert_params(m)
    # 256 routed experts of 3 x 7168 x 2048 in 58 MoE layers and the MTP module
    assert experts == (58 + 1) * 256 * 3 * 7168 * 2048
    assert default_ep(m, 288, 1) == 32  # the largest dividing 256 experts and 288 replicas
    plan = make_plan(tp=4, pp=1, dp=288, ep=32, zero_stage=1, global_batch=288)
    dense = m.num_params - experts
    want = (dense * 288 + experts * 288 / 32) * 2 + m.num_params * 12
    assert restore_read_bytes(m, plan) == pytest.approx(want, rel=1e-12)
    r = runner.invoke(app, ["checkpoint", "-m", "deepseek-v3", "-s", "gb200-nvl72", "-g", "1152", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert "ep32" in out["plan"] and out["model_copy_gpus"] == 4 * 32 and not out["notes"]
    assert "1 MTP module" in out["params_note"]


def test_checkpoint_says_when_its_layout_cannot_train_or_cannot_keep_up():
    r = runner.invoke(app, ["checkpoint", "-m", "deepseek-v3", "-s", "gb200-nvl72", "-g", "1152", "--ep", "1",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert any("does not fit" in n and "--ep" in n for n in json.loads(r.stdout)["notes"])
    r = runner.invoke(app, ["checkpoint", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16384", "--gpu-mtbf-hours",
                            "1", "--write-gb-per-s", "10", "--json"])
    assert any("cannot keep up" in n for n in json.loads(r.stdout)["notes"])
    r = runner.invoke(app, ["checkpoint", "-m", "llama3-70b", "-s", "h100-sxm", "-g", "256", "--zero-stage", "0",
                            "--weights-only", "--json"])
    assert json.loads(r.stdout)["assumptions"][0].startswith("checkpoint = weights only")


def test_bf16_adam_moments_make_a_smaller_checkpoint_and_the_default_mtbf_is_its_source():
    """A plan with bf16 moments (DeepSeek-V3's recipe) saves 2 + 4 + 4 = 10 B/param, not 14: the
    command had no --adam-moments. The default per-GPU MTBF is the Llama 3 paper's numbers."""
    assert ck.DEFAULT_GPU_MTBF_HOURS == pytest.approx(54 * 24 * 16_384 / 419)  # 50,677 h
    base = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--json"]
    fp32 = json.loads(invoke(*base).stdout)
    bf16 = json.loads(invoke(*base, "--adam-moments", "bf16").stdout)
    assert fp32["checkpoint_bytes_per_param"] == 14 and bf16["checkpoint_bytes_per_param"] == 10
    assert bf16["checkpoint_bytes"] == pytest.approx(fp32["checkpoint_bytes"] * 10 / 14)
    assert "adam-moments" in invoke(*base, "--adam-moments", "fp8").output


@pytest.mark.parametrize("zero", ["0", "2", "3"])
def test_bf16_adam_moments_need_the_distributed_optimizer(zero):
    """The precision-aware optimizer (bf16 moments) runs on the distributed optimizer only, as
    `planner estimate` and `planner megatron` say: a 10 B/param checkpoint at ZeRO-0/2/3 had been
    sized for a run Megatron refuses to launch."""
    r = invoke("-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--zero-stage", zero, "--adam-moments", "bf16")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert "bf16 moments need Megatron's precision-aware optimizer" in r.output
    assert f"got --zero-stage {zero}" in r.output


def test_checkpoint_help_names_no_plan_file():
    """`planner checkpoint` reads no plan file: its --adam-moments help said '(with --plan: the plan
    file's)', an option the command does not have."""
    r = invoke("--help")
    assert r.exit_code == 0
    assert "--plan" not in r.output


def test_checkpoint_takes_the_expert_tp_a_plan_runs():
    """`planner plan` runs GLM-4.5 on 256 H100 as tp4 pp8 dp8 ep16 etp1; checkpoint had no --etp,
    took expert TP = tp (4·16·8 = 512 ranks per expert copy, on 256 GPUs) and refused the layout."""
    r = invoke("-m", "glm-4.5", "-s", "h100-sxm", "-g", "256", "--tp", "4", "--pp", "8", "--dp", "8", "--ep", "16",
               "--etp", "1", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["plan"] == "tp4 pp8 dp8 ep16 etp1 zero1"
    assert data["model_copy_gpus"] == 8 * 16  # pp · etp · ep: the experts' group is wider than tp
    # a routed expert's shards are read by its world/(etp·ep·pp) = 2 expert-DP ranks, the dense
    # weights by every one of the 8 DP replicas; the optimizer state once
    spec = load_model("glm-4.5")
    experts = ck.expert_params(spec)
    assert data["read_bytes"] == pytest.approx(((spec.num_params - experts) * 8 + experts * 2) * 2
                                               + spec.num_params * 12)
