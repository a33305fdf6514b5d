"""Checkpointing: how big is a checkpoint, who writes it, how fast storage must be, and how
often to checkpoint given failures.

Pure functions; units are in the names (bytes, seconds, hours, GB/s SI = 1e9 bytes/s).

Assumptions (also listed in every `CheckpointReport`):
- A checkpoint holds the bf16 weights, the fp32 master weights and Adam m, v
  (2 + 4 + 8 = 14 B/param with the default `BytesPerParam`); gradients are not saved (they are
  recomputed by the next step). RNG states, the data-loader position and the (tiny) scheduler
  state are ignored.
- Weights are sharded over tp*pp (Megatron: one file per model-parallel rank,
  `mp_rank_XX_YYY/model_optim_rng.pt`); context-parallel ranks hold the same weights as their
  cp peers, so they add no shard. A MoE model's routed experts are sharded over ep besides
  (expert TP = tp), so each expert shard lives in dp*cp/ep replicas, not dp*cp.
- Every rank writes: Megatron's default format, torch_dist, saves "fully parallel"
  (megatron-core 0.19 training_config.py: ckpt_format "torch_dist", fully_parallel_save True;
  checkpointing.py wraps the save strategy over the dp*cp group), which spreads the replicated
  weights and the optimizer state over the data-parallel ranks, with or without the distributed
  optimizer, so the bytes are spread evenly over all ranks. (The legacy `torch` format writes
  one file per model-parallel rank from data-parallel rank 0 only: not modelled.)
- Storage bandwidth is an aggregate (file system) figure; per-node NIC limits are not modelled.
- Failures are independent and exponentially distributed (constant rate), the setting of
  Young (1974) and Daly (2006). A checkpoint blocks training for its whole write time.
"""
from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from hardware.errors import SpecError
from hardware.spec import GB, SystemSpec
from planner.model import ModelSpec
from planner.plan import BytesPerParam, Plan

SECONDS_PER_HOUR = 3600.0

# Default per-GPU MTBF. Source: Llama 3 paper (Dubey et al. 2024, sec. 3.3.4): 419 unexpected
# job interruptions in a 54-day snapshot on 16,384 H100 GPUs -> job MTBF = 54*24/419 = 3.09 h,
# i.e. 3.09 h * 16,384 = 50,677 GPU-hours per interruption (all causes, counted per GPU).
DEFAULT_GPU_MTBF_HOURS = 54 * 24 * 16_384 / 419
# Assumption: time to detect a failure, reschedule and re-initialise (NCCL, data loader) before
# the checkpoint is read. The restore read time is added on top of it.
DEFAULT_RESTART_S = 600.0


def _positive(name: str, value: float) -> float:
    if value is None or not math.isfinite(value) or value <= 0:
        raise SpecError(f"{name}: must be a positive number, got {value}")
    return float(value)


# ---- size ------------------------------------------------------------------------------------
def checkpoint_bytes_per_param(bytes_per_param: BytesPerParam = BytesPerParam(),
                               include_optimizer: bool = True) -> float:
    """Bytes saved per parameter: weights (2) + fp32 master (4) + Adam m, v (8) = 14 by default.

    Source: the mixed-precision Adam accounting of Rajbhandari et al. (ZeRO, 2020, sec. 3.1:
    2 + 2 + 12 B/param during training); the fp16/bf16 gradients are not checkpointed.
    """
    if include_optimizer:
        return bytes_per_param.weights + bytes_per_param.optimizer_total
    return bytes_per_param.weights


def checkpoint_weights_bytes(model: ModelSpec, bytes_per_param: BytesPerParam = BytesPerParam()) -> float:
    """Bytes of the low-precision weights: P * weights B/param."""
    return model.num_params * bytes_per_param.weights


def checkpoint_optimizer_bytes(model: ModelSpec, bytes_per_param: BytesPerParam = BytesPerParam()) -> float:
    """Bytes of the optimizer state: P * (fp32 master + Adam m, v) B/param."""
    return model.num_params * bytes_per_param.optimizer_total


