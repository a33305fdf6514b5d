"""Published measured runs -> (model, system, plan, job, measured step time) cases.

Reads the three reference files shipped in planner/data/reference/ (or any file in one of their
two schemas): measured_runs.yaml and bridge_runs.yaml share one schema; fsdp_moe_runs.yaml has its
own (described in its header). Where a record leaves a knob unstated we fill it with the documented
default of the framework and era it came from and list the assumption beside the row. A record is
skipped only when it lacks what a prediction needs (a layout, a time, the model's dimensions, a GPU
we have a preset for) or when the model cannot yet express it (uneven pipeline stages), and the
reason is kept per record. A malformed field is a one-line SpecError naming the record and field.
"""
from __future__ import annotations

import functools
import hashlib
import pickle
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import get_args

import yaml
from pydantic import ValidationError

from hardware import load_system
from hardware.errors import (VISIBLE_LINE_PATTERN, SpecError, closest_name, digit_limit_error, finite_number, one_line,
                             safe_load_packaged)
from hardware.spec import SystemSpec
from planner.analytical.flops import megatron_logged_flops_per_token, model_flops_per_token, narayanan_eq3_flops
from planner.model import Activation, ModelSpec, MoESpec
from planner.pipeline_layout import balanced_layout, even_layout, layout_from_flags, layout_from_string
from planner.plan import BytesPerParam, JobSpec, Plan, applicable_recompute_modules, compress_runs
from planner.bridge_recipes import launch_knobs, recipe_knobs, release_number
from planner.reference_dense import bridge_dense_recipe
from planner.reference_errata import ERRATA, corrected_record
from planner.reference_launch_fields import completed_record
from planner.reference_moe import bridge_recipe_job_updates, bridge_recipe_model, nvidia_moe_settings

REFERENCE_DIR = Path(__file__).resolve().parent / "data" / "reference"
REFERENCE_FILES = ("measured_runs.yaml", "bridge_runs.yaml", "fsdp_moe_runs.yaml")
DEFAULT_REFERENCES = tuple(REFERENCE_DIR / f for f in REFERENCE_FILES)
# The `schema_version` the loader was written for (the three packaged files declare 1); a file
# without one is read as it. A later version is read by the same field names (a record the reader
# cannot use is then skipped or refused by field, as any other), so newer data is not shut out whole.
SCHEMA_VERSION = 1
# The measurements a record's step time comes from (either schema): each one a record states must
# be a finite number > 0. A negative, zero or non-finite one is a malformed record, not a missing one.
MEASUREMENT_FIELDS = ("measured.iteration_time_s", "measured.step_time_s", "derived.iteration_time_s",
                      "measured.tokens_per_sec", "measured.tokens_per_sec_per_gpu", "measured.tflops_per_gpu",
                      "measured.model_tflops_per_gpu")
# Numbers a record may print beside them, which the loader reports but does not use: checked
# alike, so that a table's typo is named rather than carried along (finite numbers >= 0; counts).
PRINTED_NUMBERS = ("measured.aggregate_pflops", "measured.alt_model_tflops_per_gpu",
                   "measured.alt_tokens_per_sec_per_gpu", "measured.est_training_days_300B_tokens", "measured.hfu",
                   "measured.memory_gib", "measured.mfu", "measured.pct_of_peak", "measured.samples_per_sec")
PRINTED_COUNTS = ("parallel.grad_accum", "parallel.dp_printed", "parallel.num_microbatches",
                  "parallel.model_parallel_size", "parallel.expert_dp", "parallel.expert_fsdp_degree",
                  "parallel.hsdp_replicas", "parallel.shard_group")

# Frameworks whose runs the per-accelerator efficiency parameters are fitted on (bench/calibrate.py):
# the Megatron-Core stack, whose kernels (Transformer Engine) and overlaps the model describes.
# Runs of other stacks (torchtitan, llm-foundry, DeepSpeed) are predicted and reported, not fitted.
FITTED_FRAMEWORKS = ("Megatron/NeMo", "Megatron-Bridge", "Megatron-Core")


def fits_hardware(framework: str, model) -> bool:
    """Whether a run fits the per-accelerator efficiencies (GEMM ceilings, HBM efficiency,
    per-layer overhead): dense Megatron runs only. MoE runs are predicted and reported, but their
    time also depends on mechanisms the model knows to be incomplete (the expert all-to-all is
    charged fully exposed; Megatron overlaps it), and fitting hardware efficiencies to them moved
    the GB200/B200 GEMM ceilings far from what their dense runs show. The MoE mechanisms' own
    named parameters are fitted separately (bench/fsdp_moe_eval.py)."""
    return framework in FITTED_FRAMEWORKS and model.moe is None

# Model family of a record, by its model name (first match wins); leave-one-family-out uses it.
FAMILIES = (
    ("DeepSeek-V3", r"deepseek"),
    ("Qwen3", r"qwen3"),
    ("Llama-4", r"llama[ _-]?4"),
    ("Llama-3", r"llama[ _-]?3"),
    ("Llama-2", r"llama[ _-]?2"),
    ("Nemotron-4", r"nemotron"),
    ("Grok-1", r"grok"),
    ("Mixtral", r"mixtral"),
    ("MPT", r"mpt"),
    ("GPT-OSS", r"gpt[ _-]?oss"),  # OpenAI's MoE, not the GPT-3-style dense family below
    ("GPT", r"gpt"),  # GPT-3 175B and the GPT-style weak-scaling models of Megatron and DeepSpeed
)

# GPU name in a record -> system preset (first match, case-insensitive), with the assumption made.
GPU_PRESETS = (
    # the DGX-2's V100 (SXM3 32 GB); other V100 boards (DGX-1's SXM2 hybrid cube-mesh, PCIe): skipped
    (r"v100.*(sxm3|dgx-2)", "dgx2-v100", ""),
    (r"v100", None, ""),
    (r"grand teton|hbm2e 9[56]", "h100-grand-teton", ""),
    (r"gb300", "gb300-nvl72", ""),
    (r"gb200", "gb200-nvl72", ""),
    # \b keeps "NVIDIA B200" a B200 and "GB200" not one
    (r"\bb300", "b300", ""),
    (r"\bb200 \(power-limited\)", "b200", "B200 at its datasheet peak (the run was power-limited)"),
    (r"\bb200", "b200", ""),
    (r"blackwell", "b200", "Blackwell SKU not stated: B200 assumed"),
    # PCIe / NVL boards have other peaks, power and links than the SXM parts: no preset, skipped
    (r"(h100|a100).*\b(pcie|nvl)\b", None, ""),
    (r"gh200", "gh200", ""),
    (r"h200", "h200", ""),
    (r"h800", "h800", ""),
    (r"h100", "h100-sxm", ""),
    (r"a800", "a800-80g", ""),
    (r"a100.*40", "a100-40g", ""),
    (r"a100", "a100-80g", ""),
)


@dataclass
class RefCase:
    id: str
    source: str
    model: ModelSpec
    system: SystemSpec
    plan: Plan
    job: JobSpec
    measured_step_s: float
    how_measured: str
    assumptions: list[str] = field(default_factory=list)
    fit: bool = True  # fitted by bench/calibrate.py (FITTED_FRAMEWORKS, not ZeRO-3)
    framework: str = "Megatron/NeMo"
    family: str = "other"

    @property
    def kind(self) -> str:
        return "MoE" if self.model.moe else "dense"


@dataclass
class Skipped:
    id: str
    reason: str


class _Record:
    """Typed access to one record's fields, with one-line errors naming the record and field."""

    def __init__(self, rec: dict, where: str = ""):
        """`where`: the file and position of the record, named when it has no usable id."""
        if not isinstance(rec, dict):
            raise SpecError(f"reference{where}: a record is not a mapping with an id: {str(rec)[:60]!r}")
        rid = rec.get("id")
        if not isinstance(rid, str) or not rid.strip():
            raise SpecError(f"reference{where}: id: expected a non-empty string (every record needs its own id), "
                            f"got {rid!r}")
        self.rec, self.id = rec, rid

    def get(self, path: str, default=None):
        node, walked = self.rec, []
        for key in path.split("."):
            if not isinstance(node, dict):  # name the field that should have been the mapping
                raise SpecError(f"reference {self.id}: {'.'.join(walked)}: expected a mapping (holding {key!r}), "
                                f"got {type(node).__name__} {str(node)[:40]!r}")
            node = node.get(key)
            walked.append(key)
            if node is None:
                return default
        return node

    def int(self, path: str, default: int | None = None, minimum: int = 1) -> int | None:
        value = self.get(path)
        if value is None:
            return default
        # (finite first: int() of an infinity is an OverflowError, of a NaN a ValueError; beyond
        # MAX_RECORD_INTEGER no count of a training run is meant, and products of such overflow)
        if isinstance(value, bool) or not finite_number(value) or value != int(value) \
                or not minimum <= value <= MAX_RECORD_INTEGER:
            raise SpecError(f"reference {self.id}: {path}: expected an integer from {minimum} to "
                            f"{MAX_RECORD_INTEGER:,}, got {value!r}")
        return int(value)

    def flag(self, path: str, notes: tuple[str, ...] = ()) -> bool | str | None:
        """A yes/no field: true, false, absent (None), or a note containing one of `notes` (the
        records' "likely (NeMo default)"), returned as written. Anything else ("yes", 1) is
        refused by name: read as text it would silently mean whatever the caller's test makes of it."""
        value = self.get(path)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and any(n in value for n in notes):
            return value
        allowed = "true, false" + "".join(f", a note containing {n!r}" for n in notes)
        raise SpecError(f"reference {self.id}: {path}: expected {allowed}; got {value!r}")

    def float(self, path: str, zero_ok: bool = False) -> float | None:
        value = self.get(path)
        if value is None:
            return None
        if not (finite_number(value) and (value >= 0 if zero_ok else value > 0)):
            raise SpecError(f"reference {self.id}: {path}: expected a finite number {'>=' if zero_ok else '>'} 0, "
                            f"got {value!r}")
        return float(value)


MAX_RECORD_INTEGER = 1 << 40


# The layout fields a record may give (the three packaged files' union, and fp8_param_gather, which
# bench/heldout_nemo.py states): another name is a misspelling that would silently leave its knob at
# the loader's default (micro_batch_size: mb 1)
PARALLEL_FIELDS = ("activation_cpu_offload", "async_tp", "comm_overlap", "compile", "cp", "cpu_offload", "dispatcher",
                   "distributed_optimizer", "dp", "dp_printed", "ep", "etp", "expert_dp", "expert_fsdp_degree",
                   "float8", "float8_recipe", "fp8_param_gather", "framework", "fsdp", "fsdp_or_zero3_degree",
                   "global_batch", "grad_accum", "hsdp_replicas", "lowp_recipe", "microbatch", "model_parallel_size",
                   "mp_mode", "mxfp8", "num_microbatches", "pp", "pp_layout", "pp_microbatches", "pp_schedule",
                   "precision", "recompute", "sequence_parallel", "shard_group", "sharding", "tp", "tp_pp_split_note",
                   "vpp")


# The fields of a record's other blocks (the three packaged files' union and what the loader reads
# beyond it), checked like PARALLEL_FIELDS: `fnn:` for `ffn:` would silently leave ffn at 4 x hidden.
RECORD_FIELDS = {
    "": ("derived", "id", "measured", "model", "notes", "parallel", "precision", "source", "source_group", "system",
         "tags", "trust"),
    "model": ("activation", "activation_clamp", "arch", "attention", "biases", "config_ref", "dims_source", "ffn",
              "heads", "hidden", "hybrid_pattern", "kv_channels", "layers", "mamba", "moe", "mtp_layers",
              "mtp_shared_weights", "name", "params_b", "query_groups", "rope_scaling", "seq", "tied_embeddings",
              "vocab"),
    "model.moe": ("dense_layers_first", "expert_ffn", "experts", "first_k_dense", "latent_size", "layer_step",
                  "moe_ffn", "moe_layers", "num_experts", "shared_expert_ffn", "shared_experts", "topk"),
    "system": ("gpu", "gpu_mem_gb", "gpus", "gpus_per_node", "inter_node", "intra_node", "nvlink_domain",
               "peak_dtype", "peak_tflops_per_gpu"),
    "measured": ("aggregate_pflops", "alt_model_tflops_per_gpu", "alt_tokens_per_sec_per_gpu",
                 "est_training_days_300B_tokens", "flops_convention", "hfu", "iteration_time_s", "memory_gib", "mfu",
                 "model_tflops_per_gpu", "pct_of_peak", "samples_per_sec", "step_time_s", "tflops_per_gpu",
                 "tokens_per_sec", "tokens_per_sec_per_gpu"),
    "parallel": PARALLEL_FIELDS,
}


