"""Options and loaders shared by every `planner` sub-command (one place, one wording)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from hardware import load_system
from hardware.errors import SpecError
from hardware.spec import SystemSpec
from planner.model import ModelSpec, load_model
from planner.plan import JobSpec

DEFAULT_MODEL = "gpt3-175b"
DEFAULT_SYSTEM = "a100-80g"
DEFAULT_GPUS = 1024
DEFAULT_BATCH = 1536

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m", help="Model preset (see `planner presets`), a model YAML file, or a Hugging Face config.json "
    "(or the model directory holding it).")]
SystemOpt = Annotated[str, typer.Option(
    "--system", "-s", help="System preset (see `planner presets`) or a system YAML file.")]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", "-g", help="Number of GPUs (default: the system preset's count).")]
SeqOpt = Annotated[Optional[int], typer.Option(
    "--seq-length", help="Override the model's sequence length (tokens). A Hugging Face config.json "
    "defaults to 4096 (or its max_position_embeddings if smaller), not its full context.")]
BatchOpt = Annotated[Optional[int], typer.Option(
    "--global-batch", "-b", help="Global batch in sequences (fixed).")]
MaxBatchOpt = Annotated[int, typer.Option(
    "--max-global-batch", help="Largest global batch the search may pick when --global-batch is not given.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="Compute precision: bf16, fp16 or fp8.")]
ReserveOpt = Annotated[float, typer.Option(
    "--hbm-reserve-gib", help="HBM per GPU kept free for CUDA context, NCCL and fragmentation (GiB).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
NoOffloadOpt = Annotated[bool, typer.Option("--no-offload", help="Never offload to the secondary memory tier.")]
FrameworkOpt = Annotated[str, typer.Option(
    "--framework", help="megatron (only plans Megatron-LM can run; default) or any (also weight offload).")]
IdleGpusOpt = Annotated[bool, typer.Option("--allow-idle-gpus", help="Allow tp·pp·dp·cp below the GPU count.")]
TpAcrossNodesOpt = Annotated[bool, typer.Option(
    "--tp-across-nodes", help="Let tensor parallelism leave the NVLink domain (costed on the inter-node network).")]


def load_inputs(model: str, system: str, gpus: int | None, seq_length: int | None = None
                ) -> tuple[ModelSpec, SystemSpec]:
    if seq_length is not None and seq_length < 1:
        raise SpecError(f"seq-length: must be a positive integer, got {seq_length}")
    return load_model(model, {"seq_length": seq_length}), load_system(system, gpus)


SavedModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Model preset or YAML (default: the one a --plan file names, else gpt3-175b).")]
SavedSystemOpt = Annotated[Optional[str], typer.Option(
    "--system", "-s", help="System preset or YAML (default: the one a --plan file names, else a100-80g).")]


def load_inputs_for_plan(model: str | None, system: str | None, gpus: int | None, seq_length: int | None,
                         plan_file) -> tuple[ModelSpec, SystemSpec]:
    """load_inputs, where a file saved by `planner plan --save` supplies what the user did not give."""
    saved: dict = {}
    if plan_file:
        from pathlib import Path

        from hardware.errors import read_yaml_mapping
        saved = read_yaml_mapping(Path(plan_file), "plan")
        saved = saved if "plan" in saved else {}
    return load_inputs(model or saved.get("model") or DEFAULT_MODEL, system or saved.get("system") or DEFAULT_SYSTEM,
                       gpus or saved.get("gpus"), seq_length or saved.get("seq_length"))


def make_job(global_batch: int | None = None, max_global_batch: int = 3072, dtype: str = "bf16",
             hbm_reserve_gib: float = 2.0, **extra) -> JobSpec:
    from pydantic import ValidationError

    from hardware.errors import one_line
    try:
        return JobSpec(global_batch=global_batch, max_global_batch=max_global_batch, dtype=dtype,
                       hbm_reserve_gib=hbm_reserve_gib, **extra)
    except ValidationError as err:
        raise one_line(err, "job") from None


# ---- plan knobs: the same flags, wording and checks for plan/check (pins), estimate and megatron
TpOpt = Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel size.")]
PpOpt = Annotated[Optional[int], typer.Option("--pp", help="Pipeline-parallel size.")]
DpOpt = Annotated[Optional[int], typer.Option("--dp", help="Data-parallel size (default: GPUs/(tp·pp·cp)).")]
CpOpt = Annotated[Optional[int], typer.Option("--cp", help="Context-parallel size.")]
EpOpt = Annotated[Optional[int], typer.Option("--ep", help="Expert-parallel size (MoE).")]
MicroBatchOpt = Annotated[Optional[int], typer.Option("--micro-batch", help="Micro-batch size (sequences).")]
VppOpt = Annotated[Optional[int], typer.Option("--vpp", help="Virtual pipeline stages per rank (interleaving).")]
SpOpt = Annotated[Optional[bool], typer.Option(
    "--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism (needs tp > 1).")]
RecomputeOpt = Annotated[Optional[str], typer.Option("--recompute", help="Activation recompute: none, selective or full.")]
RecomputeLayersOpt = Annotated[Optional[int], typer.Option(
    "--recompute-num-layers", help="Full recompute: layers per pipeline stage (default all).")]
ZeroOpt = Annotated[Optional[int], typer.Option(
    "--zero-stage", help="0 plain DP, 1 distributed optimizer, 2 +grads, 3 +params (FSDP).")]
OffloadWeightsOpt = Annotated[Optional[float], typer.Option(
    "--offload-weights", help="Fraction of weights+grads in the offload tier (not expressible in Megatron).")]
OffloadActivationsOpt = Annotated[Optional[float], typer.Option(
    "--offload-activations", help="Fraction of activations in the offload tier.")]
OffloadOptimizerOpt = Annotated[Optional[float], typer.Option(
    "--offload-optimizer", help="Fraction of optimizer state in the offload tier.")]
TpOverlapOpt = Annotated[Optional[bool], typer.Option(
    "--tp-comm-overlap/--no-tp-comm-overlap", help="Overlap TP communication with GEMMs (needs SP).")]
DpOverlapOpt = Annotated[Optional[bool], typer.Option(
    "--dp-comm-overlap/--no-dp-comm-overlap", help="Overlap DP gradient reduce / parameter gather.")]

PLAN_KNOB_FLAGS = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "vpp", "sequence_parallel", "recompute",
                   "recompute_num_layers", "zero_stage", "offload_weights", "offload_activations",
                   "offload_optimizer", "tp_comm_overlap", "dp_comm_overlap")
RECOMPUTE_CHOICES = ("none", "selective", "full")


def given_knobs(options: dict) -> dict:
    """The plan-knob flags the user gave (not None), checked: no negatives, known recompute."""
    knobs = {}
    for knob in PLAN_KNOB_FLAGS:
        value = options.get(knob)
        if value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise SpecError(f"{knob.replace('_', '-')}: must not be negative, got {value}")
        if knob == "recompute" and value not in RECOMPUTE_CHOICES:
            raise SpecError(f"recompute: unknown {value!r}; allowed: {', '.join(RECOMPUTE_CHOICES)}")
        knobs[knob] = value
    return knobs


def plan_from_knobs(knobs: dict, gpus: int, global_batch: int, defaults: dict | None = None):
    """A Plan from given knobs over `defaults`; dp fills the GPUs left by tp·pp·cp."""
    from planner.plan import make_plan
    fields = {**(defaults or {}), **knobs}
    tp, pp, cp = fields.get("tp", 1), fields.get("pp", 1), fields.get("cp", 1)
    if fields.get("dp") is None:
        if gpus % (tp * pp * cp):
            raise SpecError(f"tp·pp·cp ({tp}·{pp}·{cp}) must divide the GPU count ({gpus}); "
                            "pass --dp or change --gpus")
        fields["dp"] = gpus // (tp * pp * cp)
    if fields.get("sequence_parallel") and tp == 1:
        fields["sequence_parallel"] = False  # Megatron drops SP at tp = 1; so do we
    plan = make_plan(global_batch=global_batch, **fields)
    if plan.gpus != gpus:
        raise SpecError(f"plan: tp·pp·dp·cp = {plan.gpus} but the system has {gpus} GPUs "
                        "(set --gpus or change the plan)")
    return plan