def checkpoint_bytes(model: ModelSpec, bytes_per_param: BytesPerParam = BytesPerParam(),
                     include_optimizer: bool = True) -> float:
    """Size of one checkpoint = P * bytes/param. Depends on the model only, not on the plan,
    the data or the GPU count (sharding splits it, it does not change the total)."""
    return model.num_params * checkpoint_bytes_per_param(bytes_per_param, include_optimizer)


# ---- who writes ------------------------------------------------------------------------------
def layout_label(plan: Plan) -> str:
    """The knobs that matter for checkpointing, e.g. 'tp8 pp8 dp16 zero0'."""
    cp = f" cp{plan.cp}" if plan.cp > 1 else ""
    ep = f" ep{plan.ep}" if plan.ep > 1 else ""
    etp = f" etp{plan.etp}" if plan.ep > 1 and plan.expert_tp != plan.tp else ""
    return f"tp{plan.tp} pp{plan.pp} dp{plan.dp}{cp}{ep}{etp} zero{plan.zero_stage}"


def model_parallel_shards(plan: Plan) -> int:
    """GPUs that together hold one whole copy of the model = tp * pp (Megatron: one
    mp_rank_XX_YYY directory each), or, for a MoE model's experts, the etp * ep ranks of a
    stage that hold 1/(etp·ep) of them each (the dense weights repeated among them) where that
    group is wider: pp * max(tp, etp·ep), i.e. tp * pp * ep at expert TP = tp."""
    return plan.pp * max(plan.tp, plan.expert_tp * plan.ep)


def writer_ranks(plan: Plan, include_optimizer: bool = True) -> int:
    """Ranks that write: every rank (tp*pp*dp*cp), whatever the ZeRO stage and whether the
    optimizer state is saved: torch_dist's fully parallel save (Megatron's default, module
    docstring) spreads each model-parallel shard over its dp*cp replicas. (An audit found the
    legacy format's one-replica count used for ZeRO 0 and weights-only checkpoints.)"""
    return plan.tp * plan.pp * plan.dp * plan.cp


def checkpoint_files(plan: Plan, include_optimizer: bool = True) -> int:
    """One file per writing rank (torch_dist: a `__<rank>_0.distcp` per rank)."""
    return writer_ranks(plan, include_optimizer)


def bytes_per_writer(model: ModelSpec, plan: Plan, bytes_per_param: BytesPerParam = BytesPerParam(),
                     include_optimizer: bool = True) -> float:
    """Checkpoint bytes / writing ranks (writes assumed spread evenly over the writers)."""
    return checkpoint_bytes(model, bytes_per_param, include_optimizer) / writer_ranks(plan, include_optimizer)


# ---- write / read time -----------------------------------------------------------------------
def write_time_s(size_bytes: float, write_gb_per_s: float) -> float:
    """t = bytes / aggregate bandwidth (GB/s SI, 1e9 B/s)."""
    return size_bytes / (_positive("write-gb-per-s", write_gb_per_s) * GB)


def write_bandwidth_needed_gb_per_s(size_bytes: float, target_write_s: float) -> float:
    """Aggregate bandwidth to write `size_bytes` in `target_write_s`: B = bytes / t (GB/s SI)."""
    return size_bytes / _positive("target-write-s", target_write_s) / GB


def expert_params(model: ModelSpec) -> float:
    """The routed experts' parameters (every MoE layer's and the MTP modules'); 0 for a dense model."""
    if model.moe is None:
        return 0.0
    layers = model.layers if model.hybrid_pattern else model.moe_layers
    return layers * model.expert_params_per_layer + model.mtp_weight_modules * model.mtp_layer_expert_params


