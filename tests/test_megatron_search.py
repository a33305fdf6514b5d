"""Every plan the search picks on the preset systems must be a Megatron launch Megatron accepts,
and the emitted script must parse back to the same GPU count and batch arithmetic.

The suite checks one system of each class (SUITE_SYSTEMS) with every model, each precision on
every system and every model in each precision on two or more systems (a pairwise design,
SUITE_CASES: 18 searches of the 36 in the full cross); the other presets differ from their
class's representative only in HBM size, efficiency constants or clock (no other code path: the
same GPU generation, node size, NVLink domain and offload tier). The full matrix (every preset
system, every model in every precision):

    PARPLAN_FULL_MATRIX=1 python -m pytest -q tests/test_megatron_search.py

and bench/megatron_roundtrip.py takes every preset model and system through Megatron's own parser.
"""
import os

import pytest

from hardware import load_system, system_preset_names
from hardware.errors import SpecError
from planner import megatron as mg
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan

MODELS = ("gpt3-175b", "llama3-70b", "mixtral-8x7b")
# One preset per system class: Ampere without FP8 (the fp8 SpecError path), Hopper on 8-GPU
# nodes, the same with an offload tier, Grace Hopper (4-GPU nodes, a 32-GPU NVLink domain, an
# offload tier), Blackwell on 8-GPU nodes, Blackwell NVL72 (4-GPU nodes, a 72-GPU NVLink domain).
# Left to the full matrix: a100-40g (Ampere), h200, h100-grand-teton (Hopper), b300
# (Blackwell), gb300-nvl72 (NVL72). Volta (a 16-GPU NVSwitch node, no bf16: its "bf16" cases run
# fp16, what `planner` defaults to there) is dgx2-v100.
SUITE_SYSTEMS = ("a100-80g", "h100-sxm", "h100-offload-1tib", "gh200", "b200", "gb200-nvl72", "dgx2-v100")
FULL_MATRIX = bool(os.environ.get("PARPLAN_FULL_MATRIX"))
SYSTEMS = system_preset_names() if FULL_MATRIX else SUITE_SYSTEMS
DTYPES = ("bf16", "fp8")


def pairwise(systems, models, dtypes=DTYPES):
    """(system, model, dtype) with every system-model pair once, the precision alternating along
    both: each system runs each precision and each model runs each precision on every other
    system."""
    return [(s, m, dtypes[(i + j) % len(dtypes)]) for i, s in enumerate(systems) for j, m in enumerate(models)]


SUITE_CASES = ([(s, m, d) for s in SYSTEMS for m in MODELS for d in DTYPES] if FULL_MATRIX
               else pairwise(SUITE_SYSTEMS, MODELS))
# (GPUs, largest global batch) per model: the dense models on 256 GPUs (batch <= 1024); Mixtral on
# 32 (batch <= 128, the same 4 sequences per GPU), where its search costs a third of the time on
# 256 (~1.3 s a case against ~3 s: its layouts, ep x etp x cp x vpp x layer layouts, barely shrink
# from 256 GPUs to 64) and its top 3 still spans what 256 GPUs' did across the systems: ep 2-8
# across nodes, etp 1 with sp, cp, pp 2 with vpp and per-stage layer layouts, activation offload,
# the all-to-all overlap, selective recompute, ZeRO 1-3
JOB_SIZE = {"gpt3-175b": (256, 1024), "llama3-70b": (256, 1024), "mixtral-8x7b": (32, 128)}


def test_suite_systems_cover_every_system_class():
    """Each class of the presets (GPU generation x node size x NVLink domain x offload tier, and
    FP8 or not) has a representative in SUITE_SYSTEMS."""
    def system_class(name):
        s = load_system(name, 256)
        return (mg.gpu_arch_major(s), s.gpus_per_node, s.nvlink_domain_gpus, s.offload is not None,
                "fp8" in s.accelerator.peak_flops)
    assert set(SUITE_SYSTEMS) <= set(system_preset_names())
    assert {system_class(n) for n in SUITE_SYSTEMS} == {system_class(n) for n in system_preset_names()}


def test_suite_cases_cover_every_pair():
    """Every (system, model), (system, precision) and (model, precision) pair of the suite's
    systems is searched, the last on two or more systems with an FP8 peak (the A100's FP8 case
    is the refusal path)."""
    cases = pairwise(SUITE_SYSTEMS, MODELS)
    assert {(s, m) for s, m, _ in cases} == {(s, m) for s in SUITE_SYSTEMS for m in MODELS}
    assert {(s, d) for s, _, d in cases} == {(s, d) for s in SUITE_SYSTEMS for d in DTYPES}
    fp8_capable = {s for s in SUITE_SYSTEMS if "fp8" in load_system(s, 8).accelerator.peak_flops}
    for m in MODELS:
        for d in DTYPES:
            assert len({s for s, m_, d_ in cases if (m_, d_) == (m, d) and s in fp8_capable}) >= 2, (m, d)


@pytest.mark.parametrize("system_name,model_name,dtype", SUITE_CASES)
def test_searched_plans_emit_valid_megatron(system_name, model_name, dtype):
    gpus, max_batch = JOB_SIZE[model_name]
    model, system = load_model(model_name), load_system(system_name, gpus)
    if dtype == "bf16" and "bf16" not in system.accelerator.peak_flops:
        dtype = "fp16"
    job = JobSpec(global_batch=None, max_global_batch=max_batch, dtype=dtype,
                  flash_attention=mg.gpu_arch_major(system) >= 8)
    if dtype == "fp8" and "fp8" not in system.accelerator.peak_flops:
        with pytest.raises(SpecError, match="fp8"):
            plan(model, system, job, top_k=1)
        return
    result = plan(model, system, job, top_k=3)
    assert result.ranked, f"no plan for {model_name} on {system_name}"
    for ranked in result.ranked:
        p = ranked.plan
        assert mg.not_expressible(p, model, job) == []
        launch = mg.megatron_args(p, model, job, system)
        assert mg.validate_launch(launch, mg.gpu_arch_major(system)) == []
        env, argv, torchrun = mg.parse_script(mg.render(launch, "script"))
        args = mg.parse_megatron_args(argv)
        tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
        cp = args.context_parallel_size
        world = int(torchrun["--nnodes"]) * int(torchrun["--nproc-per-node"])
        assert world == gpus and world % (tp * pp * cp) == 0
        dp = world // (tp * pp * cp)
        assert (tp, pp, cp, dp) == (p.tp, p.pp, p.cp, p.dp)
        assert args.global_batch_size % (args.micro_batch_size * dp) == 0
