"""Issue 11: the launch `planner megatron` emits means the plan. Each launch goes through
Megatron-LM's own parser (megatron-core 0.19.2, ../shared/tools/megatron_check), and the parsed
arguments are mapped back to a Plan and job settings that must equal the original, across
preset models × systems (dense, MoE with ep, fp8 recipes, fp16, FSDP, offload, interleaving
with partial recompute). The argument lists come from the rendered bash script, so the script's
own flags are what Megatron sees."""
from __future__ import annotations

import json

import pytest

from hardware import load_system
from planner import megatron as mg
from planner.megatron.emit import DROPOUT_PROBABILITY
from planner.model import ModelSpec, load_model
from planner.pipeline_layout import vp_microbatch_group
from planner.plan import JobSpec, Plan
from tests.megatron_parser import (
    ROOT,
    checker_batch,
    dtype_from_megatron,
    model_from_megatron,
    canonical,
    model_shape,
    plan_from_megatron,
)



def _published_plan_fields(run_id: str) -> dict:
    """A published run's whole plan, as planner/data/published_jobs.json keeps it."""
    from planner.evidence import load_jobs
    return next(r["plan_fields"] for runs in load_jobs().values() for r in runs if r["id"] == run_id)


# (model, system, gpus, dtype, plan fields)
CASES = [
    ("gpt3-175b", "a100-80g", 1024, "bf16",  # interleaved, 4 of 12 layers per stage recomputed
     dict(tp=8, pp=8, dp=16, vpp=2, micro_batch=1, global_batch=1536, sequence_parallel=True,
          recompute="full", recompute_num_layers=4)),
    ("llama3-70b", "h100-sxm", 512, "fp8",
     dict(tp=8, pp=4, dp=16, micro_batch=1, global_batch=512, sequence_parallel=True,
          recompute="selective", tp_comm_overlap=True, fp8_param_gather=True,
          grad_reduce_in_bf16=True, cross_entropy_fusion=True)),
    ("mixtral-8x7b", "h100-sxm", 64, "fp8-cs",
     dict(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=256, sequence_parallel=True,
          recompute="full")),
    ("llama3-8b", "b200", 16, "fp16",
     dict(tp=2, dp=8, micro_batch=2, global_batch=64, sequence_parallel=True, zero_stage=3)),
    ("llama3-8b", "h100-sxm", 16, "bf16",
     dict(cp=2, dp=8, micro_batch=1, global_batch=64, zero_stage=2)),
    # fp16 on the distributed optimizer: the fp32 gradients the plan costs must be asked for
    ("llama3-8b", "h100-sxm", 16, "fp16",
     dict(tp=2, dp=8, micro_batch=1, global_batch=64, sequence_parallel=True, zero_stage=1)),
    ("llama3-8b", "h100-sxm", 8, "bf16",
     dict(dp=8, micro_batch=1, global_batch=64, offload_activations=0.25, offload_optimizer=0.5)),
    # the Bridge Llama-3 70B GB200 FP8 recipe: Megatron-FSDP, 40 of 80 layers offloaded to Grace
    ("llama3-70b", "gb200-nvl72", 64, "fp8",
     dict(dp=64, micro_batch=2, global_batch=256, zero_stage=3, fp8_param_gather=True, offload_activations=0.5)),
    # interleaved with 10 microbatches over pp 4: Megatron's default group (N = pp) would refuse at
    # run time; the launch sets N = 5 (pipeline_layout.vp_microbatch_group)
    ("llama3-70b", "h100-sxm", 96, "bf16",
     dict(tp=8, pp=4, dp=3, vpp=5, micro_batch=1, global_batch=30, sequence_parallel=True, recompute="full")),
    ("llama3-70b", "b200", 64, "mxfp8",
     dict(tp=4, pp=2, dp=8, vpp=5, micro_batch=1, global_batch=128, sequence_parallel=True,
          fp8_param_gather=True)),
    # DeepSeek-V3's block-scaled FP8 on Hopper (--fp8-recipe blockwise), FP8 weights gathered
    ("llama3-8b", "h100-sxm", 8, "fp8-block",
     dict(dp=8, micro_batch=1, global_batch=64, recompute="full", fp8_param_gather=True)),
    ("mixtral-8x7b", "b200", 32, "nvfp4",
     dict(tp=1, pp=2, dp=16, ep=8, micro_batch=2, global_batch=256, zero_stage=1)),
    # frontier shapes: MLA + shared expert + 3 dense layers + MTP; head_dim apart from hidden/heads
    # with q/k norms (and a token-drop capacity); head_dim apart with biases and hidden % heads != 0
    ("deepseek-v3", "h100-sxm", 1024, "fp8",
     dict(tp=2, dp=512, ep=64, micro_batch=1, global_batch=1024, sequence_parallel=True,
          recompute="full", zero_stage=1)),
    (("qwen3-30b-a3b", {"capacity_factor": 1.25}), "h100-sxm", 64, "bf16",
     dict(tp=2, pp=4, dp=8, ep=8, vpp=2, micro_batch=1, global_batch=256, sequence_parallel=True,
          recompute="selective")),
    ("gpt-oss-120b", "b200", 64, "mxfp8",  # experts with biases: Megatron needs expert TP 1
     dict(pp=2, dp=32, ep=8, micro_batch=1, global_batch=128)),
    # the expert all-to-all overlap (combined 1F1B): interleaved, and without pipelining
    ("qwen3-30b-a3b", "h100-sxm", 64, "bf16",
     dict(tp=2, pp=4, dp=8, ep=8, vpp=2, micro_batch=1, global_batch=256, sequence_parallel=True,
          recompute="selective", moe_a2a_overlap=True)),
    ("qwen3-30b-a3b", "b200", 32, "mxfp8",
     dict(dp=32, ep=32, micro_batch=1, global_batch=256, moe_a2a_overlap=True)),
    # per-module selective recompute (--recompute-modules): MLA + MoE (FP8 current scaling: delayed
    # scaling refuses layernorm/moe_act), MoE, a whole MoE layer, a dense MLP
    ("deepseek-v3", "h100-sxm", 1024, "fp8-cs",
     dict(tp=2, dp=512, ep=64, micro_batch=1, global_batch=1024, sequence_parallel=True,
          recompute="selective", recompute_modules=("layernorm", "mla_up_proj", "moe_act"))),
    ("qwen3-30b-a3b", "h100-sxm", 64, "bf16",
     dict(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=256, sequence_parallel=True,
          recompute="selective", recompute_modules=("layernorm", "moe_act"))),
    ("mixtral-8x7b", "h100-sxm", 64, "bf16",
     dict(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=256, sequence_parallel=True,
          recompute="selective", recompute_modules=("moe",))),
    ("llama3-8b", "h100-sxm", 16, "bf16",
     dict(tp=2, dp=8, micro_batch=1, global_batch=64, sequence_parallel=True,
          recompute="selective", recompute_modules=("mlp",))),
    # a published layout the job gate (planner.recommend) ranks first for Qwen3-235B on 256 H100 in
    # top-1 routing (Switch / Llama 4 Scout style): Megatron needs the softmax before the top-k
    (("mixtral-8x7b", {"top_k": 1}), "h100-sxm", 64, "bf16",
     dict(tp=2, ep=8, dp=32, global_batch=256, micro_batch=1, sequence_parallel=True)),
    # hybrid Mamba stacks (pretrain_mamba.py): Nemotron 3 Nano at pp 1; Nemotron 3 Super (LatentMoE,
    # MTP with one repeated module) interleaved over pp 2 with an uneven layout as '|' segments
    ("nemotron-3-nano", "gb200-nvl72", 16, "mxfp8",
     dict(dp=16, ep=8, micro_batch=2, global_batch=128)),
    ("nemotron-3-super", "b200", 64, "mxfp8",
     dict(pp=2, dp=32, ep=8, vpp=4, micro_batch=1, global_batch=128, recompute="full",
          stage_layers=[12, 11, 11, 11, 11, 11, 11, 10])),
    # a per-stage recompute count (the per-stage CP-SAT's): Megatron's block method recomputes
    # min(n, layers) of every virtual stage, so the one-layer end stages recompute one of n = 2
    ("llama3-70b", "h100-sxm", 64, "bf16",
     dict(tp=4, pp=4, dp=4, vpp=2, micro_batch=1, global_batch=128, sequence_parallel=True, recompute="full",
          stage_layers=[1, 13, 13, 13, 13, 13, 13, 1], stage_recompute_layers=[1, 2, 2, 2, 2, 2, 2, 1])),
    # one count covering the fullest rank (17 of 3 + 14) that vpp 2 does not divide: every layer,
    # launched as a chunk's worth (14), not k // vpp (8: 3 + 8 of 17)
    ("llama3-8b", "h100-sxm", 16, "bf16",
     dict(tp=2, pp=2, dp=4, vpp=2, micro_batch=1, global_batch=64, sequence_parallel=True, recompute="full",
          recompute_num_layers=17, stage_layers=[3, 14, 14, 1])),
    # MLA without query compression, two shared experts, one leading dense layer (DeepSeek-V2-Lite);
    # a hybrid stack without experts (Nemotron-H 56B, pretrain_mamba.py); gpt-oss-20b's biased experts
    ("deepseek-v2-lite", "h100-sxm", 16, "bf16",
     dict(dp=16, ep=8, micro_batch=1, global_batch=128, recompute="selective")),
    ("nemotron-h-56b", "h100-sxm", 64, "fp8",
     dict(tp=8, dp=8, micro_batch=1, global_batch=128, sequence_parallel=True, recompute="selective")),
    # a pattern that starts with an MLP block ("-"): joined to its flag with "=", or argparse reads
    # it as an option (the pattern of Nemotron-H 56B with its first two blocks swapped)
    (("nemotron-h-56b", None, {"name": "nemotron-h-56b-mlp-first",
                                "hybrid_pattern": "-M" + load_model("nemotron-h-56b").hybrid_pattern[2:]}),
     "h100-sxm", 64, "fp8", dict(tp=8, dp=8, micro_batch=1, global_batch=128, sequence_parallel=True)),
    ("gpt-oss-20b", "h100-sxm", 8, "bf16", dict(dp=8, ep=8, micro_batch=1, global_batch=64)),
    # 94 layers over pp 4 · vpp 2: Megatron's default split is uneven (11, 12 x 6, 11), launched as a layout
    ("qwen3-235b-a22b", "h100-sxm", 512, "fp8", dict(tp=2, pp=4, vpp=2, dp=64, ep=8, micro_batch=1,
                                                     global_batch=1024, sequence_parallel=True, recompute="full")),
    # MLA with query compression and group-limited routing (DeepSeek-V2: 8 groups, top 3)
    ("deepseek-v2", "h100-sxm", 128, "fp8", dict(tp=2, pp=4, dp=16, ep=16, etp=1, micro_batch=1, global_batch=256,
                                                 sequence_parallel=True, recompute="full")),
    # tied embeddings at 1B (Llama 3.2), and Qwen3-Coder's 160 experts in MXFP8 on a GB200 rack
    ("llama3.2-1b", "h100-sxm", 8, "bf16", dict(dp=8, micro_batch=2, global_batch=64)),
    ("qwen3-coder-480b-a35b", "gb200-nvl72", 64, "mxfp8", dict(pp=4, dp=16, ep=16, micro_batch=1, global_batch=256,
                                                               recompute="full")),
    # q/k/v biases and RoPE on half of each head (GLM-4.5-Air: --add-qkv-bias --rotary-percent 0.5)
    ("glm-4.5-air", "h100-sxm", 64, "bf16", dict(tp=2, pp=2, dp=16, ep=16, etp=1, micro_batch=1, global_batch=256,
                                                 sequence_parallel=True, recompute="selective")),
    # Llama 4 Scout: top-1 routing, a shared expert, the weightless L2 q/k norm (--qk-l2-norm)
    ("llama4-scout", "h100-sxm", 64, "bf16", dict(tp=2, dp=32, ep=8, micro_batch=1, global_batch=256,
                                                  sequence_parallel=True, recompute="full")),
    # dense and MoE layers interleaved (Llama 4 Maverick: --moe-layer-freq ([0,1]*24)), pipelined
    ("llama4-maverick", "h100-sxm", 256, "bf16",
     dict(tp=2, pp=4, dp=32, ep=8, micro_batch=1, global_batch=256, sequence_parallel=True, recompute="full")),
    # PyTorch FSDP2 inside Megatron (--use-torch-fsdp2): no Megatron DDP overlap flags (FSDP2
    # prefetches on its own; --overlap-param-gather is refused without the distributed optimizer),
    # no fused wgrad accumulation, and with tp > 1 on Hopper no CUDA_DEVICE_MAX_CONNECTIONS=1
    # (bf16 gradients: FSDP2 reduces in the parameters' dtype, expressible.not_expressible)
    ("llama3-8b", "h100-sxm", 8, "bf16", dict(dp=8, micro_batch=1, global_batch=64, zero_stage=3,
                                               dp_impl="torch-fsdp2", grad_reduce_in_bf16=True)),
    ("llama3-8b", "h100-sxm", 8, "bf16", dict(tp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=3,
                                               sequence_parallel=True, dp_impl="torch-fsdp2",
                                               grad_reduce_in_bf16=True)),
    # block recompute without a pipeline: ZeRO-3 (the search's fewest fitting layers), and a
    # count given beside a whole optimizer offload
    ("gpt3-20b", "h100-sxm", 64, "bf16", dict(dp=64, micro_batch=4, global_batch=512, zero_stage=3,
                                               recompute="full", recompute_num_layers=2)),
    ("mixtral-8x7b", "gh200", 16, "bf16", dict(tp=2, dp=8, ep=8, micro_batch=2, global_batch=64, sequence_parallel=True,
                                               recompute="full", recompute_num_layers=1, offload_optimizer=1.0)),
    # FP8: the ModelZoo's Megatron-FSDP run, DeepEP, bf16 gradient reduce, as the reference data has it
    ("qwen3-235b-a22b", "h100-sxm", 256, "fp8",
     _published_plan_fields("mcore-modelzoo_qwen3-235b_256gpu_tp2_pp1_ep8_edp32_fsdp_deepep_3")),
]
# Script placeholders -> values the CPU checker can use (no data on this machine).
PLACEHOLDERS = {"$TOKENIZER_TYPE": "NullTokenizer", "$TRAIN_ITERS": "10", "$LR": "1e-4",
                "$CHECKPOINT_DIR": "/tmp/planner-ckpt"}