def restore_read_bytes(model: ModelSpec, plan: Plan, bytes_per_param: BytesPerParam = BytesPerParam(),
                       include_optimizer: bool = True) -> float:
    """Bytes read from storage on restart, every rank reading what it holds.

    Each of the dp*cp replicas needs the full weights, a routed expert's shard only its dp*cp/ep
    replicas. The optimizer state is read in full by every replica with plain DP (zero_stage 0:
    each replica holds it all), only once in total with a sharded optimizer (zero_stage >= 1);
    with ZeRO-3/FSDP the weights are sharded too, so the whole checkpoint is read exactly once.
    (Reading once and broadcasting over the network would cut the storage reads to one copy; not
    modelled.)
    """
    per_param = checkpoint_bytes_per_param(bytes_per_param, include_optimizer)
    experts = expert_params(model)
    dense = model.num_params - experts
    weights_b = bytes_per_param.weights
    if plan.zero_stage >= 3:
        return model.num_params * per_param
    # a routed expert's shards (1/(etp·ep) each) are held by its expert-DP ranks, world/(etp·ep·pp)
    replicas, expert_replicas = plan.dp * plan.cp, plan.tp * plan.dp * plan.cp / (plan.expert_tp * plan.ep)
    if plan.zero_stage >= 1:
        return (dense * replicas + experts * expert_replicas) * weights_b \
            + model.num_params * (per_param - weights_b)
    return (dense * replicas + experts * expert_replicas) * per_param


def restore_time_s(read_bytes: float, read_gb_per_s: float) -> float:
    """t = bytes read / aggregate read bandwidth (GB/s SI)."""
    return read_bytes / (_positive("read-gb-per-s", read_gb_per_s) * GB)