def _unknown_field(r: _Record, block: str, key, fields: tuple) -> SpecError:
    home = [b for b, names in RECORD_FIELDS.items() if b != block and b and str(key) in names]
    near = closest_name(str(key), fields)
    hint = (f"; it belongs under {home[0]}:" if home else f"; did you mean {near}?" if near
            else f"; the fields: {', '.join(fields)}")
    kind = "layout field" if block == "parallel" else "field"
    return SpecError(f"reference {r.id}: {block + '.' if block else ''}{key}: unknown {kind}{hint}")


# How far a record's step time and its throughput may disagree (the packaged files' 156 records
# that give both agree within it: rounding and warm-up steps)
MEASUREMENT_AGREEMENT = 0.10


def _check_measurements_agree(r: _Record, step_field: str, step_s: float, tokens: int, gpus: int) -> None:
    """A step time beside a throughput that implies another step: one of the two is mistyped."""
    for rate_field, per in (("measured.tokens_per_sec_per_gpu", gpus), ("measured.tokens_per_sec", 1)):
        rate = r.float(rate_field)
        if rate:
            implied = tokens / (rate * per)
            if abs(implied / step_s - 1.0) > MEASUREMENT_AGREEMENT:
                raise SpecError(f"reference {r.id}: {step_field} ({step_s:g} s) and {rate_field} ({rate:g}, a "
                                f"{implied:.4g} s step for the global batch) disagree by more than "
                                f"{MEASUREMENT_AGREEMENT:.0%}; keep the one the source printed")


def _check_throughputs_agree(r: _Record, gpus: int) -> None:
    """Tokens/s per GPU beside tokens/s of the whole job: they must say the same (one of the two
    mistyped is otherwise read, the other ignored)."""
    per_gpu, total = r.float("measured.tokens_per_sec_per_gpu"), r.float("measured.tokens_per_sec")
    if per_gpu and total and abs(per_gpu * gpus / total - 1.0) > MEASUREMENT_AGREEMENT:
        raise SpecError(f"reference {r.id}: measured.tokens_per_sec_per_gpu ({per_gpu:g}, {per_gpu * gpus:g} over "
                        f"{gpus} GPUs) and measured.tokens_per_sec ({total:g}) disagree by more than "
                        f"{MEASUREMENT_AGREEMENT:.0%}; keep the one the source printed")


# How far a record's stated GPU memory (GB or GiB) and peak may be from its preset's: beyond,
# the record's GPU is another board than the one its name reads as
SYSTEM_FIELD_TOLERANCE = {"gpu_mem_gb": 0.05, "peak_tflops_per_gpu": 0.05}  # (H100 NVL's 94 GB is not 80)


def _check_system_fields(r: _Record, system) -> None:
    """The system fields a record may state beside `system.gpu`, against the preset its GPU name
    reads as (the planner costs that preset: a record saying otherwise is refused, not costed on
    another GPU in silence): memory, dense peak (of `peak_dtype`, bf16 where unstated), GPUs per
    NVLink domain and per node."""
    acc, domain = system.accelerator, system.nvlink_domain_gpus
    where = f"reference {r.id}: system"
    mem = r.float("system.gpu_mem_gb")
    if mem is not None and not any(abs(mem / (acc.hbm_capacity_bytes / unit) - 1) <= SYSTEM_FIELD_TOLERANCE["gpu_mem_gb"]
                                   for unit in (1e9, 2**30)):
        raise SpecError(f"{where}.gpu_mem_gb: {mem:g} but system.gpu {r.get('system.gpu')!r} reads as {acc.name} "
                        f"({acc.hbm_capacity_bytes / 2**30:.0f} GiB); name the board in system.gpu (e.g. 'A100 40GB')")
    peak = r.float("system.peak_tflops_per_gpu")
    if peak is not None:
        words = re.findall(r"[a-z0-9]+", str(r.get("system.peak_dtype") or "bf16").lower())  # "fp16/bf16 dense"
        dtype = next((w for w in words if w in acc.peak_flops), "bf16")
        sparse = "sparse" in words or "sparsity" in words  # 2:4 structured sparsity doubles the datasheet peak
        ref = acc.peak_flops.get(dtype)
        ref = ref * 2 if ref is not None and sparse else ref
        if ref is not None and abs(peak * 1e12 / ref - 1) > SYSTEM_FIELD_TOLERANCE["peak_tflops_per_gpu"]:
            raise SpecError(f"{where}.peak_tflops_per_gpu: {peak:g} but {acc.name}'s {'sparse' if sparse else 'dense'} "
                            f"{dtype} peak is {ref / 1e12:g} TFLOP/s; name the board in system.gpu, or give its own "
                            "system file")
    nvl = r.int("system.nvlink_domain")
    if nvl is not None and nvl != domain:
        raise SpecError(f"{where}.nvlink_domain: {nvl} but the {system.name} preset has {domain} GPUs per NVLink "
                        "domain; name the system in system.gpu (e.g. GB200 NVL72), or give its own system file")
    node = r.int("system.gpus_per_node")
    if node is not None and node != system.gpus_per_node:
        raise SpecError(f"{where}.gpus_per_node: {node} but the {system.name} preset has {system.gpus_per_node}; "
                        "other nodes need their own system file")


def _measured_step(r: _Record) -> tuple[float | None, str | None]:
    """A record's measured step time and the field it is in: iteration_time_s, or step_time_s (the
    FSDP schema's name, also read here). Both given: they must agree (MEASUREMENT_AGREEMENT)."""
    iteration, step = r.float("measured.iteration_time_s"), r.float("measured.step_time_s")
    if iteration is not None and step is not None and abs(step / iteration - 1.0) > MEASUREMENT_AGREEMENT:
        raise SpecError(f"reference {r.id}: measured.iteration_time_s ({iteration:g} s) and measured.step_time_s "
                        f"({step:g} s) disagree by more than {MEASUREMENT_AGREEMENT:.0%}; give the one the "
                        "source printed")
    if iteration is not None:
        return iteration, "measured.iteration_time_s"
    return (step, "measured.step_time_s") if step is not None else (None, None)


def _check_below_peak(r: _Record, how: str, step_s: float, step_flops: float, system) -> None:
    """A measurement no GPU of the record's kind can reach: its model FLOPs per GPU per second
    above the accelerator's highest datasheet peak (a TFLOP/s or tokens/s typed 10x too high), or a
    step time that is not a positive number at all (a throughput of 1e300). One far too slow is
    compared and flagged (validate: "check the units of ...")."""
    check = "check the measurement's units and digits"
    if not 0.0 < step_s < float("inf"):
        raise SpecError(f"reference {r.id}: the measured {how} implies a step time of {step_s:g} s; {check}")
    rate = step_flops / (step_s * system.num_gpus)
    peak = max(system.accelerator.peak_flops.values())
    if rate > peak:
        raise SpecError(f"reference {r.id}: the measured {how} implies {rate / 1e12:,.0f} model TFLOP/s per GPU, "
                        f"above the {system.accelerator.name} peak ({peak / 1e12:,.0f}); {check}")


def _check_vpp(rid: str, vpp: int, pp: int, layers: int) -> None:
    """parallel.vpp: every virtual stage holds a layer, or is the embedding's or the loss's own
    (Megatron's --account-for-embedding/loss-in-pipeline-split: DGX Cloud's 30-layer 405B proxy
    runs pp 4 vpp 8 as layers[0,1x30,0])."""
    most = (layers + 2) // pp
    if not 1 <= vpp <= most:
        raise SpecError(f"reference {rid}: parallel.vpp: must be an integer from 1 to (layers + 2)/pp "
                        f"(({layers} + 2)/{pp} = {most}: each virtual stage a layer, the embedding or the loss), "
                        f"got {vpp}")


def _check_record(r: _Record) -> None:
    """One-line SpecError for a field a record states wrongly, whether or not the record is then
    compared or skipped: its measurements (MEASUREMENT_FIELDS), activation, recompute and the
    names of its layout fields."""
    for path in MEASUREMENT_FIELDS:
        r.float(path)
    for path in PRINTED_NUMBERS:  # a table may print 0 where it rounds (MPT-13B at 32K: 0 samples/s)
        r.float(path, zero_ok=True)
    for path in PRINTED_COUNTS:
        r.int(path)
    _activation(r)
    _recompute(r.get("parallel.recompute"), [], "none", "", r.id)
    if not re.match(VISIBLE_LINE_PATTERN, r.id):
        raise SpecError(f"reference {r.id!r}: id: must be one line of visible text (it names the row in tables)")
    for block, fields in RECORD_FIELDS.items():
        data = r.rec if not block else r.get(block)
        for key in data if isinstance(data, dict) else ():
            if key not in fields:
                raise _unknown_field(r, block, key, fields)


def family_of(model_name: str) -> str:
    low = model_name.lower()
    return next((fam for fam, pat in FAMILIES if re.search(pat, low)), "other")


def system_preset_for(gpu: str) -> tuple[str | None, str]:
    low = gpu.lower()
    for pat, preset, assumption in GPU_PRESETS:
        if re.search(pat, low):
            return preset, assumption
    return None, ""


# Every Megatron-Bridge DeepSeek-V3 recipe keeps Adam's moments in bf16 on the precision-aware
# optimizer (use_precision_aware_optimizer, exp_avg_dtype = exp_avg_sq_dtype = bfloat16):
# recipes/deepseek/deepseek_v3.py at v0.1.0rc3 .. v0.5.0 (25.09-26.06), perf_recipes/deepseek/
# common.py _enable_deepseek_precision_aware_optimizer at v0.6.0 (26.08).
BRIDGE_DSV3_BF16_MOMENTS = ("Megatron-Bridge recipes/deepseek/deepseek_v3.py v0.1.0rc3-v0.5.0, "
                            "perf_recipes/deepseek/common.py v0.6.0: precision-aware optimizer")