def _model(ref) -> ModelSpec:
    """A preset name, or (preset, MoE fields to change[, model fields to change])."""
    if isinstance(ref, str):
        return load_model(ref)
    name, moe, *fields = ref
    m = load_model(name)
    if moe:
        m = m.model_copy(update={"moe": m.moe.model_copy(update=moe)})
    return ModelSpec.model_validate({**m.model_dump(), **(fields[0] if fields else {})})


def _checker_case(model, system, gpus, dtype, fields):
    m, s = _model(model), load_system(system, gpus)
    plan, job = Plan(**fields), JobSpec(dtype=dtype)
    assert mg.launch_refusals(plan, m, job, s) == []
    launch = mg.megatron_args(plan, m, job, s, save_interval=500)
    assert mg.validate_launch(launch, mg.gpu_arch_major(s)) == []  # our fast rules agree
    env, argv, torchrun = mg.parse_script(mg.render(launch, "script"))
    assert int(torchrun["--nnodes"]) * int(torchrun["--nproc-per-node"]) == plan.gpus
    at = argv.index("--data-path")
    argv = argv[:at] + ["--mock-data"] + argv[at + 2:]
    argv = [PLACEHOLDERS.get(word, word) for word in argv]
    case = {"argv": argv, "world_size": plan.gpus, "env": env, "arch": mg.gpu_arch_major(s)}
    return case, m, plan, job, launch