# ---- reliability -----------------------------------------------------------------------------
def job_mtbf_s(num_gpus: int, gpu_mtbf_hours: float | None = None, node_mtbf_hours: float | None = None,
               gpus_per_node: int = 8) -> float:
    """MTBF of a job that stops on any failure: independent exponential failures add their
    rates, so MTBF_job = MTBF_unit / units (units = GPUs, or nodes = ceil(GPUs / per node)).
    Without either MTBF, the default per-GPU MTBF (DEFAULT_GPU_MTBF_HOURS) is used."""
    if gpu_mtbf_hours is not None and node_mtbf_hours is not None:
        raise SpecError("mtbf: give either gpu-mtbf-hours or node-mtbf-hours, not both")
    if num_gpus < 1:
        raise SpecError(f"gpus: must be a positive integer, got {num_gpus}")
    if node_mtbf_hours is not None:
        nodes = math.ceil(num_gpus / gpus_per_node)
        return _positive("node-mtbf-hours", node_mtbf_hours) * SECONDS_PER_HOUR / nodes
    per_gpu = DEFAULT_GPU_MTBF_HOURS if gpu_mtbf_hours is None else gpu_mtbf_hours
    return _positive("gpu-mtbf-hours", per_gpu) * SECONDS_PER_HOUR / num_gpus


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974), "A first order approximation to the optimum checkpoint interval":
    tau = sqrt(2 C M), compute time between checkpoints."""
    return math.sqrt(2.0 * _positive("checkpoint time", checkpoint_s) * _positive("mtbf", mtbf_s))


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart
    dumps", FGCS 22(3): tau = sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C for C < 2M, else M."""
    c, m = _positive("checkpoint time", checkpoint_s), _positive("mtbf", mtbf_s)
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def goodput_fraction(interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Useful time / wall time under exponential failures, Daly (2006)'s complete model: the
    expected wall time of T_s of work in segments of tau, each followed by a checkpoint C, with a
    restart R after each failure (failures may strike during C and R too) is
    T_w = M e^(R/M) (e^((tau+C)/M) - 1) T_s / tau, so goodput = tau / (M e^(R/M) (e^((tau+C)/M) - 1)).
    Its optimum is Daly's interval (daly_interval_s). The first-order form
    1 - C/tau - ((tau+C)/2 + R)/M, used before 2026-11-28, peaks at Young's interval and was 14 %
    low where tau and R are not small against M (4,096 A100 at a 500-hour node MTBF)."""
    tau = _positive("interval", interval_s)
    m = _positive("mtbf", mtbf_s)
    if checkpoint_s < 0 or restart_s < 0:
        raise SpecError("checkpoint time and restart time must be >= 0")
    x = (tau + checkpoint_s) / m
    if x > 700 or restart_s / m > 700:  # e^x beyond a float: no progress at all
        return 0.0
    return tau / m * math.exp(-restart_s / m) / math.expm1(x)


def duration_text(seconds: float) -> str:
    """A duration in the unit that reads best: '0.9 s', '12.5 min', '2.91 h', '3.2 days'."""
    if not math.isfinite(seconds):
        return "inf"
    if seconds < 0.1:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 86400:.1f} days"


# ---- report ----------------------------------------------------------------------------------
class CheckpointReport(BaseModel):
    """Everything `planner checkpoint` prints, for one (model, system, plan, storage, MTBF)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    system: str
    num_gpus: int
    gpus_per_node: int
    plan: str
    zero_stage: int
    num_params: int
    include_optimizer: bool
    checkpoint_bytes_per_param: float
    weights_bytes: float
    optimizer_bytes: float
    checkpoint_bytes: float
    model_copy_gpus: int
    model_copy_nodes: int
    writer_ranks: int
    files: int
    bytes_per_writer: float
    write_gb_per_s: float
    write_s: float
    target_write_s: float
    write_gb_per_s_needed: float
    read_gb_per_s: float
    read_bytes: float
    restore_s: float
    gpu_mtbf_hours: float | None
    node_mtbf_hours: float | None
    job_mtbf_s: float
    restart_s: float
    recovery_s: float
    young_interval_s: float
    daly_interval_s: float
    goodput_young: float
    goodput_daly: float
    assumptions: list[str]
    notes: list[str] = []  # what makes these numbers questionable for this setup
    params_note: str = ""  # what the parameter count holds beyond the main model (MTP modules)


def checkpoint_report(model: ModelSpec, system: SystemSpec, plan: Plan, write_gb_per_s: float,
                      read_gb_per_s: float, target_write_s: float = 60.0,
                      gpu_mtbf_hours: float | None = None, node_mtbf_hours: float | None = None,
                      restart_s: float = DEFAULT_RESTART_S,
                      bytes_per_param: BytesPerParam = BytesPerParam(),
                      include_optimizer: bool = True, notes: list[str] | None = None) -> CheckpointReport:
    """Size, writers, write/restore time, job MTBF and the Young/Daly intervals for one setup.
    The checkpoint cost C is the blocking write time; the recovery after a failure is the
    restart time R plus the restore read time."""
    if plan.gpus != system.num_gpus:
        raise SpecError(f"plan: tp*pp*dp*cp = {plan.tp}*{plan.pp}*{plan.dp}*{plan.cp} = {plan.gpus} "
                        f"must equal the number of GPUs ({system.num_gpus})")
    if restart_s is None or not math.isfinite(restart_s) or restart_s < 0:
        raise SpecError(f"restart-s: must be >= 0, got {restart_s}")
    _positive("write-gb-per-s", write_gb_per_s)
    _positive("read-gb-per-s", read_gb_per_s)
    _positive("target-write-s", target_write_s)
    if gpu_mtbf_hours is None and node_mtbf_hours is None:
        gpu_mtbf_hours = DEFAULT_GPU_MTBF_HOURS

    size = checkpoint_bytes(model, bytes_per_param, include_optimizer)
    write_s = write_time_s(size, write_gb_per_s)
    read_bytes = restore_read_bytes(model, plan, bytes_per_param, include_optimizer)
    restore_s = restore_time_s(read_bytes, read_gb_per_s)
    mtbf = job_mtbf_s(system.num_gpus, gpu_mtbf_hours, node_mtbf_hours, system.gpus_per_node)
    recovery = restart_s + restore_s
    young = young_interval_s(write_s, mtbf)
    daly = daly_interval_s(write_s, mtbf)
    copy_gpus = model_parallel_shards(plan)
    notes = list(notes or [])
    if write_s >= young:
        notes.append(f"checkpointing cannot keep up: one write ({duration_text(write_s)}) takes longer than the "
                     f"interval that failures allow ({duration_text(young)}, Young); faster storage, fewer bytes or "
                     "fewer failures are needed for the job to make progress")
    if recovery >= mtbf:
        notes.append(f"the job fails more often than it recovers: recovery ({duration_text(recovery)}) is longer "
                     f"than the job MTBF ({duration_text(mtbf)}), so it makes little progress; more reliable parts, "
                     "a faster restart or fewer GPUs are needed")
    return CheckpointReport(
        model=model.name, system=system.name, num_gpus=system.num_gpus,
        gpus_per_node=system.gpus_per_node, plan=layout_label(plan), zero_stage=plan.zero_stage,
        num_params=model.num_params, include_optimizer=include_optimizer,
        checkpoint_bytes_per_param=checkpoint_bytes_per_param(bytes_per_param, include_optimizer),
        weights_bytes=checkpoint_weights_bytes(model, bytes_per_param),
        optimizer_bytes=checkpoint_optimizer_bytes(model, bytes_per_param) if include_optimizer else 0.0,
        checkpoint_bytes=size, model_copy_gpus=copy_gpus,
        model_copy_nodes=math.ceil(copy_gpus / system.gpus_per_node),
        writer_ranks=writer_ranks(plan, include_optimizer), files=checkpoint_files(plan, include_optimizer),
        bytes_per_writer=bytes_per_writer(model, plan, bytes_per_param, include_optimizer),
        write_gb_per_s=write_gb_per_s, write_s=write_s, target_write_s=target_write_s,
        write_gb_per_s_needed=write_bandwidth_needed_gb_per_s(size, target_write_s),
        read_gb_per_s=read_gb_per_s, read_bytes=read_bytes, restore_s=restore_s,
        gpu_mtbf_hours=gpu_mtbf_hours, node_mtbf_hours=node_mtbf_hours, job_mtbf_s=mtbf,
        restart_s=restart_s, recovery_s=recovery, young_interval_s=young, daly_interval_s=daly,
        goodput_young=goodput_fraction(young, write_s, mtbf, recovery),
        goodput_daly=goodput_fraction(daly, write_s, mtbf, recovery),
        notes=notes,
        params_note=(f"model, incl. {model.mtp_weight_modules} MTP module{'s' if model.mtp_weight_modules > 1 else ''} "
                     f"({model.mtp_params / 1e9:,.1f} B)" if model.mtp_layers else ""),
        assumptions=[
            ("checkpoint = weights + fp32 master + Adam m,v" if include_optimizer
             else "checkpoint = weights only (--weights-only)") + "; gradients not saved",
            "torch_dist fully parallel save: every rank writes an even share; bandwidths are aggregate (GB/s = 1e9 B/s)",
            "checkpoint blocks training for its write time (no asynchronous save)",
            "restore: every rank reads what it holds from storage (no read-once-and-broadcast)",
            "failures independent, exponential; job MTBF = unit MTBF / units",
            "goodput by Daly's complete model (exponential failures, also during write and restart); "
            "recovery = restart + restore",
        ],
    )


__all__ = [
    "DEFAULT_GPU_MTBF_HOURS", "DEFAULT_RESTART_S", "CheckpointReport", "checkpoint_bytes_per_param",
    "checkpoint_weights_bytes", "checkpoint_optimizer_bytes", "checkpoint_bytes", "expert_params", "layout_label",
    "model_parallel_shards", "writer_ranks", "checkpoint_files", "bytes_per_writer", "write_time_s",
    "write_bandwidth_needed_gb_per_s", "restore_read_bytes", "restore_time_s", "job_mtbf_s",
    "young_interval_s", "daly_interval_s", "goodput_fraction", "checkpoint_report", "duration_text",
]
