"""The search space: legal values of every knob, and the rows (plans) they combine into.

A *row* is one complete plan, held as numpy columns named like `PlanArrays` fields. The space is
the set of rows that pass every STRUCTURAL rule (divisibility, GPU count, batch, compatibility
and, with `job.framework == 'megatron'`, Megatron-LM expressibility) and the user's pins; memory
fit is NOT a space rule: it is decided by the exact model (`constraints.cost_table`) and enforced
as a named constraint in the CP-SAT model (`constraints.encode`).

Domains (see `knob_domains`)
  tp           divisors of heads that divide hidden, ffn (and the expert ffn), with query groups
               a multiple or a divisor of tp, and tp <= GPUs
  pp           divisors of layers and (uneven layouts, issue 8) every other pp <= layers that
               divides the GPUs (any pp <= layers with `allow_idle_gpus`: divisors of layers and
               powers of two); a pp that does not divide the layers runs the balanced split of
               `planner.pipeline_layout.balanced_layout`, which the per-stage solver
               (`constraints.stages`) then refines for the plans it reports
  cp           1 and the divisors c <= 8 of seq/2 (so that seq % 2c == 0); beyond 8, powers of two
               while each CP rank keeps >= 8K tokens (long-context runs: Llama 3 405B cp 16 at
               128K, NeMo cp 32 at 1M); a pin may ask for any divisor of seq/2
  ep           divisors of the number of experts (MoE only; else 1)
  etp          expert tensor parallel (MoE only; else = tp): tp (Megatron's default) or 1 (the folded
               layout published MoE recipes use); a pin may name any divisor of the expert ffn
               within the NVLink domain. ep and etp need only world % (etp·ep·pp) == 0
               (Megatron MoE parallel folding, megatron/core/parallel_state.py)
  vpp          1..8 with pp*vpp <= layers (vpp > 1 needs pp > 1), and above 8 where every virtual
               stage holds the same whole number of layers (deep_vpp_ok: 80 layers at pp 2 take
               vpp 10, 20, 40); a pin may ask for any vpp with pp*vpp <= layers (e.g. 12)
  dp           GPUs / (tp*pp*cp); with `allow_idle_gpus` any dp that leaves GPUs idle but keeps
               the used count a whole number of nodes (or at most one node), limited to the
               largest dp, powers of two and divisors of the fixed batch
  micro_batch  1, 2, 3, 4, 6, 8, 12, 16 with micro_batch*dp <= batch (non-powers of two: issue 8),
               fixed or free batch alike; a fixed batch also every divisor of it up to 16
               (`micro_batch_domain`: 5 and 10 at batch 40 or 1280)
  global_batch job.global_batch if fixed; otherwise every multiple of micro_batch*dp up to
               job.max_global_batch ("free batch"; the objective is then time per token)
  recompute    none, selective, full (all layers of a stage)
  recompute_modules  selective recompute's module set (bit mask, planner.plan.RECOMPUTE_MODULE_BITS;
               0 with none/full): the sets NVIDIA's recipes run, parts of them and their moe_act sets with
               the shared experts and dense layers' mlp added (`selective_module_sets`) whose every
               module acts on the model (`planner.plan.applicable_recompute_modules`: moe_act / moe
               on MoE models, mla_up_proj with MLA, layernorm with MLA or MoE, mlp with dense
               layers) and free memory (not core_attn under fused attention: it frees nothing and only
               costs time); for Megatron under FP8 delayed scaling none with moe_act or layernorm
  zero_stage   0 (plain DP), 1 (distributed optimizer), 2 (+ sharded gradients: Megatron-FSDP
               optim_grads, costed with a reduce-scatter every microbatch), 3 (FSDP)
  offload_*    {0, 0.5, 1} of weights / activations / optimizer state, only when the system has an
               offload tier and job.allow_offload (Megatron: no weight offload; activation
               offload only with pp == 1 and no recompute; optimizer offload only with ZeRO-1)
  sequence_parallel on/off (on only with tp > 1); tp_comm_overlap on/off (on only with SP);
  dp_comm_overlap on/off; moe_a2a_overlap on/off (MoE only; Megatron's rules: ep > 1, pp = 1 or
               vpp > 1, no full recompute and no selective `moe` recompute, at most one MTP layer;
               it costs one more in-flight layer, so it is a real choice where memory binds).

Free batch ("batch <= max"): every multiple of micro_batch*dp up to the cap is in the space (the
brute-force oracle enumerates all of them, `expand_batches`), and the objective is time per
TOKEN, step_time / (global_batch·seq); with a fixed (or pinned) batch it is the step time. How
the solver side avoids tabulating every batch without losing the optimum is explained in
`constraints.cost_table`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from hardware.errors import SpecError
from hardware.spec import SystemSpec
from planner.model import ModelSpec
from planner.plan import (KNOBS, RECOMPUTE_CODES, RECOMPUTE_MODULE_BITS, JobSpec, applicable_recompute_modules,
                          parse_recompute_modules,
                          recompute_modules_from_mask, recompute_modules_mask)
from planner.analytical.estimate import check_hbm_reserve  # the rule estimate() applies too; re-exported
from planner.analytical.layer_kinds import lead_layer_model, lead_layers
from planner.analytical.memory import selective_freed_coefficients
from planner.megatron.expressible import (FP8_DELAYED_NO_RECOMPUTE, a2a_overlap_model, graph_job_refusals,
                                          graph_option_refusals, grouped_gemm, megatron_offload_fraction)

CP_CAP = 8
# Finer context splits are searched only for long sequences: the published long-context layouts
# keep 8K (Llama 3 405B, arXiv:2407.21783 Table 4: cp 16 at 131072) to 32K tokens per CP rank (NeMo
# 24.03 long-sequence table: cp 8/16/32 at 256K/512K/1M); at 4K-8K sequences cp > 8 only adds rows.
CP_LONG_MIN_TOKENS_PER_RANK = 8192
VPP_CAP = 8
# Not only powers of two (issue 8), with a fixed or a free batch alike: a free batch searched on
# powers of two alone (1, 2, 4, 8, 16) missed plans an independent brute force found 0.5 % faster
# per token (2026-11-29 audit: Qwen3-14B on 8 H100, batch <= 3072: tp 2 dp 4 mb 3, where mb 4 does
# not fit and mb 2 runs smaller GEMMs; Qwen3-8B on 8 H100, mb 3)
MICRO_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16)


def micro_batch_domain(job: JobSpec) -> tuple[int, ...]:
    """MICRO_BATCHES up to the batch; a fixed batch also every divisor of it up to the grid's
    largest: the sequences per replica may be 5 or 10 (batch 40 or 80 on 8 GPUs), and one
    microbatch of 5 ran 9 % faster than five of 1 where an independent brute force tried it
    (2026-11-29 audit: a 2-layer Mixtral on 8 B200, batch 40). Rows of other micro-batches than
    the divisors are left out by the batch rule anyway, so only these add layouts."""
    cap = job.global_batch or job.max_global_batch
    grid = {m for m in MICRO_BATCHES if m <= cap}
    if job.global_batch:
        grid |= {m for m in range(1, MICRO_BATCHES[-1] + 1) if job.global_batch % m == 0}
    return tuple(sorted(grid))
ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_GRID = (0.0, 0.5, 1.0)
RECOMPUTE_NAMES = {code: name for name, code in RECOMPUTE_CODES.items()}

# The parallel layout: two rows with the same values here are the same "mapping of the model
# onto the GPUs"; the search returns the K best DISTINCT layouts, each with its best batch and
# memory options.
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch")
# Memory / overlap options (one table, crossed with the layouts).
OPTION_KEYS = ("recompute", "recompute_modules", "sequence_parallel", "tp_comm_overlap", "dp_comm_overlap",
               "zero_stage", "offload_weights", "offload_activations", "offload_optimizer", "moe_a2a_overlap")
ROW_KEYS = LAYOUT_KEYS + ("global_batch",) + OPTION_KEYS


def deep_vpp_ok(layers: int, pp: int, vpp: int) -> bool:
    """vpp above VPP_CAP is searched only where every virtual stage holds the same whole number of
    layers (Megatron's split without a layout string; a pin may ask for any vpp). NVIDIA's recipes
    run such deep interleavings (Qwen3-30B-A3B pp 2 vpp 24, Qwen3-235B-A22B pp 4 vpp 12), and an
    independent brute force over every vpp found them up to 2.8 % faster than vpp <= 8 (Llama-3
    70B on 64 H100, batch 128: pp 2 vpp 22 against the capped search's pp 4 vpp 8, 2026-11-27);
    every vpp up to layers/pp would cost 3-7x the search time for 0.1 % more."""
    return vpp <= VPP_CAP or layers % (pp * vpp) == 0


# Selective-recompute module sets searched: Megatron's default and sets NVIDIA's MoE recipes use
# (core_attn; layernorm+moe_act (Megatron MoE ModelZoo Qwen3); layernorm+mla_up_proj+moe_act
# (DeepSeek-V3 recipes); mlp; moe), and the parts of those recipe sets that an independent
# brute force over every module subset found faster where memory allows less recompute (moe_act;
# layernorm; mla_up_proj+moe_act: 0.2-1.4 % on Qwen3-30B-A3B, Mixtral, DeepSeek-V2-Lite, gpt-oss-20b,
# 2026-11-27). Each set is one more option row per layout, so the list stays short (not all 127
# subsets of DeepSeek-V3's modules); other sets, e.g. the Bridge DeepSeek-V3 recipes'
# [mla_up_proj, mlp], are estimated and emitted but not searched.
SELECTIVE_MODULE_SETS: tuple[tuple[str, ...], ...] = (
    ("core_attn",), ("layernorm", "moe_act"), ("layernorm", "mla_up_proj", "moe_act"), ("mlp",), ("moe",),
    ("moe_act",), ("layernorm",), ("mla_up_proj", "moe_act"),
    # the Bridge DeepSeek-V3 recipes' [mla_up_proj]: 0.5 % faster than any searched set on
    # DeepSeek-V2-Lite's ep 4 layouts on 16 H100 (independent brute force, 2026-11-29 audit), and
    # DeepSeek-V3 on 1,024 H100, batch 1536, runs 9 % faster with it (tp4 pp4 cp2 ep32 vpp8 mb3:
    # 5.73 s against 6.30 s), a plan Megatron's own validator accepts
    ("mla_up_proj",))
# Each moe_act set is also searched with every one of these that acts on the model added (one
# more set per moe_act set, not one per subset): recomputing the routed experts' activation while
# keeping the shared experts' (a dense FFN beside them, Megatron recompute module shared_experts)
# and the leading dense layers' MLP activations left the most memory-freeing selective sets out
# of the space. An independent brute force over every subset (2026-11-29 audit) found
# layernorm+mla_up_proj+mlp+moe_act+shared_experts 2.3-2.6 % faster than every searched plan on
# DeepSeek-V2-Lite (8 and 16 B200: ep 1, mb 16, ZeRO-3 instead of ep 4, mb 8). One set per subset
# of the two (three per moe_act set) doubled DeepSeek-V3's search on 1,024 H100 for nothing the
# brute force found.
MOE_ACT_EXTRA_MODULES = ("mlp", "shared_experts")


def selective_module_sets(model: ModelSpec) -> tuple[tuple[str, ...], ...]:
    """SELECTIVE_MODULE_SETS, and each moe_act set with every MOE_ACT_EXTRA_MODULES module that
    acts on `model` added (none where none does)."""
    why = applicable_recompute_modules(model)
    extras = {m for m in MOE_ACT_EXTRA_MODULES if why[m] is None}
    if not extras:
        return SELECTIVE_MODULE_SETS
    return SELECTIVE_MODULE_SETS + tuple(tuple(sorted(set(base) | extras))
                                         for base in SELECTIVE_MODULE_SETS if "moe_act" in base)


def recompute_module_masks(model: ModelSpec, job: JobSpec, system: SystemSpec) -> tuple[int, ...]:
    """Bit masks of the `selective_module_sets` that apply to `model` (and, for Megatron, to the
    precision: FP8 delayed scaling recomputes neither moe_act nor layernorm; and to the GPU: moe_act
    needs the grouped expert GEMM, Ampere and later) and free memory: a
    set that stores what no recompute stores (core_attn under fused attention: its checkpoint keeps
    Q, K, V and the projection keeps the output) only adds time, so it is not searched (it can
    still be estimated and emitted)."""
    why = applicable_recompute_modules(model)
    masks = []
    for modules in selective_module_sets(model):
        if any(why[name] is not None for name in modules):
            continue
        if job.framework == "megatron" and job.dtype == "fp8" and set(modules) & set(FP8_DELAYED_NO_RECOMPUTE):
            continue
        if job.framework == "megatron" and "moe_act" in modules and not grouped_gemm(system):
            continue
        mask = recompute_modules_mask(modules)
        # what it frees in the repeated layer or, for a MoE model, in its leading dense layers
        kinds = [model] + ([lead_layer_model(model)] if lead_layers(model) else [])
        frees = any(x[0] > 0 for kind in kinds
                    for x in selective_freed_coefficients(kind, np.asarray([mask], dtype=np.float64)))
        drops_scores = "core_attn" in modules and not job.flash_attention
        if frees or drops_scores:
            masks.append(mask)
    return tuple(masks)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


@dataclass(frozen=True)
class Space:
    """Knob domains for one (model, system, job), pins applied."""

    model: ModelSpec
    system: SystemSpec
    job: JobSpec
    domains: dict[str, tuple]
    free_batch: bool
    notes: list[str] = field(default_factory=list)

    @property
    def batch_cap(self) -> int:
        return space_batch_cap(self.job)


def tp_splits(model: ModelSpec, tp: int) -> bool:
    """Whether tensor parallelism `tp` splits the model: its heads, widths (expert and Mamba ones
    included: Megatron-Core MambaMixer asserts its heads and B/C groups divide) and query groups
    (a multiple or a divisor of tp)."""
    widths = [model.heads, model.hidden, model.ffn_hidden] + ([model.expert_ffn_hidden] if model.moe else [])
    widths += [model.mamba.num_heads, model.mamba.groups] if model.mamba else []
    g = model.kv_groups
    return all(w % tp == 0 for w in widths) and (g % tp == 0 or tp % g == 0)


def cp_splits(model: ModelSpec, cp: int) -> bool:
    """Load-balanced causal CP cuts the sequence into 2·cp chunks (Megatron-Core / TE
    context parallel): seq % (2·cp) == 0."""
    return cp == 1 or model.seq_length % (2 * cp) == 0


def knob_domains(model: ModelSpec, system: SystemSpec, job: JobSpec) -> dict[str, tuple]:
    """Legal values of each knob BEFORE pins (dp and global_batch are listed but derived per row)."""
    n = system.num_gpus

    def fills(size: int) -> bool:  # a factor of tp·pp·dp·cp must divide the GPUs unless some may idle
        return job.allow_idle_gpus or n % size == 0

    tp = [d for d in divisors(model.heads) if tp_splits(model, d) and d <= n
          and (system.inside_nvlink(d) or not job.tp_within_nvlink) and fills(d)]
    uneven = {d for d in range(1, model.layers + 1) if n % d == 0} if not job.allow_idle_gpus \
        else set(_pow2_upto(model.layers))
    pp = sorted(d for d in set(divisors(model.layers)) | uneven if d <= n and fills(d))
    cp = [1] + [c for c in range(2, CP_CAP + 1) if cp_splits(model, c) and c <= n and fills(c)]
    c = 2 * CP_CAP
    while cp_splits(model, c) and model.seq_length // c >= CP_LONG_MIN_TOKENS_PER_RANK and c <= n:
        cp += [c] if fills(c) else []
        c *= 2
    if model.hybrid_pattern:
        cp = [1]  # the Mamba blocks' context parallelism (an all-to-all to head-parallel) is not costed
    ep = divisors(model.moe.num_experts) if model.moe else [1]
    # (etp divides the GPUs it folds over: world % (etp·ep·pp) == 0)
    etp = [d for d in divisors(model.expert_ffn_hidden) if d <= n and (job.allow_idle_gpus or n % d == 0)
           and (system.inside_nvlink(d) or not job.tp_within_nvlink)] if model.moe else tp
    if model.moe and model.biases and job.framework == "megatron":
        etp = [1]  # Megatron: "Bias in Moe is only supported when ETP==1" (planner.megatron.expressible)
    # beyond VPP_CAP, the interleavings whose virtual stages hold equal whole layers at some pp
    vpp = [v for v in range(1, max(VPP_CAP, model.layers) + 1)
           if v <= VPP_CAP or any(deep_vpp_ok(model.layers, p, v) for p in pp if p * v <= model.layers)]
    mega = job.framework == "megatron"
    offload = system.offload is not None and job.allow_offload
    off = OFFLOAD_GRID if offload else (0.0,)
    cap = job.global_batch or job.max_global_batch
    return {
        "tp": tuple(tp), "pp": tuple(pp), "cp": tuple(cp), "ep": tuple(ep), "etp": tuple(etp), "vpp": tuple(vpp),
        "dp": tuple(range(1, n + 1)) if job.allow_idle_gpus else tuple(sorted({n // (a * b * c)
              for a in tp for b in pp for c in cp if n % (a * b * c) == 0})),
        "micro_batch": micro_batch_domain(job),
        "global_batch": (job.global_batch,) if job.global_batch else tuple(range(1, cap + 1)),
        "recompute": tuple(RECOMPUTE_CODES.values()),
        "recompute_modules": (0,) + recompute_module_masks(model, job, system),
        "sequence_parallel": (0, 1), "tp_comm_overlap": (0, 1), "dp_comm_overlap": (0, 1),
        "zero_stage": ZERO_STAGES,
        "offload_weights": (0.0,) if mega else off,
        # Megatron offloads whole layers: the fractions it runs (0.5 of 61 layers is 31, 0.508);
        # its hybrid (Mamba) stack offloads none (planner.megatron.expressible)
        "offload_activations": (0.0,) if mega and model.hybrid_pattern else
        tuple(sorted({megatron_offload_fraction(f, model.layers) for f in off}))
        if mega and model.layers > 1 else off,
        "offload_optimizer": off,
        "moe_a2a_overlap": (0, 1) if a2a_overlap_model(model) else (0,),
    }


# Rules between knobs that leave combinations out of the space, each with the knobs it reads,
# whether a combination breaks it (given the job), whether it is Megatron's alone, the knob it
# blames when pins break it, and what it says (planner/megatron/expressible.py). `options` applies
# those among the option knobs; the one on pp is a layout-class rule (`options_allowed`).
# `megatron_pin_conflicts` names those a job's pins break.
KNOB_RULES = (
    (("offload_optimizer", "zero_stage"), lambda o, job: o["offload_optimizer"] > 0 and o["zero_stage"] != 1,
     True, "zero_stage",
     "optimizer offload (--optimizer-cpu-offload) runs only with the distributed optimizer (zero_stage 1)"),
    (("offload_activations", "recompute"), lambda o, job: o["offload_activations"] > 0 and o["recompute"] != 0,
     True, "recompute", "activation offload (--cpu-offloading) runs only without recompute"),
    (("offload_activations", "pp"), lambda o, job: o["offload_activations"] > 0 and o["pp"] > 1,
     True, "pp", "activation offload (--cpu-offloading) runs only without a pipeline"),
    (("offload_activations", "moe_a2a_overlap"),
     lambda o, job: o["offload_activations"] > 0 and o["moe_a2a_overlap"] > 0, True, "moe_a2a_overlap",
     "activation offload (--cpu-offloading) runs only outside the expert all-to-all overlap's combined 1F1B schedule"),
    (("moe_a2a_overlap", "recompute"),
     lambda o, job: o["moe_a2a_overlap"] > 0 and o["recompute"] == RECOMPUTE_CODES["full"], False, "recompute",
     "the expert all-to-all overlap (--overlap-moe-expert-parallel-comm) runs only without full recompute"),
    (("zero_stage",), lambda o, job: job.adam_moments == "bf16" and o["zero_stage"] != 1, True, "zero_stage",
     "bf16 Adam moments (the precision-aware optimizer) need the distributed optimizer (zero_stage 1)"),
    (("offload_optimizer",), lambda o, job: job.adam_moments == "bf16" and o["offload_optimizer"] > 0, True,
     "offload_optimizer", "bf16 Adam moments are kept only on the GPU: Megatron's optimizer CPU offload "
     "(--optimizer-cpu-offload) runs fp32 moments"),
    # Megatron-FSDP always overlaps its reduce-scatter and gather (expressible.not_expressible, which
    # refuses the exposed costing only with DP traffic, dp·cp > 1; left out at any dp here)
    (("zero_stage", "dp_comm_overlap"), lambda o, job: o["zero_stage"] >= 2 and not o["dp_comm_overlap"], True,
     "zero_stage", "sharded data parallelism (zero_stage 2, 3: Megatron-FSDP) always overlaps its DP communication "
     "(dp_comm_overlap)"),
)


def megatron_pin_conflicts(job: JobSpec) -> list[str]:
    """The KNOB_RULES that the job's pins break together, in words: why pins that each pass leave
    no option set under Megatron."""
    if job.framework != "megatron":
        return []
    pin = {k: _pin_value(k, v) for k, v in job.pins.items()}
    shown = lambda knob: RECOMPUTE_NAMES[int(pin[knob])] if knob == "recompute" else f"{pin[knob]:g}"  # noqa: E731
    return [f"{words}, and {blamed} {shown(blamed)} is pinned" for knobs, broken, _, blamed, words in KNOB_RULES
            if all(k in pin for k in knobs) and broken(pin, job)]


def _pin_value(knob: str, value) -> float:
    """A pin as the numeric code rows use."""
    if knob == "recompute_modules" and not isinstance(value, (int, float)):  # names: their bit mask
        try:
            return float(recompute_modules_mask(parse_recompute_modules(value)))
        except ValueError as exc:
            raise SpecError(f"pin recompute_modules: {exc}") from None
    if knob == "recompute":
        if value not in RECOMPUTE_CODES:
            raise SpecError(f"pin recompute: unknown {value!r}; allowed: {', '.join(RECOMPUTE_CODES)}")
        return RECOMPUTE_CODES[value]
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        low = value.lower()
        if low in ("true", "on", "yes"):
            return 1.0
        if low in ("false", "off", "no"):
            return 0.0
        try:
            return float(value)
        except ValueError:
            raise SpecError(f"pin {knob}: {value!r} is not a number") from None
    return float(value)


def breaks_pins(plan, pins: dict) -> bool:
    """Whether a finished plan (a published run's, say) breaks one of a job's pins, each pin read
    as build_space reads it; etp is the expert TP the plan runs (tp when it sets none)."""
    def value(knob):
        if knob == "etp":
            return plan.expert_tp
        if knob == "recompute_modules":  # the rows' code: 0 unless selective
            return recompute_modules_mask(plan.recompute_modules) if plan.recompute == "selective" else 0
        return getattr(plan, knob)
    return any(_pin_value(knob, value(knob)) != _pin_value(knob, raw) for knob, raw in pins.items())


def space_batch_cap(job: JobSpec) -> int:
    """The largest global batch the job allows: its fixed batch, else the free batch's cap."""
    return job.global_batch or job.max_global_batch


def _fmt(knob: str, values) -> str:
    if knob == "recompute_modules":
        return "; ".join(",".join(recompute_modules_from_mask(int(v))) or "(not selective)" for v in values)
    if knob == "recompute":
        names = {c: n for n, c in RECOMPUTE_CODES.items()}
        return ", ".join(names[int(v)] for v in values)
    if knob in ("sequence_parallel", "tp_comm_overlap", "dp_comm_overlap", "moe_a2a_overlap"):
        return ", ".join("true" if v else "false" for v in values)
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def build_space(model: ModelSpec, system: SystemSpec, job: JobSpec) -> Space:
    """Domains with pins applied; a pin outside its domain is a SpecError naming the allowed values."""
    check_hbm_reserve(job, system)
    if job.framework == "megatron" and graph_job_refusals(model, job):
        raise SpecError(graph_job_refusals(model, job)[0])
    domains = knob_domains(model, system, job)
    notes = []
    for knob, raw in job.pins.items():
        if knob not in KNOBS:
            raise SpecError(f"pin {knob}: unknown knob; allowed: {', '.join(KNOBS)}")
        value = _pin_value(knob, raw)
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw < 0:
            raise SpecError(f"pin {knob}: must not be negative, got {raw}")
        allowed = domains[knob]
        if knob == "global_batch":
            if job.global_batch and value != job.global_batch:
                raise SpecError(f"pin global_batch: {raw} differs from the job's global batch "
                                f"({job.global_batch})")
            if not (1 <= value <= job.max_global_batch) or value != int(value):
                raise SpecError(f"pin global_batch: {raw} must be a whole number in 1..{job.max_global_batch}")
            domains[knob] = (int(value),)
            continue
        if knob == "vpp" and value == int(value) and 1 <= value <= model.layers:
            domains[knob] = (int(value),)  # any interleaving depth may be pinned (e.g. 12)
            continue
        if knob == "vpp" and value == int(value) and value > model.layers:
            raise SpecError(f"pin vpp: {raw} exceeds the {model.layers} layers (every virtual stage needs a "
                            "layer: pp·vpp <= layers)")
        if knob == "recompute_modules":  # any module set that acts on this model may be pinned
            why = applicable_recompute_modules(model)
            for name in recompute_modules_from_mask(int(value)):
                if why[name] is not None:
                    raise SpecError(f"pin recompute_modules: {name} {why[name]}; allowed for {model.name}: "
                                    f"{', '.join(n for n, w in why.items() if w is None)}")
            domains[knob] = (int(value),)
            continue
        if knob == "micro_batch" and value == int(value) and 1 <= value <= space_batch_cap(job):
            domains[knob] = (int(value),)  # any micro-batch the batch allows (the search grid is a few)
            continue
        if knob == "micro_batch" and value == int(value) and value > space_batch_cap(job):
            raise SpecError(f"pin micro_batch: {raw} exceeds the global batch"
                            f"{'' if job.global_batch else ' cap'} ({space_batch_cap(job)})")
        if knob == "cp" and value != 1 and model.hybrid_pattern:
            raise SpecError(f"pin cp: {raw} is not a legal value here; allowed: 1 (a hybrid Mamba stack's "
                            "context parallelism is not costed)")
        if knob == "cp" and value == int(value) and 1 <= value <= system.num_gpus and cp_splits(model, int(value)) \
                and (job.allow_idle_gpus or system.num_gpus % value == 0):
            domains[knob] = (int(value),)  # any legal context split may be pinned (e.g. 16 at 128K)
            continue
        if knob == "cp" and value == int(value) and value > 1 and not cp_splits(model, int(value)):
            raise SpecError(f"pin cp: {raw} needs the sequence ({model.seq_length}) to be a multiple of 2·cp "
                            f"({2 * int(value)}), the load-balanced causal chunks")
        if knob.startswith("offload_") and 0.0 < value <= 1.0 and tuple(allowed) != (0.0,):
            # any fraction may be pinned (the search's grid is a few); Megatron offloads whole
            # layers of activations, so a pin there is costed as the layers it launches
            mega_layers = knob == "offload_activations" and job.framework == "megatron" and model.layers > 1
            domains[knob] = (megatron_offload_fraction(value, model.layers) if mega_layers else value,)
            continue
        if knob == "dp" and not any(v == value for v in allowed):
            raise SpecError(f"pin dp: {raw} leaves no tp·pp·cp that fills {system.num_gpus} GPUs; "
                            f"allowed: {_fmt(knob, allowed)}")
        if not any(v == value for v in allowed):
            hint = ""
            if knob == "tp" and value >= 1 and job.tp_within_nvlink and not system.inside_nvlink(value):  # tp 0: d % 0
                beyond = value > system.nvlink_domain_gpus
                # a tp within the domain's size is named only where the node rule alone refuses it
                if beyond or value in knob_domains(model, system, job.model_copy(update={"tp_within_nvlink": False}))["tp"]:
                    hint = (f" (tensor parallelism stays inside the {system.nvlink_domain_gpus}-GPU NVLink domain"
                            + ("" if beyond else
                               f", whose node each tp group must divide: tp {value:g} puts a group across two nodes")
                            + "; --tp-across-nodes lifts that)")
            elif knob.startswith("offload_") and tuple(allowed) == (0.0,):
                hint = (f" ({system.name} has no offload memory tier)" if system.offload is None else
                        " (--no-offload was given)" if not job.allow_offload else
                        " (Megatron-LM cannot offload weights; --framework any costs it)")
            elif knob == "moe_a2a_overlap" and model.moe is None:
                hint = f" (the expert all-to-all overlap applies to MoE models only; {model.name} is dense)"
            shown = str(raw).lower() if isinstance(raw, bool) else raw
            raise SpecError(f"pin {knob}: {shown} is not a legal value here; allowed: {_fmt(knob, allowed)}{hint}")
        domains[knob] = tuple(v for v in allowed if v == value)
    if "global_batch" in job.pins and not job.global_batch:
        notes.append("global batch pinned: the objective is step time")
    free = job.global_batch is None and "global_batch" not in job.pins
    return Space(model=model, system=system, job=job, domains=domains, free_batch=free, notes=notes)


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------

def _dp_choices(space: Space, used: int, any_batch: bool = False) -> list[int]:
    """The dp counts tried beside tp·pp·cp = `used`; with idle GPUs the whole-node ones among the
    full count, the powers of two and the batch's divisors (`any_batch`: every count)."""
    n, job, system = space.system.num_gpus, space.job, space.system
    if not job.allow_idle_gpus:
        return [n // used] if n % used == 0 else []
    top = n // used
    if top < 1:
        return []
    cands = {top} | set(_pow2_upto(top))
    if any_batch:
        cands = set(range(1, top + 1))
    elif job.global_batch:
        cands |= {d for d in divisors(job.global_batch) if d <= top}
    out = []
    for d in sorted(cands):
        gpus = d * used
        if job.framework == "megatron" and gpus > system.gpus_per_node and gpus % system.gpus_per_node:
            continue  # torchrun needs whole nodes
        out.append(d)
    return out


def _batchless_layouts(space: Space, dp_choices):
    """(tp, pp, cp, dp, ep, etp, vpp) passing every structural rule but the batch's: the GPU count
    (`dp_choices(tp·pp·cp)` within the dp domain), Megatron's expert folding and the pipeline's."""
    d, model = space.domains, space.model
    experts = model.moe.num_experts if model.moe else 1
    vpp_pinned = "vpp" in space.job.pins  # a pin may ask for any interleaving depth (deep_vpp_ok)
    for tp, pp, cp in itertools.product(d["tp"], d["pp"], d["cp"]):
        used = tp * pp * cp
        for dp in dp_choices(used):
            if dp not in d["dp"]:
                continue
            world = used * dp
            etps = [x for x in d["etp"] if x in (1, tp) or len(d["etp"]) == 1] if model.moe else [tp]
            for ep, etp in itertools.product(d["ep"], etps):
                if experts % ep or world % (etp * ep * pp):
                    continue
                for vpp in d["vpp"]:
                    if model.layers < pp * vpp or (vpp > 1 and pp == 1) or not (
                            vpp_pinned or deep_vpp_ok(model.layers, pp, vpp)):
                        continue
                    yield tp, pp, cp, dp, ep, etp, vpp


def layout_exists_at_some_batch(space: Space) -> bool:
    """Whether a layout passes the structural rules other than the batch's (for `check`: is the
    batch what binds?). Every dp of the domain counts, with idle GPUs too (the batch decides which
    of them `layouts` tries)."""
    return next(_batchless_layouts(space, lambda used: _dp_choices(space, used, any_batch=True)), None) is not None


def layouts(space: Space) -> dict[str, np.ndarray]:
    """All (tp, pp, dp, cp, ep, vpp, micro_batch) that pass the structural rules, each with its
    legal microbatch counts m = global_batch / (micro_batch·dp) as range(m_min, m_max + 1, m_step):
    fixed batch: the one m; free batch: 1..M (M = cap // (micro_batch·dp)), or the multiples of
    pp up to M with interleaving (Megatron needs m >= pp; a fixed batch whose m pp does not divide
    runs with a microbatch group N != pp, pipeline_layout.vp_microbatch_group; a free batch keeps to
    multiples of pp, which it can always pick, for search speed)."""
    d = space.domains
    names = LAYOUT_KEYS + ("m_min", "m_max", "m_step")
    cols: dict[str, list] = {k: [] for k in names}
    gb_dom = sorted(d["global_batch"])
    for tp, pp, cp, dp, ep, etp, vpp in _batchless_layouts(space, lambda used: _dp_choices(space, used)):
        for mb in d["micro_batch"]:
            unit = mb * dp
            if space.free_batch:
                top = space.batch_cap // unit
                if vpp > 1:
                    top = (top // pp) * pp
                    spans = [(pp, top, pp)] if top >= pp else []
                else:
                    spans = [(1, top, 1)] if top >= 1 else []
            else:
                spans = [(g // unit, g // unit, 1) for g in gb_dom if g % unit == 0
                         and (vpp == 1 or g // unit >= pp)]
            for span in spans:
                for k, v in zip(names, (tp, pp, dp, cp, ep, etp, vpp, mb) + span):
                    cols[k].append(v)
    return {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}


def expand_batches(lay: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every legal microbatch count of every layout as its own row (the oracle's full space);
    adds `m` and `global_batch`."""
    counts = ((lay["m_max"] - lay["m_min"]) // lay["m_step"] + 1).astype(np.int64)
    idx = np.repeat(np.arange(len(counts)), counts)
    start = np.cumsum(counts) - counts
    offset = np.arange(len(idx)) - np.repeat(start, counts)
    out = {k: v[idx] for k, v in lay.items()}
    out["m"] = out["m_min"] + offset * out["m_step"]
    out["global_batch"] = out["m"] * out["micro_batch"] * out["dp"]
    return out


def at_batch(lay: dict[str, np.ndarray], m: np.ndarray) -> dict[str, np.ndarray]:
    out = dict(lay)
    out["m"] = np.asarray(m, dtype=np.float64)
    out["global_batch"] = out["m"] * lay["micro_batch"] * lay["dp"]
    return out


def options(space: Space) -> dict[str, np.ndarray]:
    """All memory/overlap option combinations that pass the layout-independent rules."""
    d = space.domains
    mega = space.job.framework == "megatron"
    rows = []
    for combo in itertools.product(*(d[k] for k in OPTION_KEYS)):
        o = dict(zip(OPTION_KEYS, combo))
        if o["tp_comm_overlap"] and not o["sequence_parallel"]:
            continue
        if any((mega or not megatron_only) and all(k in o for k in knobs) and broken(o, space.job)
               for knobs, broken, megatron_only, _, _ in KNOB_RULES):
            continue
        if (o["recompute"] == RECOMPUTE_CODES["selective"]) != (o["recompute_modules"] > 0):
            continue  # a module set belongs to selective recompute, and selective has one
        if mega and o["moe_a2a_overlap"] and int(o["recompute_modules"]) & RECOMPUTE_MODULE_BITS["moe"]:
            continue  # Megatron: no 'moe' recompute with --overlap-moe-expert-parallel-comm
        if mega:
            if o["offload_weights"] > 0:
                continue
            if o["offload_activations"] > 0 and space.model.layers < 2:
                continue
            if space.job.cuda_graph_modules and graph_option_refusals(
                    RECOMPUTE_NAMES[int(o["recompute"])], recompute_modules_from_mask(int(o["recompute_modules"])),
                    o["offload_activations"], bool(o["moe_a2a_overlap"]), space.model, space.job,
                    int(o["zero_stage"])):
                continue  # per-layer CUDA graphs (expressible.py)
        rows.append(combo)
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, len(OPTION_KEYS))
    return {k: arr[:, i].copy() for i, k in enumerate(OPTION_KEYS)}


N_LAYOUT_CLASSES = 16
LAYOUT_CLASS_SP = 4  # the class bit: sequence parallelism allowed


def layout_class(lay: dict[str, np.ndarray], seq_length: int) -> np.ndarray:
    """What a layout allows of the options, as a class 0..15: bit 3 tp > 1 (Megatron's MoE layers
    then need SP), bit 2 sequence parallelism (and with it TP overlap): tp > 1 and each rank's
    seq/cp tokens split over tp (Megatron's SP scatter asserts it), bit 1 pp == 1 (Megatron
    activation offload), bit 0 the expert all-to-all overlap (Megatron: ep > 1 and, with
    pipelining, interleaving)."""
    a2a_ok = (lay["ep"] > 1) & ((lay["pp"] == 1) | (lay["vpp"] > 1))
    sp_ok = (lay["tp"] > 1) & (np.mod(seq_length, lay["tp"] * lay["cp"]) == 0)
    return ((lay["tp"] > 1).astype(int) * 8 + sp_ok.astype(int) * LAYOUT_CLASS_SP + (lay["pp"] == 1).astype(int) * 2
            + a2a_ok.astype(int))


def options_allowed(space: Space, opt: dict[str, np.ndarray], cls: int) -> np.ndarray:
    """Mask of the option rows a layout of class `cls` may take."""
    ok = np.ones(len(opt["recompute"]), dtype=bool)
    if not cls & LAYOUT_CLASS_SP:
        ok &= opt["sequence_parallel"] == 0
    if space.job.framework == "megatron" and space.model.moe is not None and cls & 8:
        # Megatron-core: "When using MoE and tensor parallelism, sequence parallelism must be used"
        # (expressible.py); where SP cannot split the sequence, no option is left
        ok &= opt["sequence_parallel"] == 1
    if space.job.framework == "megatron" and not cls & 2:
        ok &= opt["offload_activations"] == 0
    if not cls & 1:
        ok &= opt["moe_a2a_overlap"] == 0
    return ok


def pair_mask(space: Space, lay: dict[str, np.ndarray], opt: dict[str, np.ndarray]) -> np.ndarray:
    """(layouts × options) Booleans: which option rows go with which layout rows
    (`options_allowed` by `layout_class`)."""
    allowed = np.stack([options_allowed(space, opt, cls) for cls in range(N_LAYOUT_CLASSES)])
    # stored column by column (Fortran order): the search reads and writes such tables a set of
    # option columns at a time (constraints.cost_table._largest_batch_pass), ~30x faster so
    return np.take(allowed.T, layout_class(lay, space.model.seq_length), axis=1).T


def cross_index(space: Space, lay: dict[str, np.ndarray], opt: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The compatible (layout row, option row) pairs of `cross`, as two index arrays in its order
    (by layout row, then option row), without building any column: the search materialises
    only the pairs it keeps (`take_pairs`)."""
    L, O = np.nonzero(pair_mask(space, lay, opt))
    return L.astype(np.int64), O.astype(np.int64)


def take_pairs(lay: dict[str, np.ndarray], opt: dict[str, np.ndarray], L: np.ndarray,
               O: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of the pairs (L[i], O[i]): every layout column, every option column, `lay_row`."""
    rows = {k: v[L] for k, v in lay.items()}
    rows.update({k: opt[k][O] for k in OPTION_KEYS})
    rows["lay_row"] = L
    return rows


def cross(space: Space, lay: dict[str, np.ndarray], opt: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layouts × options, keeping only the compatible pairs (`pair_mask`). Every column of `lay` is carried along, and
    `lay_row` says which layout row each pair came from. Deterministic order (by layout row,
    then option row)."""
    L, O = cross_index(space, lay, opt)
    if not len(L):
        return {k: np.zeros(0) for k in list(lay) + list(OPTION_KEYS) + ["lay_row"]}
    return take_pairs(lay, opt, L, O)


def enumerate_rows(space: Space) -> dict[str, np.ndarray]:
    """The FULL space as rows (every legal batch): what the brute-force oracle evaluates."""
    return cross(space, expand_batches(layouts(space)), options(space))


__all__ = ["Space", "build_space", "knob_domains", "layouts", "options", "cross", "cross_index", "pair_mask", "take_pairs",
           "enumerate_rows", "layout_class", "options_allowed", "N_LAYOUT_CLASSES",
           "expand_batches", "at_batch", "check_hbm_reserve", "layout_exists_at_some_batch", "divisors", "LAYOUT_KEYS", "OPTION_KEYS", "ROW_KEYS"]
