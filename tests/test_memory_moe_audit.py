"""Per-GPU memory of MoE / MLA / MTP plans against hand derivations from Megatron-Core 0.19.2."""
import pytest

from hardware import load_system
from planner.analytical import estimate
from planner.analytical.ranks import pipeline_ranks
from planner.model import load_model
from planner.plan import JobSpec, Plan


def test_expert_tp_keeps_etp_copies_of_the_permuted_rows():
    """Mixtral 8x7B (h 4096, top-2, 32 MoE layers, s 4096) on 32 H100, tp 4 SP, ep 8, pp 1,
    micro-batch 1, bf16: one microbatch in flight, 32 layers.

    Megatron's AlltoAll dispatcher all-gathers the permuted rows over the expert-TP group after
    the EP all-to-all (token_dispatcher.py dispatch_postprocess), so a GPU's grouped FC1 keeps
    etp·k rows of width h per local token (s·b/t = 1024 tokens): 2 B · etp · 2 · 4096 per token.
    The FFN activations (etp× the rows at 1/etp the width) do not change with etp. So etp 4 keeps
    (4 − 1) · 2 B · 2 · 4096 · 1024 · 32 layers = 1,610,612,736 B more than etp 1 (1.5 GiB; the
    model gave 0 before), and nothing more when `moe` recompute checkpoints the whole MoE MLP."""
    model = load_model("mixtral-8x7b")
    system = load_system("h100-sxm", 32)
    base = dict(tp=4, pp=1, dp=8, ep=8, micro_batch=1, global_batch=8, sequence_parallel=True)

    def act(**kw):
        return estimate(model, system, Plan(**base, **kw)).memory_breakdown_bytes["activations_bytes"]
    assert act(etp=None) - act(etp=1) == pytest.approx(3 * 2 * 2 * 4096 * 1024 * 32, rel=1e-9)
    moe = dict(recompute="selective", recompute_modules=["moe"])
    assert act(etp=None, **moe) == pytest.approx(act(etp=1, **moe), rel=1e-12)


def test_pipelined_mtp_stage_holds_its_own_embedding():
    """DeepSeek-V3 (V 129,280, h 7168, untied, one MTP module) on 512 B200, tp 1 pp 8 cp 2
    ep 32 etp 1, distributed optimizer, full recompute: dp = 512/(8·2) = 32, so dense state is
    sharded over dp·cp = 64.

    Megatron builds a word embedding on every stage that runs an MTP module (gpt_model.py:
    `if self.pre_process or self.mtp_process: self.embedding = LanguageModelEmbedding(...)`), so
    the last stage holds two V×h matrices, the MTP embedding and the LM head, each a trained
    parameter: (2 B weight + 4 B fp32 grad + 12/64 B of optimizer) per element:
    2 · 129,280 · 7168 · (6 + 12/64) = 11,467,652,620 B = 10.68 GiB (the model gave half,
    5.34 GiB). That makes the last rank the fullest (56.5 GiB, not 51.1)."""
    model = load_model("deepseek-v3")
    system = load_system("b200", 512)
    plan = Plan(tp=1, pp=8, cp=2, dp=32, ep=32, etp=1, micro_batch=1, global_batch=2048, recompute="full")
    m = estimate(model, system, plan).memory_breakdown_bytes
    rows = pipeline_ranks(model, system, JobSpec(), plan)
    assert max(rows, key=lambda r: r.hbm_bytes).rank == 7
    assert m["embeddings_bytes"] == pytest.approx(2 * 129280 * 7168 * (6 + 12 / 64), rel=1e-9)
    # without a pipeline the one embedding serves the MTP module too: embedding + LM head
    flat = estimate(model, load_system("b200", 256), Plan(tp=1, pp=1, dp=256, ep=64, etp=1, micro_batch=1,
                                                          global_batch=256, recompute="full"))
    assert flat.memory_breakdown_bytes["embeddings_bytes"] == pytest.approx(2 * 129280 * 7168 * (6 + 12 / 256), rel=1e-9)


def test_mla_latents_are_kept_and_mla_up_proj_frees_their_normed_copies():
    """DeepSeek-V3's MLA (h 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128).

    Megatron's MLA (multi_latent_attention.py) keeps, per token of the layer's SP shard, the
    down-projections' outputs q_compressed (1536) and kv_combined (512 + 64), 16-bit, as the
    inputs of the up-projections' fused latent norms (TELayerNormColumnParallelLinear), and the
    norms' outputs (1536 + 512), the up-projection GEMMs' inputs: 2·2112 + 2·2048 = 8320 B per
    token in bf16 (1.16 s·b·h; the model kept none of it).

    mla_up_proj recompute (CheckpointWithoutOutput around the norms + up-projections + RoPE)
    keeps the latents, its inputs, and frees Q, K, V (2·(128·192 + 128·192 + 128·128) =
    131,072 B per token, tp-sharded) and the norm outputs (4096 B per token, SP-sharded). At tp 2
    SP, pp 1, micro-batch 1 (s·b/t = 2048 tokens per GPU for both kinds), 61 layers + the MTP
    module's layer, one microbatch in flight: 62 · 2048 · (131,072 + 4096) = 17,163,091,968 B."""
    from planner.analytical.memory import activation_parts
    model = load_model("deepseek-v3")
    assert activation_parts(model)["mla_latents"] * 7168 == pytest.approx(8320, rel=1e-12)
    system = load_system("h100-sxm", 1024)
    base = dict(tp=2, pp=1, dp=512, ep=64, etp=1, micro_batch=1, global_batch=512, sequence_parallel=True)

    def act(**kw):
        return estimate(model, system, Plan(**base, **kw)).memory_breakdown_bytes["activations_bytes"]
    freed = act() - act(recompute="selective", recompute_modules=["mla_up_proj"])
    assert freed == pytest.approx(62 * 2048 * (131072 + 4096), rel=1e-9)