SAVED = [  # `planner plan --save` runs whose files `planner megatron --plan` must launch as saved
    ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "64", "-b", "512", "--dtype", "fp8"],
    ["-m", "MODEL_YAML", "-s", "h100-sxm", "-g", "16", "-b", "64", "--dtype", "fp16", "--zero-stage", "3"],
    # costed with a full-iteration CUDA graph: a dense model's launch carries it
    ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--cuda-graph", "full-iteration"],
    # Adam's moments in bf16 (the precision-aware optimizer): costed at 4 B/param, launched with it
    ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--adam-moments", "bf16"],
    # per-layer Transformer Engine CUDA graphs of the static modules (MoE: attention, router, preprocess)
    ["-m", "qwen3-30b-a3b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--cuda-graph", "layers"],
]
DATA_ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "10", "--lr", "1e-4"]


def _saved_case(flags, tmp, monkeypatch):
    """plan --save from one directory (a relative model YAML path), megatron --plan from another."""
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.plan import load_plan
    from planner.planfile import saved_job
    runner, work, elsewhere = CliRunner(), tmp / "work", tmp / "elsewhere"
    work.mkdir(parents=True)
    elsewhere.mkdir()
    (work / "model.yaml").write_text((ROOT / "planner" / "presets" / "llama3-8b.yaml").read_text())
    flags = [("model.yaml" if f == "MODEL_YAML" else f) for f in flags]
    monkeypatch.chdir(work)
    saved = runner.invoke(app, ["plan", *flags, "--save", "plan.yaml"])
    assert saved.exit_code == 0, saved.output
    monkeypatch.chdir(elsewhere)
    out = runner.invoke(app, ["megatron", "--plan", str(work / "plan.yaml"), "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    plan = load_plan(work / "plan.yaml")
    job = saved_job(work / "plan.yaml", plan)
    case = {"argv": data["argv"] + DATA_ARGS, "world_size": data["world_size"], "env": data["env"],
            "arch": 9}
    return case, load_model(str(work / "model.yaml")) if "model.yaml" in flags else load_model(flags[1]), plan, job


@checker_batch("megatron_parser")
def _checker_cases(tmp_path_factory):
    """Every argument list of this module (built, saved, and ones Megatron must refuse)."""
    mp = pytest.MonkeyPatch()
    try:
        built = [_checker_case(*c)[:4] for c in CASES]
        saved = [_saved_case(f, tmp_path_factory.mktemp(f"saved{i}"), mp) for i, f in enumerate(SAVED)]
    finally:
        mp.undo()
    base = built[4][0]
    bad = [dict(base, argv=base["argv"] + ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]),
           dict(base, argv=base["argv"] + ["--cuda-graph-impl", "full_iteration"]),  # NaN check still on
           dict(base, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})]  # Megatron-FSDP wants it unset
    by_model = {b[1].name: b[0] for b in built}
    oss, dsv3 = by_model["gpt-oss-120b"], by_model["deepseek-v3"]
    qwen3 = next(b[0] for b in built if b[1].name == "qwen3-30b-a3b" and "--recompute-modules" in b[0]["argv"])
    at = oss["argv"].index("--tensor-model-parallel-size")  # experts with biases at expert TP 2
    bad += [dict(oss, argv=oss["argv"][:at + 1] + ["2"] + oss["argv"][at + 2:]),
            dict(dsv3, argv=dsv3["argv"] + ["--group-query-attention", "--num-query-groups", "8"]),
            # FP8 delayed scaling (Megatron's default recipe) cannot recompute layernorm / moe_act
            dict(qwen3, argv=qwen3["argv"] + ["--fp8-format", "hybrid"]),
            # moe_act recompute needs grouped GEMMs
            dict(qwen3, argv=[w for w in qwen3["argv"] if w != "--moe-grouped-gemm"])]
    # a hybrid stack's pattern holds its layout: no layout flag beside it, segments a multiple of pp
    super_ = by_model["nemotron-3-super"]
    at = super_["argv"].index("--hybrid-layer-pattern") + 1
    three = super_["argv"][at].replace("|", "", 5)  # 8 stage segments -> 3, not a multiple of pp 2
    bad += [dict(super_, argv=super_["argv"] + ["--account-for-embedding-in-pipeline-split"]),
            dict(super_, argv=super_["argv"][:at] + [three] + super_["argv"][at + 1:])]
    # the all-to-all overlap delays weight gradients into a graphed attention: TE >= 2.12 only
    a2a = next(b[0] for b in built if b[2].moe_a2a_overlap and b[2].dp_comm_overlap)
    bad.append(dict(a2a, argv=a2a["argv"] + ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn"]))
    # PyTorch FSDP2: Megatron's param-gather overlap needs its own sharded buffers; FSDP2 refuses the
    # fused wgrad accumulation and CUDA_DEVICE_MAX_CONNECTIONS=1
    fsdp2 = next(b[0] for b in built if b[2].dp_impl == "torch-fsdp2")
    bad += [dict(fsdp2, argv=fsdp2["argv"] + ["--overlap-grad-reduce", "--overlap-param-gather"]),
            dict(fsdp2, argv=[w for w in fsdp2["argv"] if w != "--no-gradient-accumulation-fusion"]),
            dict(fsdp2, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})]
    top1 = next(b[0] for b in built if b[1].moe is not None and b[1].moe.top_k == 1)
    bad.append(dict(top1, argv=[w for w in top1["argv"] if w != "--moe-router-pre-softmax"]))  # softmax of 1
    return (built, saved, bad), [b[0] for b in built + saved] + bad


@pytest.fixture(scope="module")
def parsed(megatron_checked):
    """Every argument list of this module through the shared checker process (tests/conftest.py)."""
    (built, saved, bad), results = megatron_checked.get("megatron_parser")
    n, k = len(built), len(saved)
    return {"built": list(zip(built, results[:n])), "saved": list(zip(saved, results[n:n + k])),
            "bad": list(zip(bad, results[n + k:]))}


def test_megatron_parses_every_launch_back_to_its_plan(parsed):
    fsdp_checked, fp16_checked = [], []
    for (case, m, plan, job), res in parsed["built"]:
        label = f"{m.name} {plan.short()} {job.dtype}"
        assert res["ok"], (label, res.get("error"))
        ns, cfg = res["ns"], res["cfg"]
        assert plan_from_megatron(ns, cfg, m, case["argv"]) == canonical(plan, m.layers), label
        assert ns["overlap_param_gather"] == (plan.dp_comm_overlap and plan.zero_stage in (1, 3)
                                              and plan.dp_impl != "torch-fsdp2"), label
        group = vp_microbatch_group(plan.num_microbatches, plan.pp) if plan.vpp > 1 else plan.pp
        assert ns["microbatch_group_size_per_vp_stage"] == (None if group == plan.pp else group), label
        assert dtype_from_megatron(ns) == job.dtype, label
        # MXFP8 parameters gather through the gradient buffer (Megatron-FSDP turns that off)
        assert ns["reuse_grad_buf_for_mxfp8_param_ag"] == (job.dtype == "mxfp8" and plan.fp8_param_gather
                                                           and plan.zero_stage == 1), label
        # the model Megatron builds: every shape field the cost model reads (layers, widths, heads,
        # groups, head dims, MLA, experts, shared experts, dense layers, MTP, vocab, q/k norms)
        back = model_from_megatron(ns, cfg, m.name)
        assert model_shape(back) == model_shape(m), label
        # what the cost does not read but the trained model is: MLA's latent norms, RoPE base, epsilon
        assert cfg["qk_layernorm"] == (m.qk_norm or m.mla is not None), label
        if m.position_embedding == "rope":
            assert ns["rotary_base"] == (m.rope_base or 10000), label
            assert ns["use_rope_scaling"] == (m.rope_scaling == "llama3"), label
            if m.rope_scaling == "llama3":
                assert ns["rope_scaling_factor"] == (m.rope_scaling_factor or 8.0), label
        assert cfg["layernorm_epsilon"] == pytest.approx(m.norm_epsilon or 1e-5), label
        # sliding windows and sinks (costed as full attention, launched as the model has them)
        window = cfg["window_size"]
        assert (tuple(window) if window else None) == ((m.attention_window, 0) if m.attention_window else None), label
        assert cfg["window_attn_skip_freq"] == m.window_full_every, label
        assert cfg["softmax_type"] == ("learnable" if m.attention_sinks else "vanilla"), label
        if m.moe is not None:  # the router the model was trained with
            assert (cfg["moe_router_score_function"], cfg["moe_router_enable_expert_bias"],
                    cfg["moe_router_topk_scaling_factor"]) == (m.moe.router_score, m.moe.router_expert_bias,
                                                               m.moe.router_topk_scale), label
            # softmax over all experts first: the checkpoint's (DeepSeek-V2) or Megatron's top-1 rule
            assert cfg["moe_router_pre_softmax"] == (m.moe.router_pre_softmax or (
                m.moe.top_k == 1 and m.moe.router_score == "softmax")), label
            # the balancing loss's weight: the model's own (Qwen3-MoE 1e-3) where it names one
            coeff = cfg["moe_aux_loss_coeff"]
            coeff = coeff[0] if isinstance(coeff, (list, tuple)) else coeff
            assert coeff == pytest.approx(m.moe.router_aux_loss_coeff if m.moe.router_aux_loss_coeff is not None
                                          else 1e-4 if m.moe.router_expert_bias else 1e-2), label
        if not m.biases or not (m.moe and m.moe.shared_experts > 1):
            assert back.num_params == m.num_params, label  # one shared MLP: (n-1)·h fewer biases
        # the vocabulary (unpadded where tp divides it), dropout
        assert ns["vocab_size"] == m.vocab and res["tokenizer"]["ok"], label
        if m.vocab % plan.tp == 0:
            assert res["tokenizer"]["padded_vocab_size"] == m.vocab, label
        dropout = DROPOUT_PROBABILITY if m.dropout else 0.0
        assert cfg["attention_dropout"] == cfg["hidden_dropout"] == dropout, label
        assert cfg["gated_linear_unit"] == (m.activation == "swiglu"), label
        # GPT-OSS's clamp runs where it is costed: Megatron's clamped quick-GeGLU
        assert cfg["activation_func_clamp_value"] == m.activation_clamp, label
        assert cfg["glu_linear_offset"] == (1.0 if m.activation_clamp is not None else 0.0), label
        assert cfg["add_bias_linear"] == m.biases, label
        # RoPE: fused, except a YaRN model's, costed (and launched) on the unfused path
        if m.position_embedding == "rope":
            assert ns["apply_rope_fusion"] == (m.rope_scaling != "yarn"), label
        assert ns["untie_embeddings_and_output_weights"] == (not m.tied_embeddings), label
        # MoE as the model costs it: the plan's dispatcher (DeepEP = flex), grouped GEMMs, fused fp32
        # router, the plan's expert TP (default tp)
        if m.moe is not None:
            assert (cfg["num_moe_experts"], cfg["moe_router_topk"], cfg["moe_ffn_hidden_size"]) == \
                (m.moe.num_experts, m.moe.top_k, m.expert_ffn_hidden), label
            dispatcher = "flex" if plan.moe_dispatcher == "deepep" else "alltoall"
            assert cfg["moe_token_dispatcher_type"] == dispatcher and cfg["moe_grouped_gemm"], label
            etp = plan.etp if plan.etp is not None else plan.tp
            assert ns["moe_router_dtype"] == "fp32" and cfg["expert_tensor_parallel_size"] == etp, label
            assert cfg["moe_router_fusion"], label  # the router is costed fused (time.ROUTER_PASSES)
        # attention kernel the model costs (flash/cuDNN: no s² activations)
        assert cfg["attention_backend"] == "AttnBackend.fused", label
        # FSDP: Megatron-FSDP builds ZeRO-3 shards from the meta device, env unset
        assert ns["init_model_with_meta_device"] == (plan.zero_stage == 3 and plan.dp_impl == "megatron"), label
        assert ns["gradient_accumulation_fusion"] == (plan.dp_impl != "torch-fsdp2"), label
        assert ("CUDA_DEVICE_MAX_CONNECTIONS" in case["env"]) == (plan.zero_stage < 2), label
        # the gradients run in the dtype the plan costs: fp32 unless bf16 reduction is planned
        # (Megatron-FSDP would keep them in the parameters' dtype, --fp16 DDP in fp16)
        fp32_grads = not plan.grad_reduce_in_bf16 and job.bytes_per_param.grads == 4
        if plan.zero_stage >= 2 and plan.dp_impl == "megatron":
            assert (ns["megatron_fsdp_main_grads_dtype"] == "torch.float32") == fp32_grads, label
            fsdp_checked.append(fp32_grads)
        elif plan.dp_impl == "megatron":
            assert ns["accumulate_allreduce_grads_in_fp32"] == fp32_grads, label
            fp16_checked.append(job.dtype == "fp16" and fp32_grads)
        # checkpoints and throughput logs
        assert (ns["save_interval"], ns["log_throughput"]) == (500, True), label
        assert ns["save"] == ns["load"] == PLACEHOLDERS["$CHECKPOINT_DIR"], label
    # both gradient paths were among the launches: a Megatron-FSDP plan with fp32 gradients and
    # an fp16 DDP plan
    assert True in fsdp_checked and any(fp16_checked), (fsdp_checked, fp16_checked)


def test_saved_plan_and_its_launch_agree(parsed):
    """`planner plan --save F` and `planner megatron --plan F`: same batch, dtype and every knob."""
    for (case, m, plan, job), res in parsed["saved"]:
        assert res["ok"], res.get("error")
        assert plan_from_megatron(res["ns"], res["cfg"], m) == canonical(plan, m.layers)
        assert dtype_from_megatron(res["ns"]) == job.dtype
        assert res["ns"]["global_batch_size"] == plan.global_batch
        assert res["ns"]["vocab_size"] == m.vocab
        graph = job.full_iteration_cuda_graph
        impl = "full_iteration" if graph else "transformer_engine" if job.cuda_graph_modules else "none"
        assert res["ns"]["cuda_graph_impl"] == impl
        if job.cuda_graph_modules:  # the modules the model has, as Megatron's enum reads them back
            modules = sorted(str(x).split(".")[-1] for x in res["ns"]["cuda_graph_modules"])
            assert modules == sorted(x for x in job.cuda_graph_modules if m.moe or not x.startswith("moe")
                                     if x != "mlp" or not m.moe or m.moe.first_dense_layers)
        # off with the graph (Megatron's rule), and off under fp16's dynamic loss scaling anyway
        assert res["ns"]["check_for_nan_in_loss_and_grad"] == (not graph and job.dtype != "fp16")
        bf16_moments = job.adam_moments == "bf16"
        assert job.bytes_per_param.optimizer == (4.0 if bf16_moments else 8.0)
        assert res["ns"]["use_precision_aware_optimizer"] == (bf16_moments or plan.offload_optimizer > 0)
        moment_dtype = "torch.bfloat16" if bf16_moments else "torch.float32"
        assert str(res["ns"]["exp_avg_dtype"]) == str(res["ns"]["exp_avg_sq_dtype"]) == moment_dtype
    assert any(job.full_iteration_cuda_graph for (_, _, _, job), _ in parsed["saved"])
    assert any(job.adam_moments == "bf16" for (_, _, _, job), _ in parsed["saved"])
    assert any(job.cuda_graph_modules for (_, _, _, job), _ in parsed["saved"])


def test_megatron_rejects_what_we_refuse(parsed):
    """Where our fast rules refuse an argument list, Megatron does too (same messages)."""
    for case, res in parsed["bad"]:
        ours = mg.validate_megatron_args(case["argv"], case["world_size"], case["env"], case["arch"])
        assert ours and not res["ok"]
        assert any(msg.split(".")[0][:40] in res["error"] for msg in ours), (ours, res["error"])
