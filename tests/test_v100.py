"""The DGX-2 V100 (hardware/presets/dgx2-v100.yaml): datasheet peaks, fp16 and unfused attention by
default, a launch Megatron's own parser accepts, and the four runs of the Megatron-LM README's 2020
tables on it, read and predicted instead of skipped."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hardware.load import load_system
from planner import megatron as mg
from planner.analytical.estimate import estimate
from planner.cli import app
from planner.cli.common import gpu_job_defaults
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.reference import load_reference
from tests.conftest import one_line_error
from tests.megatron_parser import checker_batch
from tests.test_megatron_parser import PLACEHOLDERS

runner = CliRunner()


def test_dgx2_matches_the_datasheets():
    system = load_system("dgx2-v100")
    acc = system.accelerator
    # Tesla V100 datasheet: tensor 125 TF, FP32 15.7 TF, 32 GB HBM2 at 900 GB/s; the DGX-2's
    # "2 PFLOPS" over 16 GPUs is the same 125 TF each
    assert acc.peak("fp16") == 125e12 and 16 * acc.peak("fp16") == pytest.approx(2e15)
    assert acc.peak_flops["fp32"] == 15.7e12
    assert acc.hbm_capacity_gib == 32 and acc.hbm_bandwidth_gb_per_s == 900
    # one NVSwitch domain of 16 GPUs at NVLink2's 300 GB/s bidirectional; 8x 100 Gb/s per 16 GPUs
    assert system.nvlink_domain_gpus == 16 and system.gpus_per_node == 16
    nvlink, ib = system.network
    assert nvlink.bandwidth_gb_per_s == 300 / 2
    assert ib.bandwidth_gb_per_s == pytest.approx(8 * 100 / 8 / 16)


def test_volta_defaults_to_fp16_and_unfused_attention():
    """Without --dtype, a V100 job runs fp16 (Megatron's --fp16) and the unfused attention path:
    neither Transformer Engine's fused attention nor FlashAttention-2 runs below compute
    capability 8.0. Asked for bf16, it says which precisions the GPU has."""
    defaults = gpu_job_defaults(load_system("dgx2-v100"))
    assert defaults == {"dtype": "fp16", "flash_attention": False}
    assert gpu_job_defaults(load_system("a100-80g")) == {"dtype": "bf16", "flash_attention": True}
    result = runner.invoke(app, ["plan", "-m", "gpt3-5b", "-s", "dgx2-v100", "-g", "16", "-b", "64", "--json"])
    assert result.exit_code == 0, result.output
    assert '"dtype": "fp16"' in result.output
    # the same plan with fused attention would store no s² scores: the unfused one is charged them
    plan = Plan(tp=2, dp=8, global_batch=64, micro_batch=1, sequence_parallel=True)
    model, system = load_model("gpt3-5b"), load_system("dgx2-v100", 16)
    unfused = estimate(model, system, plan, JobSpec(global_batch=64, **defaults))
    fused = estimate(model, system, plan, JobSpec(global_batch=64, dtype="fp16", flash_attention=True))
    assert unfused.hbm_bytes > fused.hbm_bytes
    result = runner.invoke(app, ["plan", "-m", "gpt3-5b", "-s", "dgx2-v100", "-g", "16", "-b", "64", "--dtype", "bf16"])
    one_line_error(result, "dtype", "has no bf16 GEMM peak", "compute capability 8.0 or newer; it is 7.0", "allowed on it: fp16")


def _v100_launch(args: list[str]) -> tuple[list[str], dict]:
    result = runner.invoke(app, ["megatron", "-s", "dgx2-v100", *args])
    assert result.exit_code == 0, result.output
    env, argv, torchrun = mg.parse_script(result.output)
    at = argv.index("--data-path")
    return [PLACEHOLDERS.get(word, word) for word in argv[:at] + ["--mock-data"] + argv[at + 2:]], env


@checker_batch("v100")
def _checker_cases(tmp_path_factory):
    """`planner megatron` on the DGX-2, as a user runs it: a dense model, and a MoE model (the
    search's best plan for Qwen3-30B-A3B on 64 V100s)."""
    dense, env = _v100_launch(["-m", "gpt3-5b", "-g", "16", "-b", "64", "--tp", "2", "--pp", "1", "--dp", "8"])
    moe, moe_env = _v100_launch(["-m", "qwen3-30b-a3b", "-g", "64", "-b", "256"])
    return (dense, moe), [{"argv": dense, "world_size": 16, "env": env, "arch": 7},
                          {"argv": moe, "world_size": 64, "env": moe_env, "arch": 7}]


def test_megatron_accepts_the_v100_launch(megatron_checked):
    (argv, _), (res, _) = megatron_checked.get("v100")
    assert "--fp16" in argv and "--bf16" not in argv
    assert argv[argv.index("--attention-backend") + 1] == "unfused"
    assert res["ok"], res.get("error")
    assert res["ns"]["fp16"] is True and res["ns"]["tensor_model_parallel_size"] == 2 and res["dp"] == 8


def test_megatron_accepts_a_v100_moe_launch_without_grouped_gemm(megatron_checked):
    """Megatron's GroupedGEMM kernels need compute capability 8 (validate_args asserts it): on a
    V100 the experts run one GEMM each, so the launch leaves --moe-grouped-gemm out, and the
    search recomputes no moe_act, which needs it."""
    (_, argv), (_, res) = megatron_checked.get("v100")
    assert "--num-experts" in argv and "--moe-grouped-gemm" not in argv
    assert res["ok"], res.get("error")
    assert res["ns"]["moe_grouped_gemm"] is False and res["ns"]["expert_model_parallel_size"] > 1


def test_grouped_gemm_before_ampere_is_refused_by_our_rules_too():
    from planner.megatron.rules import MSG_GROUPED_GEMM_ARCH
    args = {"--num-layers": "4", "--hidden-size": "256", "--num-attention-heads": "4", "--seq-length": "512",
            "--max-position-embeddings": "512", "--micro-batch-size": "1", "--global-batch-size": "8",
            "--num-experts": "4", "--moe-grouped-gemm": None, "--fp16": None}
    assert MSG_GROUPED_GEMM_ARCH in mg.validate_megatron_args(args, 8, gpu_arch_major=7)
    assert MSG_GROUPED_GEMM_ARCH not in mg.validate_megatron_args(args, 8, gpu_arch_major=8)


def test_v100_search_and_launch_leave_moe_act_out():
    from planner.search import plan as search
    model, system = load_model("qwen3-30b-a3b"), load_system("dgx2-v100", 64)
    job = JobSpec(global_batch=256, **gpu_job_defaults(system))
    pinned = search(model, system, job.model_copy(update={"pins": {"recompute": "selective"}}), top_k=5)
    assert pinned.ranked and all("moe_act" not in (r.plan.recompute_modules or ()) for r in pinned.ranked)
    on_a100 = search(model, load_system("a100-80g", 64), JobSpec(global_batch=256, pins={"recompute": "selective"}),
                     top_k=5)
    assert any("moe_act" in (r.plan.recompute_modules or ()) for r in on_a100.ranked)  # the rule binds only here
    act = pinned.ranked[0].plan.model_copy(update={"recompute_modules": ("moe_act",)})
    refusals = mg.launch_refusals(act, model, job, system)
    assert any("moe_act needs the grouped expert GEMM" in r for r in refusals), refusals


def test_the_readme_2020_v100_runs_are_compared_not_skipped():
    cases, skipped = load_reference()
    v100 = [c for c in cases if "v100" in c.id]
    assert len(v100) == 4 and not [s for s in skipped if "v100" in s.id]
    for case in v100:
        assert case.system.accelerator.name == "V100-SXM3-32GB" and case.job.dtype == "fp16"
    # one fitted GEMM ceiling (the A100's other efficiencies) puts all four within 10 %
    from planner.fit import prepare
    for p in prepare(v100):
        assert p.predict_s() / p.case.measured_step_s == pytest.approx(1.0, abs=0.10), p.case.id


def test_megatron_refuses_a_volta_plan_costed_with_fused_attention(tmp_path):
    """`estimate --flash-attention` on a V100 costs fused attention (a what-if) and saves it; the
    launch of that file said --attention-backend fused, which no kernel runs below 8.0."""
    saved = tmp_path / "fa.yaml"
    result = runner.invoke(app, ["estimate", "-m", "gpt3-5b", "-s", "dgx2-v100", "-g", "16", "-b", "64", "--tp", "2",
                                 "--flash-attention", "--save", str(saved)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["megatron", "--plan", str(saved)])
    one_line_error(result, "flash_attention", "compute capability 8.0 or newer", "--no-flash-attention")