# Precision as published -> ComputeDtype. Order matters: "FP8-MX" before "FP8", "FP8-CS" before "FP8".
# Block-wise FP8: DeepSeek-V3 §3.3's 1x128 / 128x128 tiles, TE's Float8BlockScaling.
_PRECISIONS = (("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("fp8-mx", "mxfp8"), ("fp8-cs", "fp8-cs"),
               ("blockwise", "fp8-block"), ("block-wise", "fp8-block"), ("fp8-block", "fp8-block"),
               ("fp8", "fp8"), ("fp16", "fp16"), ("bf16", "bf16"))


# A Megatron-Bridge table's plain "FP8" from release 25.11 on is per-tensor current scaling: the
# performance scripts' --compute_dtype offers bf16, fp8_cs, fp8_mx, fp8_sc (and nvfp4 from 26.02),
# no delayed scaling (scripts/performance/argument_parser.py from 4830138a4, 2025-11-12, to
# 067f987df), and the 25.11 table names the same runs FP8-CS. The 25.09 scripts took
# --compute_dtype fp8 with --fp8_recipe ds|cs|mx|ss, delayed (ds) by default (8cec56d38).
BRIDGE_ONLY_CURRENT_SCALING_FROM = (25, 11)
BRIDGE_FP8_IS_CURRENT_SCALING = ("fp8-cs: Megatron-Bridge's performance scripts from 25.11 on run FP8 only as "
                                 "current scaling (--compute_dtype bf16/fp8_cs/fp8_mx/fp8_sc/nvfp4)")


def bridge_release(rid: str) -> tuple[int, ...]:
    """The release of a Megatron-Bridge record id (bridge_<release>_..., e.g. (26, 2, 1)); () if none."""
    match = re.match(r"bridge_(\d+(?:\.\d+)*)_", rid)
    return release_number(match.group(1)) if match else ()


def parse_precision(text: str, rid: str, path: str = "precision") -> tuple[str, str]:
    """Case-insensitive precision name -> (dtype, assumption or '')."""
    low = text.strip().lower()
    for token, dtype in _PRECISIONS:
        if token in low:
            first = low.split()[0] if low.split() else low
            if token not in first:  # e.g. "not stated in table (FP8 implied by footnote)"
                return dtype, f"{dtype} (source: {text!r})"
            return dtype, ""
    if low in ("na", "n/a", "none", "not stated", ""):
        return "bf16", f"bf16 (precision not stated: {text!r})"
    raise SpecError(f"reference {rid}: {path}: unknown precision {text!r}; allowed: BF16, FP16, FP8, "
                    "FP8-CS, FP8 blockwise, FP8-MX/MXFP8, NVFP4, na (case-insensitive)")


# The MoE fields' names in each schema: a record of one schema that spells a field the other's way
# would have it ignored (the defaults stand in silently), so it is refused, naming the spelling read.
MOE_FIELD_OF_OTHER_SCHEMA = {"num_experts": "experts", "moe_ffn": "expert_ffn", "first_k_dense": "dense_layers_first"}


def _moe(r: _Record, fsdp_schema: bool) -> dict | None:
    moe = r.get("model.moe")
    if not moe:
        return None
    for megatron_name, fsdp_name in MOE_FIELD_OF_OTHER_SCHEMA.items():
        wrong, right = (megatron_name, fsdp_name) if fsdp_schema else (fsdp_name, megatron_name)
        if r.get(f"model.moe.{wrong}") is not None:
            raise SpecError(f"reference {r.id}: model.moe.{wrong}: this file's schema names it "
                            f"model.moe.{right}; give it once, as {right}")
    if fsdp_schema:
        experts, topk, ffn = r.int("model.moe.experts"), r.int("model.moe.topk"), r.int("model.moe.expert_ffn")
        first_dense = r.int("model.moe.dense_layers_first", 0, minimum=0)
    else:
        experts, topk, ffn = r.int("model.moe.num_experts"), r.int("model.moe.topk"), r.int("model.moe.moe_ffn")
        first_dense = r.int("model.moe.first_k_dense", 0, minimum=0)
    keys = ("experts", "topk", "expert_ffn") if fsdp_schema else ("num_experts", "topk", "moe_ffn")
    if experts is None or topk is None or ffn is None:  # an expert sized like the dense MLP is a guess
        missing = [k for k, v in zip(keys, (experts, topk, ffn)) if v is None]
        raise SpecError(f"reference {r.id}: model.moe: needs {', '.join(f'model.moe.{k}' for k in keys)} "
                        f"(missing: {', '.join(missing)})")
    shared = r.int("model.moe.shared_experts", 0, minimum=0)
    out = {"num_experts": experts, "top_k": topk, "expert_ffn": ffn}
    if re.search(r"deepseek[-_ ]?v3", str(r.get("model.name") or "").lower()) and experts == 256:
        # DeepSeek-V3's own config.json (n_group 8, topk_group 4: node-limited routing, §3.2.2),
        # which Megatron-Bridge's DeepSeek bridge maps to moe_router_num_groups / group_topk and
        # the ModelZoo's DeepSeek-V3.yaml sets; the records name the model only
        out.update(router_groups=8, router_group_topk=4)
    # Fields helper "models" adds to MoESpec; filled only where they exist.
    shared_ffn = r.int("model.moe.shared_expert_ffn") or ((ffn * shared) if shared and ffn else None)
    optional = {"shared_experts": shared, "shared_expert_ffn": shared_ffn, "first_dense_layers": first_dense,
                "latent_size": r.int("model.moe.latent_size")}  # LatentMoE (Nemotron 3 Super)
    out.update({k: v for k, v in optional.items() if k in MoESpec.model_fields and v})
    step = _moe_layer_step(r, first_dense)
    if step > 1:
        out["layer_step"] = step
    return out


def _moe_layer_step(r: _Record, first_dense: int) -> int:
    """Every how many layers after the leading dense ones a MoE layer comes: model.moe.layer_step
    as given, else from a MoE layer count below the layers after the leading dense ones (Llama 4
    Maverick: 24 of 48, every second); a count that no step gives is refused, not read as all."""
    step = r.int("model.moe.layer_step", 1, minimum=1)
    count, layers = r.int("model.moe.moe_layers", minimum=1), r.int("model.layers")
    if count is None or layers is None:
        return step
    after = layers - first_dense
    implied = after // count if count and after % count == 0 else None
    if implied is None or (step != 1 and step != implied):
        raise SpecError(f"reference {r.id}: model.moe.moe_layers: {count} MoE layers of the {after} after the "
                        f"leading dense ones is no interleave (allowed: {after} divided by a whole step"
                        + (f", here {after // step} for layer_step {step}" if step != 1 else "") + ")")
    return implied


def _mla(r: _Record) -> dict | None:
    # the attention field (bridge: "MLA (q_lora 1536, kv_lora 512)"), else the config reference
    # (ModelZoo / GB200 guide: "(MLA q_lora_rank 1536, kv_lora_rank 512, ...)")
    attention = r.get("model.attention")
    if attention is not None and not isinstance(attention, str):
        raise SpecError(f"reference {r.id}: model.attention: expected text such as 'MLA (q_lora 1536, kv_lora 512)'; "
                        f"got {attention!r}")
    text = f'{attention or ""} {r.get("model.config_ref") or ""}'
    m = re.search(r"mla.*?q_lora(?:_rank)?\s*(\d+).*?kv_lora(?:_rank)?\s*(\d+)", text.lower())
    if not m:
        if attention is not None:
            # the only attention this field names is MLA, whose shape the ranks give: other text
            # would leave the model on standard attention without a word
            raise SpecError(f"reference {r.id}: model.attention: expected 'MLA (q_lora <rank>, kv_lora <rank>)' "
                            f"(leave it out for standard attention); got {attention!r}")
        return None
    # DeepSeek-V3 config.json: qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128.
    return {"q_lora_rank": int(m.group(1)), "kv_lora_rank": int(m.group(2)), "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128}


def _kv_channels_in_config_ref(r: _Record) -> int | None:
    """The attention head width a record states only in its config reference (the ModelZoo rows:
    "... Qwen3-235B-A22B.yaml (kv_channels 128; ...)"): Qwen3's heads are 128 wide, not hidden/heads
    = 64, which halves the attention and the QKV widths when missed."""
    m = re.search(r"kv_channels\s+(\d+)", str(r.get("model.config_ref") or ""))
    return int(m.group(1)) if m else None


def _biases(r: _Record, default: bool) -> bool:
    """model.biases when the record states it (GPT-OSS keeps its linear biases under RoPE), else
    the architecture's default (GPT-style: biases; RoPE models: none)."""
    value = r.get("model.biases")
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"reference {r.id}: model.biases: expected true or false, got {value!r}")
    return value


# The shape fields beside layers that make a record's model its own (seq and vocab are printed
# for preset-named runs too: the sequence is the run's, the vocabulary the tokenizer's).
_SHAPE_FIELDS = ("hidden", "heads", "ffn", "query_groups", "kv_channels")


def _dims_preset(r: _Record) -> str | None:
    """The model preset whose dimensions a record takes: the one it names where it prints no layers
    ("Qwen3 8B (dims not taken from this repo)" -> qwen3-8b; the preset is the model's public config)."""
    if r.int("model.layers") is not None:
        return None
    if any(r.get(f"model.{k}") is not None for k in _SHAPE_FIELDS):
        # a record that prints part of its shape describes its own model: a preset's whole shape
        # would silently replace what it prints (hidden 8192 on a "Llama-3 8B" name)
        return None
    from planner.model import model_preset_names
    name = re.sub(r"\(.*?\)", "", str(r.get("model.name") or "")).strip().lower().replace(" ", "-")
    name = name.rsplit("/", 1)[-1]  # a Hugging Face repo id names the model after its org
    # "Llama-3 8B" -> llama3-8b, as the presets write a family and its version together
    for candidate in (name, re.sub(r"(?<=[a-z])-(?=\d)", "", name)):
        if candidate in model_preset_names():
            return candidate
    return None


def _model_notes(r: _Record) -> list[str]:
    """The assumptions _model made for a record: its dimensions from a preset, or the defaults it
    took for the shape fields the record leaves out (each moves the prediction)."""
    preset = _dims_preset(r)
    if preset is not None:
        return [f"model dimensions from the {preset} preset (planner/presets/{preset}.yaml: the model's public "
                "config; the record prints none)"]
    defaults = {"model.activation": "gelu", "model.ffn": "4 x hidden", "model.query_groups": "= heads (no GQA)"}
    return [f"{field} not given: {value}" for field, value in defaults.items() if r.get(field) is None]


# model.activation as records write it -> ModelSpec.activation (planner/model.py Activation): the
# name first, a note may follow ("gelu (GeGLU in original)"); unstated: gelu. Gated SiLU ("silu",
# "swish", as Hugging Face configs name Llama's) is SwiGLU; a bare GeGLU is costed as the gated
# MLP it is (three matrices), as planner/hf_config.py does; ReLU costs what GeLU does (two matrices).
_ACTIVATIONS = (("squared[_ -]?relu|relu2|relu\\^2", "squared_relu"),
                ("swiglu|swish|silu|gated[_ -]?silu", "swiglu"), ("geglu", "swiglu"), ("gelu", "gelu"),
                ("relu", "gelu"))


def _activation(r: _Record) -> str:
    value = r.get("model.activation")
    if value is None:
        return "gelu"
    low = str(value).strip().lower().replace("²", "^2")
    for pattern, name in _ACTIVATIONS:  # the name, then the end or a non-letter (gelu_new, swish-glu)
        if re.match(rf"(?:{pattern})(?![a-z])", low):
            return name
    raise SpecError(f"reference {r.id}: model.activation: unknown activation {value!r}; allowed: "
                    f"{', '.join(get_args(Activation))} (case-insensitive; a note may follow the name)")


def _model(r: _Record, fsdp_schema: bool, gpt_style: bool) -> ModelSpec | str:
    name = str(r.get("model.name") or r.id)
    dims = {k: r.int(f"model.{k}") for k in ("layers", "hidden", "heads", "seq", "vocab")}
    missing = [k for k, v in dims.items() if v is None]
    if missing and (preset := _dims_preset(r)):
        from planner.model import load_model
        return load_model(preset, {"seq_length": dims["seq"]})
    if missing:
        partial = [k for k in _SHAPE_FIELDS if r.get(f"model.{k}") is not None]
        if partial:
            return (f"model dimensions not published ({', '.join(missing)}) beside the {', '.join(partial)} it "
                    "prints; give them (a model preset's shape is taken only where a record prints none)")
        return (f"model dimensions not published ({', '.join(missing)}); give them, or name a model preset "
                "(`planner presets`) as model.name")
    activation = _activation(r)
    fields = dict(
        name=name, layers=dims["layers"], hidden=dims["hidden"], heads=dims["heads"],
        query_groups=r.int("model.query_groups"), ffn=r.int("model.ffn"), seq_length=dims["seq"],
        vocab=dims["vocab"], activation=activation,
        tied_embeddings=_default(r.flag("model.tied_embeddings"), gpt_style),
        position_embedding="learned" if gpt_style else "rope", biases=_biases(r, gpt_style),
        # MPT: no dropout (llm-foundry MPTConfig defaults resid_pdrop = emb_pdrop = attn_pdrop = 0)
        dropout=(gpt_style or name.startswith("GPT")) and not name.upper().startswith("MPT"), moe=_moe(r, fsdp_schema))
    optional = {"head_dim": r.int("model.kv_channels") or _kv_channels_in_config_ref(r), "mla": _mla(r), "mtp_layers": r.int("model.mtp_layers", minimum=0),
                "rope_scaling": r.get("model.rope_scaling"), "activation_clamp": r.float("model.activation_clamp"),
                # a hybrid stack's blocks and Mamba-2 mixer (ModelSpec.hybrid_pattern / mamba)
                "hybrid_pattern": r.get("model.hybrid_pattern"), "mamba": r.get("model.mamba"),
                "mtp_shared_weights": r.get("model.mtp_shared_weights")}
    fields.update({k: v for k, v in optional.items() if k in ModelSpec.model_fields and v})
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as err:
        raise one_line(err, f"reference {r.id}: model") from None  # the field named, pydantic's prefix dropped


def _smallest_vpp(layers_per_stage: int) -> int:
    return next((v for v in range(2, layers_per_stage + 1) if layers_per_stage % v == 0), 1)


def _recompute(text, assumptions: list[str], default: str, why_default: str, rid: str) -> str:
    """parallel.recompute -> Plan.recompute: "full ...", "none" (false, no), "selective ..." (a note
    or the modules may follow), or the selective modules alone ("norm, act"); else a SpecError."""
    if text is None:
        assumptions.append(why_default)
        return default
    low = str(text).strip().lower()
    if low.startswith("full"):
        return "full"
    if re.match(r"(none|no|false|off)(?![a-z])", low):  # a note may follow: "none (assumed)", "no recompute"
        return "none"
    if low.startswith("selective"):
        return "selective"
    if low in ("true", "yes"):  # Megatron's --recompute-activations: selective
        assumptions.append(f"selective recompute (source: {text!r}, as --recompute-activations)")
        return "selective"
    words = _module_text_words(low)
    if words and all(w in _MODULE_WORDS for w in words):
        return "selective"
    raise SpecError(f"reference {rid}: parallel.recompute: unknown recompute {text!r}; allowed: full, selective "
                    f"(or true, yes), none (or false, no, off), a note may follow any of them, or the selective "
                    f"modules alone ({', '.join(_MODULE_WORDS)})")


# How records name Megatron's --recompute-modules ("norm, act", "moe_act layernorm",
# "selective (layernorm, moe)", "mlp + mla up_proj"): word -> module.
_MODULE_WORDS = {"norm": "layernorm", "layernorm": "layernorm", "act": "moe_act", "moe_act": "moe_act",
                 "shared_expert": "shared_experts", "shared_experts": "shared_experts", "moe": "moe",
                 "mlp": "mlp", "up_proj": "mla_up_proj", "mla_up_proj": "mla_up_proj", "core_attn": "core_attn"}


def _module_text_words(text: str) -> list[str]:
    """The words of a lower-case recompute text, split at blanks, commas, '+' and parentheses."""
    return [w for w in re.split(r"[\s,+()]+", text.replace("mla up_proj", "mla_up_proj")) if w]


def _recompute_modules(text, model: ModelSpec, assumptions: list[str]) -> tuple[str, ...] | None:
    """The module set a selective-recompute text names (None: Megatron's default, core_attn, or
    no module named). Only the first clause counts ("...; later ..." describes other runs), and a
    module that does nothing for the model is dropped with an assumption."""
    words = [w for w in _module_text_words(str(text or "").lower().split(";")[0]) if w in _MODULE_WORDS]
    names = sorted({_MODULE_WORDS[w] for w in words})
    if not names:
        return None
    why = applicable_recompute_modules(model)
    kept = [n for n in names if why[n] is None]
    for n in names:
        if why[n] is not None:
            assumptions.append(f"recompute module {n} dropped ({why[n]})")
    if ";" in str(text):
        assumptions.append(f"recompute modules {' '.join(kept)} (the record's first set: {text!r})")
    return tuple(kept) or None


# Optimisation ladders whose recompute text reads "<first set>; later <second set>": the row of
# the ladder from which the second set ran. The DeepSeek-V3 GB200 guide (Megatron-LM@1d9edcf8
# docs/discussions/deepseek-v3-gb200-optimization, §2.2.2): with "Remove up_proj recompute"
# (history row 4) "the recomputation parameters were changed to --recompute-modules mlp moe_act".
LADDER_LATER_RECOMPUTE_FROM_ROW = {"megatron_lm_dsv3_gb200_guide": 4}


# Optimisation ladders: one layout measured after each software step; only the last step (the
# tuned end state) is a recipe, the earlier ones measure software the model does not describe.
LADDER_FINAL_STEP = {"megatron_lm_dsv3_gb200_guide": "step12"}


def untuned_ladder_step(case_id: str, source: str) -> bool:
    """Whether a case is an optimisation ladder's step before its tuned end state."""
    final = LADDER_FINAL_STEP.get(source)
    return final is not None and not case_id.endswith(final)


# Runs whose own source says the software measured had a performance defect being fixed then.
# They are read and reported, under a group of their own, and fit nothing: they measure a defect,
# not the tuned stack the model describes. Record id pattern -> the source's statement.
SOURCE_FLAGGED_SLOW = {
    # benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: "the low baseline performance of the
    # vanilla TP float8 rowwise training is being addressed" (torchtitan#1207). The fix, torchao's
    # auto-filter (torchtitan#1319), keeps the small K/V projections in bf16, and it raised both
    # vanilla and async TP rowwise runs (about 10 % and 15 % over the bf16 TP baseline).
    r"^torchtitan_llama3-(8b|70b)_.*_tp8_(vanilla|async)TP_float8-rowwise$":
        "the page flags its float8 rowwise runs as slow (torchtitan#1207)",
}


def source_flagged_slow(case_id: str) -> str | None:
    """The source's statement where it flags a run's software as slow (SOURCE_FLAGGED_SLOW), else None."""
    return next((why for pattern, why in SOURCE_FLAGGED_SLOW.items() if re.match(pattern, case_id)), None)


def untuned_software(case_id: str, source: str) -> str | None:
    """Why a run did not measure tuned software (an optimisation ladder's earlier step, or a defect its
    source flags), else None: such rows are reported apart and fit nothing."""
    if untuned_ladder_step(case_id, source):
        return "untuned optimisation-ladder step"
    return "software its source flags as slow" if source_flagged_slow(case_id) else None


def _ladder_recompute_text(r: _Record, assumptions: list[str]) -> str:
    """The record's recompute text, or its "later" set where the ladder row has reached it."""
    text = str(r.get("parallel.recompute") or "")
    start = LADDER_LATER_RECOMPUTE_FROM_ROW.get(str(r.get("source_group") or ""))
    row = re.search(r"optimization-history row (\d+)", str(r.get("notes") or "").lower())
    if start is None or row is None or int(row.group(1)) < start or "; later" not in text:
        return text
    later = text.split("; later", 1)[1].strip(" )")
    assumptions.append(f"recompute modules {later} (the ladder's set from row {start} on: {text!r})")
    return f"selective ({later})"


def _fsdp_dtype(r: _Record, assumptions: list[str]) -> str:
    if r.get("precision") is not None:  # the Megatron schemas' place, which this schema never reads
        raise SpecError(f"reference {r.id}: precision: an FSDP/MoE-schema record gives its precision as "
                        "parallel.precision (or parallel.float8 / parallel.mxfp8), not at the top level")
    low_recipe = str(r.get("parallel.lowp_recipe") or "").lower() + " " + str(r.get("parallel.precision") or "").lower()
    f8_recipe = str(r.get("parallel.float8_recipe") or "").lower()
    if "nvfp4" in low_recipe:
        return "nvfp4"
    if "mxfp8" in low_recipe or "mxfp8" in f8_recipe or r.get("parallel.mxfp8") is True:
        return "mxfp8"
    if r.get("parallel.float8") is True or "float8" in f8_recipe:
        # torchao float8 training scales each tensor (or row) from its current amax: current scaling.
        if "rowwise" in f8_recipe:
            # Not costed apart. Rowwise casts each operand along both axes, and torchao before
            # its June 2025 auto-filter (pytorch/ao#2410) also converted the small K/V
            # projections, which ran about 40 % slower than in bf16 (torchtitan#1207).
            assumptions.append("fp8-cs for torchao rowwise scaling (its overheads not costed: torchtitan#1207)")
        return "fp8-cs"
    prec = r.get("parallel.precision")
    if prec is None:
        return "bf16"
    dtype, note = parse_precision(str(prec).replace("amp_", ""), r.id, "parallel.precision")
    if note:
        assumptions.append(note)
    return dtype


def _framework_fsdp(text: str) -> str:
    low = text.lower()
    if "megatron-fsdp" in low:
        return "Megatron-FSDP"
    if "megatron" in low:
        return "Megatron-Core"
    if "torchtitan" in low:
        return "torchtitan FSDP2"
    if "deepspeed" in low:
        return "DeepSpeed ZeRO-3"
    if "composer" in low or "foundry" in low:
        return "llm-foundry FSDP"
    raise SpecError(f"parallel.framework: expected text naming the framework (Megatron-FSDP, Megatron-Core, "
                    f"torchtitan, DeepSpeed, MosaicML Composer / llm-foundry); got {text!r}")


def _source_measured(rid: str) -> str:
    parts = rid.split("_")
    return parts[0] + ("_" + parts[1] if rid.startswith(("dgxc", "bridge")) and len(parts) > 1 else "")


def _maybe_dp_impl(plan_fields: dict, framework: str) -> dict:
    """Plan.dp_impl names the sharded-DP implementation: DeepSpeed ZeRO, PyTorch FSDP (torchtitan
    FSDP2, llm-foundry's FSDP: costed alike), else Megatron (Megatron-FSDP)."""
    low = framework.lower()
    plan_fields["dp_impl"] = ("deepspeed" if "deepspeed" in low else
                              "torch-fsdp2" if ("torchtitan" in low or "foundry" in low or "pytorch" in low)
                              else "megatron")
    return plan_fields


def _plan(r: _Record, plan_fields: dict) -> Plan | str:
    try:
        return Plan.model_validate(plan_fields)
    except ValidationError:
        # an implementation name the fidelity field does not accept: keep zero_stage alone
        for name in ("dp_impl", "dp_implementation", "sharding_impl"):
            plan_fields.pop(name, None)
        try:
            return Plan.model_validate(plan_fields)
        except ValidationError as err:
            return f"plan not representable: {str(one_line(err, 'plan')).removeprefix('plan: ')}"


# --- The layouts Megatron-Bridge's recipes set (the performance tables do not print them) ---------
# Read from the Megatron-Bridge source at commit 067f987df03b8355b03192d88d70f1709fedf51a (the
# commit bridge_runs.yaml's 26.08 rows cite; older rows' recipes may have differed, said per row).
BRIDGE_COMMIT = "067f987df03b"
# DeepSeek-V3 (61 layers; 'm' = its MTP module, on the last stage with the loss): by (pp, vpp),
# `_get_deepseek_v3_pipeline_layout`, which set_deepseek_v3_pipeline_model_parallel_layout applies
# (src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py; pp4 vpp4, pp8 vpp2 and pp16 share one
# 16-stage layout), and the string the H100 perf recipes pass for pp8 vpp4
# (src/megatron/bridge/perf_recipes/deepseek/h100/deepseek_v3.py; Megatron-Core's DeepSeek-V3 GB200
# guide runs the same "Et|(tt|)*30L").
_DSV3_HELPER = "recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout"
_DSV3_16 = "Et*4|(t*4|)*14tmL"
_DSV3_8 = "Et*8|(t*8|)*6t*5mL"
DEEPSEEK_V3_LAYOUTS: dict[tuple[int, int], tuple[str, str]] = {
    (4, 1): ("Et*16|t*16|t*16|t*13mL", _DSV3_HELPER),
    (8, 1): (_DSV3_8, _DSV3_HELPER), (4, 2): (_DSV3_8, _DSV3_HELPER),
    (16, 1): (_DSV3_16, _DSV3_HELPER), (8, 2): (_DSV3_16, _DSV3_HELPER), (4, 4): (_DSV3_16, _DSV3_HELPER),
    (8, 4): ("Et|(tt|)*30mL", "perf_recipes/deepseek/h100/deepseek_v3.py (pp8 vpp4)"),
}
# Qwen3-235B-A22B (94 layers): the base pretrain recipe sets account_for_embedding_in_pipeline_split
# and account_for_loss_in_pipeline_split (src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py,
# qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config); the perf recipes start from it
# (perf_recipes/qwen/common.py) and change only pp / vpp.
_QWEN3_235B = "recipes/qwen/h100/qwen3_moe.py account_for_embedding/loss_in_pipeline_split"
# Llama-3.1-405B (126 layers): every release's pretrain recipe sets both flags (Megatron-Bridge
# v0.1.0rc3 src/megatron/bridge/recipes/llama/llama31_405b.py pretrain_config defaults, v0.2.0-v0.5.1
# recipes/llama/llama3.py llama31_405b_pretrain_config, @067f987 recipes/llama/h100/llama3.py), and
# the performance configs start from that recipe.
_LLAMA31_405B = "recipes/llama/h100/llama3.py llama31_405b_pretrain_config account_for_embedding/loss_in_pipeline_split"


# Every Llama NVFP4 pretraining config turns Transformer Engine's userbuffer TP overlap off, from
# the first release with NVFP4 tables (26.02) to the recipes BRIDGE_COMMIT carries.
BRIDGE_NVFP4_NO_TP_OVERLAP = ("Megatron-Bridge v0.3.0 scripts/performance/configs/llama/llama3_llm_pretrain.py and "
                              "llama31_llm_pretrain.py: tp_comm_overlap = False if precision == 'nvfp4'; "
                              f"@{BRIDGE_COMMIT} perf_recipes/llama/*/llama3*.py likewise")


def bridge_recipe_layout(model_name: str, layers: int, pp: int, vpp: int,
                         record_id: str = "") -> tuple[tuple[int, ...], str] | None:
    """(layers per virtual stage, where in the source it is set: repository, commit, path) of the
    recipe for this model at pp × vpp, or None where the source sets none we know of. A record of
    planner/data/bridge_recipe_knobs.yaml (or of modelzoo_command_knobs.yaml) takes the layout its
    own release's recipe (its launch command) sets, where that layout has pp × vpp stages;
    otherwise the Megatron-Bridge @BRIDGE_COMMIT rules below."""
    key = re.sub(r"[^a-z0-9]", "", model_name.lower())
    if pp == 1:
        return None
    knobs = launch_knobs(record_id) if record_id else None
    # a release whose recipe sets another layout than the record ran: the rules below, said so
    fallback = "" if knobs is None else f"not {knobs.tag}'s recipe (it sets another layout); "
    if knobs is not None:
        text = knobs.value("pipeline_model_parallel_layout")
        if text:
            layout = layout_from_string(text)
            if len(layout) == pp * vpp and sum(layout) == layers:
                return layout, f"{knobs.cite('pipeline_model_parallel_layout')} {text!r}"
        elif knobs.value("pipeline_layout_flags"):
            try:
                return (layout_from_flags(layers, pp, vpp, account_embedding=True, account_loss=True),
                        knobs.cite('pipeline_layout_flags'))
            except SpecError:
                return None
    if key.startswith("deepseekv3") and layers == 61 and (pp, vpp) in DEEPSEEK_V3_LAYOUTS:
        text, where = DEEPSEEK_V3_LAYOUTS[(pp, vpp)]
        return layout_from_string(text), f"Megatron-Bridge {fallback}@{BRIDGE_COMMIT} {where} {text!r}"
    flagged = {"qwen3235ba22b": (94, _QWEN3_235B), "llama31405b": (126, _LLAMA31_405B)}
    for prefix, (n_layers, where) in flagged.items():
        if key.startswith(prefix) and layers == n_layers:
            try:
                return (layout_from_flags(layers, pp, vpp, account_embedding=True, account_loss=True),
                        f"Megatron-Bridge {fallback}@{BRIDGE_COMMIT} {where}")
            except SpecError:
                return None
    return None


# --- Knobs a benchmark's launch script sets where its published table prints none --------------
# (record-id prefix, model-name pattern, {knob: value}, where it is set). Only fills a knob the
# record leaves null; listed among the row's assumptions.
LAUNCH_SCRIPT_KNOBS = (
    # The v25.04.01 README's config table prints VP "NA" for Nemotron-4 340B, but the launch script
    # that produced its numbers sets VP=12 for 340b and passes `-vp 12` to NeMo's
    # pretrain_nemotron4_340b (its 15b branch sets VP=0, the table's NA); v24.11.1's table prints 12.
    ("dgxc_v25.04.01", r"nemotron-?4 340b", {"vpp": 12},
     "NVIDIA/dgxc-benchmarking@85380ff nemotron/launch.sh: 340b sets VP=12 (-vp 12)"),
    # v24.11.1 turned Transformer Engine's cuDNN fused attention off for these two (TE then runs
    # the flash-attn package's kernels); its Llama-3 and Nemotron-4 15B scripts set it on, and
    # v25.04.01's GPT-3 script sets NVTE_FUSED_ATTN=1.
    ("dgxc_v24.11.1", r"gpt-?3 175b", {"te_flash_attention": True},
     "NVIDIA/dgxc-benchmarking@v24.11.1 nemo_megatron/launch.sh: NVTE_FUSED_ATTN=0"),
    ("dgxc_v24.11.1", r"nemotron-?4 340b", {"te_flash_attention": True},
     "NVIDIA/dgxc-benchmarking@v24.11.1 nemotron/configure.sh: 340b sets NVTE_FUSED_ATTN=0"),
)


def launch_script_knobs(rid: str, model_name: str) -> tuple[dict, str]:
    """({knob: value}, where it is set) from LAUNCH_SCRIPT_KNOBS for a record, or ({}, '')."""
    for prefix, pattern, knobs, where in LAUNCH_SCRIPT_KNOBS:
        if rid.startswith(prefix) and re.search(pattern, model_name.lower()):
            return knobs, where
    return {}, ""


# The ModelZoo's Qwen3-235B-A22B model config counts the embedding and the loss as a layer each
# when it splits the pipeline (96 = 94 + 2 slots; runtime.conf: "Account loss and embedding for
# number of layers"), and has since the model was added (b06a6d8, 2025-05-26) through the
# records' config_ref commit: the layout of its H100 rows, whose table prints no command.
MODELZOO_QWEN3_SPLIT = ("Megatron-MoE-ModelZoo e8650517d60d:model_configs/benchmarking/Qwen3-235B-A22B.yaml:27-28 "
                        "--account-for-embedding/loss-in-pipeline-split, set since b06a6d8")


def modelzoo_qwen3_layout(rid: str, model: ModelSpec, pp: int, vpp: int) -> tuple[tuple[int, ...], str] | None:
    """(layers per virtual stage, citation) of a ModelZoo Qwen3-235B-A22B row, or None."""
    if not rid.startswith("mcore-modelzoo_qwen3-235b") or model.layers != 94 or pp == 1:
        return None
    try:
        return layout_from_flags(model.layers, pp, vpp, account_embedding=True, account_loss=True), MODELZOO_QWEN3_SPLIT
    except SpecError:
        return None


def _stage_layers(model: ModelSpec, pp: int, vpp: int, layout_text: str | None,
                  assumptions: list[str], recipe: tuple[tuple[int, ...], str] | None = None
                  ) -> tuple[int, ...] | None | str:
    """Layers per virtual stage for a record (issue 8): the record's own layout string when it has
    one; the layout the recipe's source sets (`bridge_recipe_layout`, cited in the assumption);
    None when the layers split evenly; else the balanced split (listed as an assumption: the
    records do not publish the recipe's layout flags). A str is the reason the record is skipped."""
    if layout_text:
        try:
            layout = layout_from_string(layout_text)
        except SpecError as err:
            return str(err)
        if len(layout) != pp * vpp or sum(layout) != model.layers:
            return (f"custom pipeline layout {layout_text!r}: {len(layout)} stages of {sum(layout)} layers, "
                    f"the run has pp·vpp = {pp * vpp} stages of {model.layers} layers")
        return layout
    if recipe is not None and len(recipe[0]) == pp * vpp and sum(recipe[0]) == model.layers:
        layout, where = recipe
        assumptions.append(f"layout {compress_runs(layout)} layers per virtual stage as the recipe sets it "
                           f"({where})")
        return None if layout == even_layout(model.layers, pp, vpp) else layout
    if even_layout(model.layers, pp, vpp) is not None:
        return None
    layout = balanced_layout(model.layers, pp, vpp)
    assumptions.append(f"uneven layout {compress_runs(layout)} layers per virtual stage (balanced split; "
                       "the recipe's layout flags are not published)")
    return layout


def _case_measured(r: _Record, bridge: bool) -> RefCase | Skipped:
    rid = r.id
    _check_record(r)
    preset, gpu_note = system_preset_for(str(r.get("system.gpu") or ""))
    if preset is None:
        return Skipped(rid, f"no preset for {r.get('system.gpu')}")
    if r.get("parallel.tp") is None or r.get("parallel.pp") is None:
        return Skipped(rid, "parallel layout (tp/pp) not published")
    gpt_style = rid.startswith(("narayanan", "megatron"))
    model = _model(r, False, gpt_style)
    if isinstance(model, str):
        return Skipped(rid, model)
    assumptions = ([gpu_note] if gpu_note else []) + _model_notes(r)
    tp, pp, cp = r.int("parallel.tp"), r.int("parallel.pp"), r.int("parallel.cp", 1)
    gpus = r.int("system.gpus")
    if gpus is None:
        return Skipped(rid, "GPU count not published")
    dp = _data_parallel(rid, gpus, tp * pp * cp, r.int("parallel.dp"))
    mb = r.int("parallel.microbatch")
    if mb is None:
        mb = 1
        assumptions.append("micro-batch 1")
    vpp_raw = r.get("parallel.vpp")
    script_knobs, script_where = launch_script_knobs(rid, str(r.get("model.name") or ""))
    if vpp_raw is None and "vpp" in script_knobs:
        vpp_raw = script_knobs["vpp"]
        assumptions.append(f"interleaved, vpp {vpp_raw} ({script_where})")
    overlap_text = str(r.get("parallel.comm_overlap") or "").lower()
    pp_overlap = vpp_raw is None and pp > 1 and "pp overlap" in overlap_text
    if pp_overlap:
        # Megatron overlaps pipeline p2p with compute only in the interleaved schedule (r0.8
        # megatron/training/arguments.py @96d6abaab9 turns overlap_p2p_comm off without a virtual
        # pipeline), so a run that states PP overlap was interleaved; vpp itself is unstated.
        vpp_raw = "interleaved"
    if isinstance(vpp_raw, str) and not vpp_raw.strip().isdigit() and "interleaved" not in vpp_raw.lower():
        raise SpecError(f"reference {rid}: parallel.vpp: expected a whole number of virtual stages, or text "
                        f"saying 'interleaved' where the count is not published; got {vpp_raw!r}")
    if isinstance(vpp_raw, str) and not vpp_raw.strip().isdigit():
        vpp = _smallest_vpp(model.layers // pp)
        assumptions.append(f"interleaved, vpp {vpp}" + (" (PP overlap stated: Megatron overlaps p2p only when "
                                                         "interleaved; vpp not published, the smallest)"
                                                         if pp_overlap else ""))
    else:
        vpp = int(vpp_raw) if isinstance(vpp_raw, str) else (r.int("parallel.vpp") or vpp_raw or 1)
    _check_vpp(rid, vpp, pp, model.layers)
    recipe = bridge_recipe_layout(str(r.get("model.name") or ""), model.layers, pp, vpp, rid) if bridge else None
    stage_layers = _stage_layers(model, pp, vpp, None, assumptions, recipe)
    if isinstance(stage_layers, str):
        return Skipped(rid, stage_layers)
    era_2021 = rid.startswith(("narayanan", "megatron_readme_2020", "megatron_readme_jan2021"))
    if rid.startswith("megatron_readme_h100"):
        recompute = _recompute(r.get("parallel.recompute"), assumptions, "selective",
                               "selective recompute (Megatron-Core default recipe)", rid)
    else:
        recompute = _recompute(r.get("parallel.recompute"), assumptions, "none",
                               "no recompute (NeMo/Bridge H100+ recipes: recompute_layers=0)", rid)
    sp_raw = r.flag("parallel.sequence_parallel", ("likely",))
    sp = tp > 1 and (sp_raw is True or isinstance(sp_raw, str) or (sp_raw is None and not era_2021))
    if sp_raw is None and sp:
        assumptions.append("sequence parallel")
    dist_raw = r.flag("parallel.distributed_optimizer", ("likely", "ZeRO stage 3"))
    dist = str(dist_raw)
    fsdp_degree = r.int("parallel.fsdp", 0, minimum=0) if bridge else 0
    zero3 = "ZeRO stage 3" in dist or fsdp_degree > 1
    zero = 3 if zero3 else 1 if (dist_raw is True or "likely" in dist or (dist_raw is None and not era_2021)) else 0
    framework = "DeepSpeed ZeRO-3" if "ZeRO stage 3" in dist else "Megatron-Bridge" if bridge else "Megatron/NeMo"
    if fsdp_degree > 1:
        framework = "Megatron-FSDP"
        if fsdp_degree != dp * cp:
            assumptions.append(f"parameters sharded over dp·cp = {dp * cp} (record: fsdp {fsdp_degree})")
    ep = r.int("parallel.ep", 1)
    etp = r.int("parallel.etp", 0, minimum=0) or None
    if model.moe and etp is None and gpus % (tp * ep * pp):
        # Megatron needs world % (etp·ep·pp) == 0 (parallel_state.py); with etp = tp this layout
        # could not run, so the recipe folded the experts to etp 1
        etp = 1
        assumptions.append(f"etp 1 (tp·ep·pp = {tp * ep * pp} does not divide {gpus} GPUs)")
    gbs = r.int("parallel.global_batch")
    if gbs is None:
        return Skipped(rid, "global batch not published")
    if gbs % (mb * dp):
        own = _batch_the_record_implies(r, mb, dp, model.seq_length)
        if own is None:
            return Skipped(rid, f"global batch {gbs} is not a multiple of micro-batch·dp = {mb * dp}")
        assumptions.append(f"global batch {own}, not the printed {gbs}: micro-batch·dp·accumulation = "
                           f"{mb}·{dp}·{own // (mb * dp)} and tokens/s × step time / sequence both give {own}")
        gbs = own
    modules = _recompute_modules(_ladder_recompute_text(r, assumptions), model, assumptions) \
        if recompute == "selective" else None
    plan_fields = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, micro_batch=mb, global_batch=gbs, vpp=vpp,
                       stage_layers=stage_layers,
                       sequence_parallel=sp, recompute=recompute, recompute_modules=modules, zero_stage=zero,
                       dp_comm_overlap=not era_2021, tp_comm_overlap=sp and not era_2021)
    _stated_fp8_weights(r, plan_fields, assumptions)
    if framework == "DeepSpeed ZeRO-3":
        # 2021 Megatron did not overlap its DP reduce; DeepSpeed ZeRO-3 did: its parameter
        # coordinator prefetches the next modules' parameters (stage3_prefetch_bucket_size) and
        # reduces gradients on a side stream during the backward (overlap_comm): DeepSpeed's
        # ZeRO-3 configuration keys (deepspeed.ai, config-json, "ZeRO Optimizations").
        plan_fields["dp_comm_overlap"] = True
        assumptions.append("DeepSpeed ZeRO-3 prefetch and overlap_comm")
    plan = _plan(r, _maybe_dp_impl(plan_fields, framework) if zero == 3 else plan_fields)
    if isinstance(plan, str):
        return Skipped(rid, plan)
    prec = r.get("precision")
    if prec is None:
        raise SpecError(f"reference {rid}: precision: required field is missing (a Megatron-schema record; "
                        "an FSDP/MoE-schema record names parallel.fsdp_or_zero3_degree instead)")
    dtype, note = parse_precision(str(prec), rid)
    if note:
        assumptions.append(note)
    if bridge and str(prec).strip().lower() == "na":
        dtype = "fp8"  # bridge_runs.yaml notes: "na" = not stated; the 25.09 tables are fp8 recipes
        assumptions[-1] = "fp8 (25.09 tables are fp8 recipes)"
    elif bridge and dtype == "fp8" and bridge_release(rid) >= BRIDGE_ONLY_CURRENT_SCALING_FROM:
        dtype = "fp8-cs"
        assumptions.append(BRIDGE_FP8_IS_CURRENT_SCALING)
    _check_stated_fp8_weights(r, plan, dtype)
    extra = {}
    if dtype != "bf16" and dtype != "fp16" and not era_2021:
        # NeMo's performance scripts set grad_reduce_in_fp32=False with fp8: bf16 main grads and reduce.
        extra["bytes_per_param"] = BytesPerParam(grads=2.0, grad_reduce=2.0)
        assumptions.append("bf16 gradients (NeMo fp8 perf recipe)")
    elif bridge and dtype == "bf16":
        # Megatron-Bridge's performance scripts set grad_reduce_in_fp32=False for every precision,
        # BF16 included (scripts/performance/configs/*/*_llm_pretrain.py set_*_common_configs from
        # 25.11 on, the 25.09 YAMLs' mixed_precision block, 26.08's perf_recipes/_common.py): the
        # gradient buffer and its reduce in the parameters' bf16.
        extra["bytes_per_param"] = BytesPerParam(grads=2.0, grad_reduce=2.0)
        assumptions.append("bf16 gradients (Megatron-Bridge perf scripts, every precision)")
    elif dtype == "fp16" and framework == "Megatron/NeMo":
        # Megatron with --fp16 keeps the gradient buffer in the parameters' dtype and all-reduces it
        # in fp16 unless --accumulate-allreduce-grads-in-fp32 is given (off by default; validate_args
        # forces it for bf16 only): megatron/model/distributed.py and arguments.py @aed2f75e20
        # (2021-04, the SC'21 runs); the 2020 code reduced fp16 unless --fp32-allreduce (off,
        # arguments.py @5281919420). Memory keeps Megatron's 18 B/param accounting.
        extra["bytes_per_param"] = BytesPerParam(grad_reduce=2.0)
        assumptions.append("fp16 gradient all-reduce (Megatron fp16 default)")
    if framework == "DeepSpeed ZeRO-3":
        # DeepSpeed ZeRO-3 (Narayanan Table 2 baseline) reduces fp16 gradients: 2 bytes on the wire.
        extra["bytes_per_param"] = BytesPerParam(grad_reduce=2.0)
        assumptions.append("DeepSpeed fp16 gradient reduce")
    if script_knobs.get("te_flash_attention"):
        extra["te_flash_attention"] = True
        assumptions.append(f"FlashAttention-2 instead of cuDNN attention ({script_where})")
    dense_knobs = recipe_knobs(rid) if bridge and model.moe is None else None
    if dense_knobs is not None:
        recipe_run = bridge_dense_recipe(dense_knobs, plan, dtype,
                                         recompute_stated=r.get("parallel.recompute") is not None,
                                         fsdp_stated=r.get("parallel.fsdp") is not None,
                                         layers=model.layers, host_tier=load_system(preset, gpus).offload is not None)
        if any(n.startswith(("no recompute (", "full recompute")) for n in recipe_run.notes):
            assumptions[:] = [a for a in assumptions if not a.startswith("no recompute (NeMo/Bridge")]
        if recipe_run.plan_update:
            plan = _plan(r, {**plan.model_dump(), **recipe_run.plan_update})
            if isinstance(plan, str):
                return Skipped(rid, plan)
        if recipe_run.megatron_fsdp:
            framework = "Megatron-FSDP"
        extra = {**extra, **recipe_run.job_update}
        assumptions.extend(recipe_run.notes)
    if bridge and dtype == "nvfp4" and plan.tp_comm_overlap and family_of(model.name) == "Llama-3":
        plan = Plan.model_validate({**plan.model_dump(), "tp_comm_overlap": False})
        assumptions.append(f"no TP comm overlap with NVFP4 ({BRIDGE_NVFP4_NO_TP_OVERLAP})")
    model, plan, extra = _with_moe_recipe(r, model, plan, dtype, extra, assumptions)
    if bridge and family_of(model.name) == "DeepSeek-V3":
        extra = {**extra, "adam_moments": "bf16"}
        assumptions.append(f"bf16 Adam moments ({BRIDGE_DSV3_BF16_MOMENTS})")
    job = JobSpec(global_batch=gbs, max_global_batch=max(gbs, 3072), dtype=dtype, flash_attention=not era_2021,
                  hbm_reserve_gib=0.0, **extra)
    system = load_system(preset, gpus)
    _check_system_fields(r, system)
    step, step_field = _measured_step(r)
    if step is not None:
        how = "measured step time"
    elif r.get("derived.iteration_time_s") is not None and (r.get("measured.tokens_per_sec_per_gpu") is not None
                                                            or r.get("measured.model_tflops_per_gpu") is not None):
        step, how = r.float("derived.iteration_time_s"), "derived step time (source's tokens/s)"
        step_field = "derived.iteration_time_s"
    elif r.get("measured.tflops_per_gpu") is not None and rid.startswith("narayanan"):
        # Narayanan rows print TFLOP/s under eq. 3 (incl. recompute); invert it exactly.
        f = narayanan_eq3_flops(gbs, model.seq_length, model.layers, model.hidden, model.vocab,
                                recompute=recompute == "full")
        step, how = f / (r.float("measured.tflops_per_gpu") * 1e12 * gpus), "eq. 3 FLOPs / published TFLOP/s"
    elif r.get("measured.tflops_per_gpu") is not None and r.get("derived.iteration_time_s") is not None:
        step, how = r.float("derived.iteration_time_s"), "derived step time (source's TFLOP/s)"
    elif (tps := r.float("measured.tokens_per_sec_per_gpu")) is not None:
        # a throughput alone (a user's own run): the step that moves the global batch at that rate
        step = gbs * model.seq_length / (tps * gpus)
        how = "gbs*seq/(tokens_per_sec_per_gpu*gpus)"
    elif (tps := r.float("measured.tokens_per_sec")) is not None:
        step, how = gbs * model.seq_length / tps, "gbs*seq/tokens_per_sec (all GPUs)"
    else:
        return Skipped(rid, "no step time or throughput to compare: give measured.iteration_time_s (seconds), "
                            "measured.tokens_per_sec_per_gpu or measured.tokens_per_sec")
    if step_field is not None:  # a step time beside the throughput it was read or derived from
        _check_measurements_agree(r, step_field, step, gbs * model.seq_length, gpus)
    _check_throughputs_agree(r, gpus)
    _check_below_peak(r, how, step, gbs * model.seq_length * model_flops_per_token(model), system)
    source = _source_measured(rid)
    return RefCase(rid, source, model, system, plan, job, step, how, assumptions,
                   fit=fits_hardware(framework, model), framework=framework, family=family_of(model.name))


def _with_moe_recipe(r: _Record, model: ModelSpec, plan: Plan, dtype: str, job_extra: dict,
                     assumptions: list[str]) -> tuple[ModelSpec, Plan, dict]:
    """The routing, dispatcher, all-to-all overlap (and for Bridge records with a recipe entry,
    recompute, TP overlap, token-drop capacity, MTP) an NVIDIA MoE benchmark ran with
    (planner/reference_moe.py), applied to the record's model, plan and job."""
    knobs = launch_knobs(r.id) if model.moe is not None else None
    if knobs is not None:
        model, model_notes = bridge_recipe_model(knobs, model)
        job_update, job_notes = bridge_recipe_job_updates(knobs, dtype)
        job_extra = {**job_extra, **job_update}
        assumptions.extend(model_notes + job_notes)
    update, imbalance, notes = nvidia_moe_settings(
        r.id, model, plan, dtype, str(r.get("system.gpu") or ""), str(r.get("notes") or ""),
        str(r.get("parallel.dispatcher") or ""))
    if "recompute" in update and r.get("parallel.recompute") is not None:
        # the record states its recompute: it wins over the recipe
        update = {k: v for k, v in update.items() if k not in ("recompute", "recompute_modules")}
    elif "recompute" in update:
        assumptions[:] = [a for a in assumptions if not a.startswith("no recompute (")]
    elif knobs is not None and knobs.where("recompute_granularity") and knobs.value("recompute_granularity") is None:
        # the launch sets no recompute: say where, instead of the record's silence
        assumptions[:] = [f"no recompute ({knobs.cite('recompute_granularity')})" if a == "no recompute (not stated)"
                          else a for a in assumptions]
    assumptions.extend(notes)
    if imbalance is not None:
        job_extra = {**job_extra, "moe_load_imbalance": imbalance}
    return model, (Plan.model_validate({**plan.model_dump(), **update}) if update else plan), job_extra


def _default(value, default):
    """`value`, or `default` where the record leaves the field out."""
    return default if value is None else value


def _data_parallel(rid: str, gpus: int, model_parallel: int, stated: int | None = None) -> int:
    """dp = GPUs / (tp·pp·cp); a record whose GPU count is not a multiple is malformed, and so is
    one whose stated dp (`parallel.dp`) says otherwise."""
    if gpus % model_parallel:
        raise SpecError(f"reference {rid}: system.gpus: {gpus} is not a multiple of tp·pp·cp = {model_parallel}")
    if stated is not None and stated != gpus // model_parallel:
        raise SpecError(f"reference {rid}: parallel.dp: {stated} contradicts system.gpus / (tp·pp·cp) = "
                        f"{gpus} / {model_parallel} = {gpus // model_parallel}")
    return gpus // model_parallel


def _kernel_stack(r: _Record, framework: str, assumptions: list[str]) -> str:
    """The kernels a run's framework executes (JobSpec.kernels): torchtitan runs its own PyTorch
    modules, under torch.compile where the record says so; llm-foundry's MPT runs eager PyTorch
    modules (its attention kernel: `_llm_foundry_triton_attention`); the Megatron stacks run
    Transformer Engine."""
    if framework == "torchtitan FSDP2":
        compiled = r.get("parallel.compile")
        if compiled is None:
            assumptions.append("eager PyTorch kernels (torch.compile not stated)")
        return "torch-compile" if compiled is True else "torch-eager"
    if framework == "llm-foundry FSDP":
        return "torch-eager"
    return "te"


# llm-foundry's benchmark tables (scripts/train/benchmarking/README.md) and the attention kernel
# each ran: submit_benchmarks.py defaulted to `--attn_impl triton` (MPT's Triton FlashAttention)
# until after the tables' last refresh (5e85bd62, 2024-01-06), and sweep.sh passes no attn_impl;
# only the "Large Scale" H100 table of that refresh (sweep.py @ 5e85bd62) ran `--attn_impl
# flash` (flash-attn 2.4.2, the gpu-flash2 install) for these model sizes (13b and 30b: triton).
LLM_FOUNDRY_FLASH2_SECTION = "large scale"
LLM_FOUNDRY_FLASH2_MODELS = ("mpt-1b", "mpt-3b", "mpt-7b", "mpt-70b")


def _llm_foundry_triton_attention(r: _Record, model: ModelSpec, assumptions: list[str]) -> bool:
    """Whether an llm-foundry row ran MPT's Triton FlashAttention (else FlashAttention-2)."""
    flash2 = LLM_FOUNDRY_FLASH2_SECTION in str(r.get("notes") or "").lower() \
        and model.name.lower() in LLM_FOUNDRY_FLASH2_MODELS
    assumptions.append("FlashAttention-2 (sweep.py @ 5e85bd62: attn_impl flash)" if flash2 else
                       "MPT's Triton FlashAttention (submit_benchmarks.py default attn_impl triton)")
    return not flash2


def _torchtitan_default_recompute(model: ModelSpec, system: SystemSpec, plan: Plan, job: JobSpec,
                                  assumptions: list[str]) -> Plan:
    """Recompute a torchtitan record leaves unstated: the train configs' default (selective,
    torchtitan/train_configs/llama3_8b.toml `[activation_checkpoint] mode = "selective"`), or full
    where the run, which did run, fits HBM only with full recompute under our memory model."""
    from planner.analytical import PlanArrays, estimate_many  # layer 2; only these rows need it
    for mode in ("selective", "full"):
        trial = plan.model_copy(update={"recompute": mode})
        r = estimate_many(model, system, job, PlanArrays.from_plans([trial], model.layers))
        if r["hbm_bytes"][0] <= r["hbm_capacity_bytes"][0] or mode == "full":
            break
    assumptions[:] = [a for a in assumptions if a != "no recompute (not stated)"]
    assumptions.append(f"{mode} recompute (not stated; torchtitan's default is selective"
                       f"{'' if mode == 'selective' else ', which does not fit HBM here'})")
    return trial


def torchtitan_default_split(layers: int, pp: int, stages_per_rank: int) -> tuple[int, ...]:
    """Layers per pipeline stage when a torchtitan run sets no split points: pp·stages_per_rank
    stages (1 per rank for single-stage schedules such as 1F1B, 2 for multi-stage ones such as
    Interleaved 1F1B), the first and the last layers // stages layers, the stages in between one
    more while the remainder lasts (torchtitan/parallelisms/pipelining_utils.py
    generate_split_points @ 9dec370, the commit of the Dec 2024 tables)."""
    stages = pp * stages_per_rank
    base, extra = divmod(layers, stages)
    middle = [base + 1 if i < extra else base for i in range(stages - 2)]
    out = [base] + middle
    return tuple(out + [layers - sum(out)])


def _torchtitan_default_stages(layers: int, pp: int, interleaved: bool, assumptions: list[str]
                               ) -> tuple[int, tuple[int, ...] | None]:
    """(vpp, layers per virtual stage) of a torchtitan pipeline record without a stated layout."""
    vpp = 2 if interleaved else 1
    split = torchtitan_default_split(layers, pp, vpp)
    assumptions.append(f"{'interleaved, ' if interleaved else ''}{vpp} stage{'s' if vpp > 1 else ''} per rank, "
                       f"{compress_runs(split)} layers per stage (torchtitan generate_split_points @ 9dec370: "
                       "no split points set)")
    return vpp, (None if len(set(split)) == 1 else split)


def _torchtitan_pp_microbatch(local_batch: int, pp: int, assumptions: list[str]) -> int:
    """torchtitan's tables print the local batch (sequences per data-parallel rank); with pipeline
    parallelism the schedule splits it into `pipeline_parallel_microbatches` microbatches, which
    defaults to the pipeline degree (torchtitan/parallelisms/pipelining_utils.py,
    build_pipeline_schedule, Dec 2024: `n_microbatches = ... or pipeline_parallel_degree`)."""
    if local_batch % pp:
        return local_batch
    assumptions.append(f"{pp} pipeline microbatches of {local_batch // pp} (torchtitan default: "
                       f"pp microbatches of the local batch {local_batch})")
    return local_batch // pp


# torchtitan Float8 runs whose record does not say how FSDP gathered the weights: the model's train
# config at the torchtitan commit the run used turns on torchao's float8 all-gather (FSDP2 gathers
# the fp8 weights, 1 B per element); elsewhere the JobConfig default holds
# (--float8.enable_fsdp_float8_all_gather is store_true, torchtitan/config_manager.py @ 9dec370),
# as in llama3_8b.toml / llama3_70b.toml @ 9dec370, which leave Float8 to the command line.
# Keyed by (record source commit prefix, model name).
TORCHTITAN_FLOAT8_ALL_GATHER_CONFIGS = {
    ("820504e2", "Llama 3.1 405B"): "train_configs/llama3_405b.toml @ 9dec370, the Dec 2024 tables' torchtitan: "
                                    "enable_fsdp_float8_all_gather = true",
    ("4d88a8a4", "Llama 3.1 405B"): "train_configs/llama3_405b.toml @ 4d88a8a4: enable_fsdp_float8_all_gather = true",
}


def _torchtitan_float8_all_gather_config(r: _Record) -> str | None:
    """Where a torchtitan Float8 record's train config turns on the fp8 FSDP all-gather, else None."""
    if r.get("parallel.float8") is not True or r.get("parallel.float8_recipe") is not None:
        return None
    key = (str(r.get("source.commit") or "")[:8], str(r.get("model.name") or ""))
    return TORCHTITAN_FLOAT8_ALL_GATHER_CONFIGS.get(key)


# Sources whose TFLOP/s are Megatron-LM's own logged counter (causal attention halved:
# flops.megatron_logged_flops_per_token); checked on the ModelZoo rows that publish both a step time
# and TFLOP/s (tests/test_reference_moe.py). The DeepSeek-V3 GB200 guide's tables are the same
# counter (Megatron-LM docs, logged by the same training loop).
MEGATRON_COUNTER_SOURCES = ("megatron_moe_modelzoo", "megatron_lm_dsv3_gb200_guide")


def _batch_the_record_implies(r: _Record, mb: int, dp: int, seq: int) -> int | None:
    """The global batch a record's own fields agree on where its printed one cannot be (not a
    multiple of micro-batch·dp): micro-batch·dp·gradient accumulation, confirmed within 1 % by
    its throughput (tokens/s × step time / sequence length, the sequences one step consumed).
    None where the record lacks any of them or they disagree. DGX Cloud v25.04.01's GPT-3 175B
    table prints 1204 on 512 GPUs where every other row has dp·64; 1024 is what its tokens/s
    and step time give."""
    accum, tps, step = r.int("parallel.grad_accum"), r.float("measured.tokens_per_sec"), r.float("measured.iteration_time_s")
    if accum is None or tps is None or step is None:
        return None
    implied = mb * dp * accum
    return implied if abs(tps * step / seq / implied - 1.0) <= 0.01 else None


def _stated_fp8_weights(r: _Record, plan_fields: dict, assumptions: list[str]) -> None:
    """parallel.fp8_param_gather: true where the record's recipe keeps FP8 primary weights
    (Megatron --fp8-param-gather; bench/heldout_nemo.py states it for NeMo 2.x's FP8 plugins): the
    DP all-gather moves 1 B per weight, and no bf16 copy is kept."""
    if r.flag("parallel.fp8_param_gather") and not plan_fields.get("fp8_param_gather"):
        plan_fields["fp8_param_gather"] = True
        assumptions.append("fp8 parameter all-gather (record)")


def _check_stated_fp8_weights(r: _Record, plan: Plan, dtype: str) -> None:
    """FP8 weights need an FP8 precision and a sharded optimizer (Megatron refuses
    --fp8-param-gather without --use-distributed-optimizer or FSDP: planner.megatron's rules)."""
    if r.get("parallel.fp8_param_gather") is not True:
        return
    if dtype in ("bf16", "fp16"):
        raise SpecError(f"reference {r.id}: parallel.fp8_param_gather: FP8 weights need an FP8 precision; "
                        f"the record's precision is {dtype}")
    if plan.zero_stage == 0:
        raise SpecError(f"reference {r.id}: parallel.fp8_param_gather: FP8 weights are gathered by a sharded "
                        "optimizer; the record has none (parallel.distributed_optimizer false)")


# The FSDP/MoE schema's yes/no layout fields (each true, false or absent).
FSDP_SWITCHES = ("float8", "mxfp8", "compile", "async_tp", "fp8_param_gather")


def _case_fsdp(r: _Record) -> RefCase | Skipped:
    rid = r.id
    _check_record(r)
    preset, gpu_note = system_preset_for(str(r.get("system.gpu") or ""))
    if preset is None:
        return Skipped(rid, f"no preset for {r.get('system.gpu')}")
    framework_text = r.get("parallel.framework")
    if not isinstance(framework_text, str):
        raise SpecError(f"reference {rid}: parallel.framework: expected text naming the framework; "
                        f"got {framework_text!r}")
    try:
        framework = _framework_fsdp(framework_text)
    except SpecError as err:
        raise SpecError(f"reference {rid}: {err}") from None
    for switch in FSDP_SWITCHES:  # yes/no fields: "true" or 1 would otherwise read as false
        r.flag(f"parallel.{switch}")
    model = _model(r, True, gpt_style=framework == "DeepSpeed ZeRO-3" or framework == "llm-foundry FSDP")
    if isinstance(model, str):
        return Skipped(rid, model)
    assumptions = ([gpu_note] if gpu_note else []) + _model_notes(r)
    tp, pp, cp = r.int("parallel.tp", 1), r.int("parallel.pp", 1), r.int("parallel.cp", 1)
    gpus = r.int("system.gpus")
    if gpus is None:
        return Skipped(rid, "GPU count not published")
    dp = _data_parallel(rid, gpus, tp * pp * cp, r.int("parallel.dp"))
    vpp = r.int("parallel.vpp", 1)
    _check_vpp(rid, vpp, pp, model.layers)
    interleaved = "interleaved" in str(r.get("parallel.pp_schedule") or "").lower()
    layout_text = str(r.get("parallel.pp_layout") or "") or None
    if framework == "torchtitan FSDP2" and pp > 1 and vpp == 1 and layout_text is None:
        vpp, stage_layers = _torchtitan_default_stages(model.layers, pp, interleaved, assumptions)
    else:
        if vpp == 1 and interleaved:
            vpp = _smallest_vpp(model.layers // pp)
            assumptions.append(f"interleaved, vpp {vpp}")
        # a ModelZoo row with a published command: the layout its model config's split flags set
        recipe = bridge_recipe_layout(model.name, model.layers, pp, vpp, rid) if launch_knobs(rid) else \
            modelzoo_qwen3_layout(rid, model, pp, vpp)
        stage_layers = _stage_layers(model, pp, vpp, layout_text, assumptions, recipe)
    if isinstance(stage_layers, str):
        return Skipped(rid, stage_layers)
    mb, gbs = r.int("parallel.microbatch"), r.int("parallel.global_batch")
    accum = r.int("parallel.grad_accum")
    if mb is None and gbs is None:
        return Skipped(rid, "neither global batch nor micro-batch published")
    if mb is None:
        mb = 1
        assumptions.append("micro-batch 1")
    if gbs is None:
        gbs = mb * dp * (accum or 1)
        assumptions.append(f"global batch = micro-batch·dp{'·accumulation' if accum else ''} = {gbs}")
    if framework == "torchtitan FSDP2" and pp > 1 and r.int("parallel.pp_microbatches") is None:
        mb = _torchtitan_pp_microbatch(mb, pp, assumptions)
    if gbs % (mb * dp):
        return Skipped(rid, f"global batch {gbs} is not a multiple of micro-batch·dp = {mb * dp}")
    degree = r.int("parallel.fsdp_or_zero3_degree", 0, minimum=0)
    sharding = str(r.get("parallel.sharding") or "")
    megatron = framework == "Megatron-Core"
    zero = 1 if megatron else 2 if "SHARD_GRAD_OP" in sharding else 3 if (degree > 1 or framework != "llm-foundry FSDP") else 0
    if framework == "llm-foundry FSDP" and degree == 0 and zero == 0:
        # llm-foundry's benchmark YAMLs use FULL_SHARD unless the record's sharding says
        # SHARD_GRAD_OP (the Large Scale H100 table's 1b and 3b rows: ZeRO-2, kept above)
        zero = 3
    if zero >= 2 and degree and degree != dp * cp:
        hsdp = r.int("parallel.hsdp_replicas") or r.int("parallel.shard_group")
        assumptions.append(f"sharded over dp·cp = {dp * cp} (record: shard group {degree}"
                           f"{f', {hsdp} replicas' if hsdp else ''}; hybrid sharding not modelled)")
    ep = r.int("parallel.ep", 1)
    if model.moe and (dp * cp) % ep:
        assumptions.append(f"ep {ep} folded across tp/pp (ep does not divide dp·cp = {dp * cp})")
    recompute = _recompute(r.get("parallel.recompute"), assumptions, "none", "no recompute (not stated)", rid)
    sp = tp > 1  # torchtitan TP and Megatron-Core with TP shard the sequence (SP) by default
    etp = r.int("parallel.etp", 0, minimum=0) or None  # expert tensor parallel (None = tp)
    modules = _recompute_modules(_ladder_recompute_text(r, assumptions), model, assumptions) \
        if recompute == "selective" else None
    plan_fields = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, micro_batch=mb, global_batch=gbs, vpp=vpp,
                       stage_layers=stage_layers, recompute_modules=modules,
                       sequence_parallel=sp, recompute=recompute, zero_stage=zero, dp_comm_overlap=True,
                       tp_comm_overlap=sp and (megatron or r.get("parallel.async_tp") is True))
    if framework == "torchtitan FSDP2" and "fsdp float8 all-gather" in str(r.get("parallel.float8_recipe") or ""):
        # torchao's Float8Linear with enable_fsdp_float8_all_gather: FSDP2 gathers the fp8 weights
        plan_fields["fp8_param_gather"] = True
        assumptions.append("fp8 parameter all-gather (record: fsdp float8 all-gather)")
    elif framework == "torchtitan FSDP2" and (config := _torchtitan_float8_all_gather_config(r)):
        plan_fields["fp8_param_gather"] = True
        assumptions.append(f"fp8 parameter all-gather ({config})")
    _stated_fp8_weights(r, plan_fields, assumptions)
    if framework == "Megatron-FSDP" and zero == 3:
        # Megatron-FSDP's user guide recommends --grad-reduce-in-bf16, and its MoE example
        # (docs/discussions/megatron-fsdp-user-guide/example-scripts/sbatch_mfsdp_deepseek_v3.sh:
        # EP 8, MBS 4, GBS 2048, as the ModelZoo row) sets it; the records do not state it.
        plan_fields["grad_reduce_in_bf16"] = True
        assumptions.append("bf16 gradient reduce (Megatron-FSDP user guide: --grad-reduce-in-bf16)")
    plan = _plan(r, _maybe_dp_impl(plan_fields, framework) if zero >= 2 else plan_fields)
    if isinstance(plan, str):
        return Skipped(rid, plan)
    dtype = _fsdp_dtype(r, assumptions)
    _check_stated_fp8_weights(r, plan, dtype)
    extra = {}
    if framework == "DeepSpeed ZeRO-3":
        extra["bytes_per_param"] = BytesPerParam(grad_reduce=2.0)
        assumptions.append("DeepSpeed fp16 gradient reduce")
    model, plan, extra = _with_moe_recipe(r, model, plan, dtype, extra, assumptions)
    kernels = _kernel_stack(r, framework, assumptions)
    if framework == "llm-foundry FSDP":
        # MPT's default loss_fn "fused_crossentropy" (llmfoundry/models/mpt/modeling_mpt.py): the
        # flash-attn fused cross-entropy on the 16-bit logits; the benchmark YAMLs keep it
        extra["loss_kernel"] = "flash-attn"
        extra["triton_flash_attention"] = _llm_foundry_triton_attention(r, model, assumptions)
    job = JobSpec(global_batch=gbs, max_global_batch=max(gbs, 3072), dtype=dtype, flash_attention=True,
                  hbm_reserve_gib=0.0, kernels=kernels, **extra)
    system = load_system(preset, gpus)
    _check_system_fields(r, system)
    if framework == "torchtitan FSDP2" and r.get("parallel.recompute") is None:
        plan = _torchtitan_default_recompute(model, system, plan, job, assumptions)
    seq = model.seq_length
    _check_throughputs_agree(r, gpus)
    if (step := r.float("measured.step_time_s")) is not None:
        how = "measured step time"
        _check_measurements_agree(r, "measured.step_time_s", step, gbs * seq, gpus)
    elif (tps := r.float("measured.tokens_per_sec_per_gpu")) is not None:
        step, how = gbs * seq / (tps * gpus), "global batch·seq / (tokens/s per GPU · GPUs)"
    elif (tflops := r.float("measured.tflops_per_gpu")) is not None:
        if r.get("source_group") in MEGATRON_COUNTER_SOURCES:
            per_token, how = megatron_logged_flops_per_token(model), \
                "Megatron's causal FLOP count / published TFLOP/s (the counter the source logged)"
        else:
            per_token, how = model_flops_per_token(model), \
                "our model FLOPs / published TFLOP/s (FLOP conventions may differ)"
        step = gbs * seq * per_token / (tflops * 1e12 * gpus)
    else:
        return Skipped(rid, "no step time or throughput to compare")
    _check_below_peak(r, how, step, gbs * seq * model_flops_per_token(model), system)
    return RefCase(rid, str(r.get("source_group") or rid.split("_")[0]), model, system, plan, job, step, how,
                   assumptions, fit=fits_hardware(framework, model) and zero < 3, framework=framework,
                   family=family_of(model.name))


def _hbm_gib(case: RefCase) -> tuple[float, float]:
    """(HBM the case's plan needs, HBM there is), GiB per GPU, under the memory model."""
    from planner.analytical import PlanArrays, estimate_many  # layer 2; only errata rows need it
    from planner.analytical.layer_kinds import dense_layer_spec
    P = PlanArrays.from_plans([case.plan], case.model.layers, dense_layer_spec(case.model))
    r = estimate_many(case.model, case.system, case.job, P)
    return float(r["hbm_bytes"][0]) / 2**30, float(r["hbm_capacity_bytes"][0]) / 2**30


def _with_erratum(rec: dict, published: RefCase) -> RefCase:
    """The case of a record with an erratum (planner/reference_errata.py): the published reading
    while it fits HBM, else the corrected record's, with the figures that decided it."""
    erratum = ERRATA[published.id]
    need, have = _hbm_gib(published)
    if need <= have:
        published.assumptions.append(f"erratum not applied: the published {erratum.published} fits "
                                     f"({need:.0f} of {have:.0f} GiB)")
        return published
    fixed = _case_fsdp(_Record(corrected_record(rec, erratum)))
    if isinstance(fixed, RefCase):
        fixed.assumptions.append(f"{erratum.used}, not the published {erratum.published}, which needs "
                                 f"{need:.0f} GiB of {have:.0f} GiB HBM ({erratum.evidence})")
    return fixed


def _parsed_reference(path: Path):
    """The file's YAML, parsed once per process per content (the three packaged files are 1 MB of
    YAML, read by every `validate` and every gated plan); each caller gets its own copy, since the
    record readers fill in defaults."""
    return pickle.loads(_pickled_reference(path.read_text()))


@functools.lru_cache(maxsize=8)
def _pickled_reference(text: str) -> bytes:
    return pickle.dumps(safe_load_packaged(text))


def load_records(path: Path) -> tuple[list[dict], bool]:
    """Records of one reference file, and whether it uses the FSDP/MoE schema."""
    if path.is_symlink() and not path.exists():  # dangling, or a loop of links: there, but no file
        raise SpecError(f"reference: {path} is a symbolic link that leads to no file")
    if not path.is_file():
        raise SpecError(f"reference: {path} not found (pass --reference PATH to a measured_runs-style YAML)")
    try:
        data = _parsed_reference(path)
    except yaml.YAMLError:
        raise SpecError(f"reference {path}: malformed YAML") from None
    except ValueError as err:  # an integer past Python's digit limit (the CLI's strict pre-read names its key)
        error = digit_limit_error(err, f"reference {path}")
        if error is None:
            raise
        raise error from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise SpecError(f"reference {path}: expected a mapping with a 'records' list")
    version = data.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version < SCHEMA_VERSION:
        raise SpecError(f"reference {path}: schema_version: expected an integer >= {SCHEMA_VERSION}, got {version!r}")
    records = data["records"]
    # one schema per file: the FSDP/MoE schema's records name their sharding degree
    # (parallel.fsdp_or_zero3_degree); a file that mixes the two would read the others wrongly
    fsdp = [isinstance(r, dict) and isinstance(r.get("parallel"), dict) and "fsdp_or_zero3_degree" in r["parallel"]
            for r in records]
    if any(fsdp) and not all(fsdp):
        first = next(i for i, f in enumerate(fsdp, 1) if not f)
        rid = records[first - 1].get("id") if isinstance(records[first - 1], dict) else None
        raise SpecError(f"reference {path}: record {first} ({rid}) has no parallel.fsdp_or_zero3_degree while "
                        "others do: the FSDP/MoE schema (fsdp_moe_runs.yaml) and the Megatron one "
                        "(measured_runs.yaml, bridge_runs.yaml) cannot share a file; put each in its own")
    return records, any(fsdp)


@functools.lru_cache(maxsize=1)
def packaged_digests() -> frozenset[str]:
    """SHA-256 of the packaged reference files: a copy of one elsewhere is still the fitted data."""
    return frozenset(hashlib.sha256(p.read_bytes()).hexdigest() for p in DEFAULT_REFERENCES)


def load_reference(paths: Path | str | list | tuple | None = None) -> tuple[list[RefCase], list[Skipped]]:
    """Cases and skipped records of one file or several (default: the three packaged files)."""
    if paths is None:
        paths = DEFAULT_REFERENCES
    if isinstance(paths, (str, Path)):
        paths = [paths]
    cases, skipped = [], []
    seen_files: dict[Path, Path] = {}  # resolved -> as given
    seen_ids: dict[str, Path] = {}  # record id -> the file it came from
    for path in paths:
        path = Path(path)
        if path.is_file():
            if (first := seen_files.setdefault(path.resolve(), path)) is not path:
                also = f" (also as {first})" if str(first) != str(path) else ""
                raise SpecError(f"reference {path}: the same file is given twice{also}; pass each file once")
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            file_cases, file_skipped = _load_file(str(path), str(path.resolve()), digest)
            if digest not in packaged_digests():  # bench/calibrate.py fits the packaged rows only
                file_cases = [replace(c, fit=False) for c in file_cases]
        else:
            file_cases, file_skipped = _read_file(path)  # load_records says what is wrong with it
        for out in (*file_cases, *file_skipped):
            if (other := seen_ids.setdefault(out.id, path)) is not path:
                raise SpecError(f"reference {out.id}: id: duplicate, in {other} and in {path}; "
                                "every record needs its own id")
        cases += file_cases
        skipped += file_skipped
    return cases, skipped


def require_compared(cases: list[RefCase], skipped: list[Skipped]) -> None:
    """A one-line SpecError when the files gave no case to compare (every record skipped): the
    accuracy tables would otherwise print nan %. For `planner validate`, after load_reference."""
    if cases:
        return
    why = f"; the first, {skipped[0].id}: {skipped[0].reason}" if skipped else ""
    raise SpecError(f"reference: no record could be compared ({len(skipped)} read, all skipped{why})")


@lru_cache(maxsize=16)
def _load_file(path: str, resolved: str, digest: str) -> tuple[tuple[RefCase, ...], tuple[Skipped, ...]]:
    """One file's cases, read once per process while the file is unchanged (same path, same
    content: `digest` is its SHA-256): `planner validate`, the fit and the evidence table each load all 574 records, which
    costs seconds (YAML, a system preset per record). Keyed by the path as given too, so that
    messages name it as before. Callers get new lists of the same cases, which nothing modifies
    (variants are made with dataclasses.replace)."""
    return _read_file(Path(path))


def _read_file(path: Path) -> tuple[tuple[RefCase, ...], tuple[Skipped, ...]]:
    records, fsdp_schema = load_records(path)
    bridge = path.name.startswith("bridge")
    cases, skipped = [], []
    seen: dict[str, int] = {}  # record id -> its position in the file
    for i, rec in enumerate(records, 1):
        rec, launch_notes = completed_record(rec)
        r = _Record(rec, f" {path} record {i}")
        if (first := seen.setdefault(r.id, i)) != i:
            raise SpecError(f"reference {r.id}: id: duplicate in {path} (records {first} and {i}); "
                            "every record needs its own id")
        try:
            out = _case_fsdp(r) if fsdp_schema else _case_measured(r, bridge or r.id.startswith("bridge"))
        except SpecError as e:  # a check below the loader (a GPU without the record's dtype): name the record
            if str(e).startswith("reference "):
                raise
            raise SpecError(f"reference {r.id} ({path} record {i}): {e}") from None
        if fsdp_schema and isinstance(out, RefCase) and r.id in ERRATA:
            out = _with_erratum(rec, out)
        if isinstance(out, RefCase):
            out.assumptions.extend(launch_notes)
            if why := source_flagged_slow(out.id):
                out.assumptions.append(f"untuned software, fits nothing: {why}")
        (cases if isinstance(out, RefCase) else skipped).append(out)
    return tuple(cases), tuple(skipped)
