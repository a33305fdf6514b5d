"""Per-GPU memory of MoE / MLA / MTP plans against hand derivations from Megatron-Core 0.19.2."""
import pytest

from hardware import load_system
from planner.analytical import estimate
from planner.model import load_model
from planner.plan import Plan


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
