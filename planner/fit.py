"""Fit the few compute-efficiency parameters of each accelerator to the published runs, and the
leave-one-model-family-out (LOFO) check of how well that fit generalises.

Used by `bench/calibrate.py` (writes the presets) and `planner validate --lofo`. Minimises the mean
|log(predicted/measured)| step time over the fitted rows (reference.FITTED_FRAMEWORKS) of each fit
group by coordinate descent (golden-section per parameter). Only named physical parameters are
fitted, each within physical bounds (0 < efficiency <= 1); no per-row factors. A group with few
rows fits fewer parameters (one per FIT_ROWS_PER_PARAMETER rows, in PARAMETER_PRIORITY order);
the rest keep their preset values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner import processes
from planner.analytical import PlanArrays, data_parallel
from planner.analytical.layer_kinds import dense_layer_spec
from planner.analytical.memory import memory_breakdown
from planner.analytical import time as tm
from planner.analytical.time import step_time
from planner.reference import RefCase, untuned_software

BOUNDS = {"matmul_max": (0.3, 0.98), "matmul_max_fp8": (0.2, 0.98), "matmul_half_dim": (0.0, 1024.0),
          "attention_max": (0.15, 0.95), "hbm_efficiency": (0.2, 1.0), "layer_overhead_us": (0.0, 2000.0)}
PARAMETER_PRIORITY = ("matmul_max", "matmul_max_fp8", "hbm_efficiency", "layer_overhead_us",
                      "matmul_half_dim", "attention_max")
FIT_ROWS_PER_PARAMETER = 5
# Fit group (the accelerator whose rows are fitted) -> accelerators that take its parameters.
FIT_GROUPS = {
    "A100-SXM4-80GB": ("A100-SXM4-80GB", "A100-SXM4-40GB", "A800-SXM4-80GB"),
    "H100-SXM5-80GB": ("H100-SXM5-80GB", "H200-SXM-141GB", "GH200-96GB", "H100-GT-96GB", "H800-SXM5-80GB"),
    "B200-180GB": ("B200-180GB", "B300-288GB"),
    "GB200-186GB": ("GB200-186GB", "GB300-288GB"),
    "V100-SXM3-32GB": ("V100-SXM3-32GB",),
}
# Kernel-shape parameters measured on an H100 (planner/data/h100_*.csv, bench/kernel_fit.py): kept,
# not fitted, on H100 and on the Blackwell parts that have no kernel tables of their own.
MEASURED = ("matmul_half_dim", "matmul_half_dim_fp8", "attention_max", "attention_half_seq")
FIXED = {"A100-SXM4-80GB": (), "H100-SXM5-80GB": MEASURED, "B200-180GB": MEASURED, "GB200-186GB": MEASURED,
         "V100-SXM3-32GB": ()}
LOW_PRECISION = ("fp8", "fp8-cs", "fp8-block", "mxfp8", "nvfp4")
# Every fit starts here, not from the presets, so that re-running it reproduces the presets.
START = {"matmul_max": 0.7, "matmul_max_fp8": 0.6, "matmul_half_dim": 100.0, "attention_max": 0.5,
         "hbm_efficiency": 0.5, "layer_overhead_us": 100.0}
# Blackwell groups have few rows: what they do not fit themselves they take from the H100 fit.
# The V100 (four rows, the Megatron-LM README's 2020 tables) fits its GEMM ceiling and takes the
# rest from the A100 fit, the nearest part fitted on the same Megatron fp16 software.
INHERITS = {"B200-180GB": "H100-SXM5-80GB", "GB200-186GB": "H100-SXM5-80GB", "V100-SXM3-32GB": "A100-SXM4-80GB"}
# A group left with no fitted rows (its only family held out: every fitted A100 row is GPT) must
# not fall back on its preset, which those rows fitted: it takes the whole H100 efficiency set
# (measured kernel shapes and fitted ceilings), the efficiencies being fractions of each GPU's own
# peaks. The Blackwell groups already get that through INHERITS.
WHEN_EMPTY = {"A100-SXM4-80GB": "H100-SXM5-80GB"}
PRESET_OF_GROUP = {"H100-SXM5-80GB": "h100-sxm5-80gb"}


def group_of(accelerator_name: str) -> str | None:
    return next((g for g, members in FIT_GROUPS.items() if accelerator_name in members), None)


@dataclass
class Prepared:
    """A case with what does not depend on efficiency precomputed (plan columns, memory)."""

    case: RefCase
    P: PlanArrays
    mem: dict
    group: str | None

    def predict_s(self, params: dict | None = None) -> float:
        system = self.case.system
        if params:
            acc = system.accelerator
            acc = acc.model_copy(update={"efficiency": acc.efficiency.model_copy(update=params)})
            system = system.model_copy(update={"accelerator": acc})
        return float(step_time(self.case.model, system, self.case.job, self.P, self.mem)["step_time_s"][0])


def prepare(cases: list[RefCase]) -> list[Prepared]:
    out = []
    for c in cases:
        P = PlanArrays.from_plans([c.plan], c.model.layers, dense_layer_spec(c.model))
        out.append(Prepared(c, P, memory_breakdown(c.model, c.system, c.job, P), group_of(c.system.accelerator.name)))
    return out


def _score(rows: list[Prepared], params: dict) -> float:
    return float(np.mean([abs(math.log(p.predict_s(params) / p.case.measured_step_s)) for p in rows]))


class Batched:
    """`rows` grouped by (model, system, job): each group's step times come from ONE vectorised
    step_time call (the fit scores every row thousands of times; one call per row was most of its
    time). The predictions are the rows' own, element for element, and `score` averages them in
    the rows' order, so it equals `_score`."""

    def __init__(self, rows: list[Prepared]):
        self.rows = rows
        # predictions by parameters: the coordinate sweeps ask for some parameter sets again (a
        # group fitting one parameter repeats its first sweep's golden-section points exactly),
        # ~7 % of the predictions of bench/calibrate.py's fit
        self._predicted: dict[tuple, list[float]] = {}
        by_key: dict[tuple, list[int]] = {}
        for i, p in enumerate(rows):
            c = p.case
            # step_time and memory_breakdown read a row's global batch from its plan columns and
            # never the GPU count (a rule: estimate.rule_violations), so rows that differ only
            # there share a call (H100: 127 -> 52 calls per score)
            system = c.system.model_copy(update={"num_gpus": 0})
            job = c.job.model_copy(update={"global_batch": None, "max_global_batch": 0})
            by_key.setdefault((c.model.model_dump_json(), system.model_dump_json(), job.model_dump_json()),
                              []).append(i)
        self.groups = []
        for index in by_key.values():
            c = rows[index[0]].case
            P = PlanArrays.from_plans([rows[i].case.plan for i in index], c.model.layers, dense_layer_spec(c.model))
            self.groups.append((index, c, P, memory_breakdown(c.model, c.system, c.job, P)))

    def predict_s(self, params: dict | None = None) -> list[float]:
        key = tuple(sorted((params or {}).items()))
        if key not in self._predicted:
            self._predicted[key] = self._predict_s(params)
        return list(self._predicted[key])

    def _predict_s(self, params: dict | None) -> list[float]:
        out = [0.0] * len(self.rows)
        for index, c, P, mem in self.groups:
            system = c.system
            if params:
                acc = system.accelerator
                acc = acc.model_copy(update={"efficiency": acc.efficiency.model_copy(update=params)})
                system = system.model_copy(update={"accelerator": acc})
            for i, t in zip(index, step_time(c.model, system, c.job, P, mem)["step_time_s"]):
                out[i] = float(t)
        return out

    def score(self, params: dict) -> float:
        return float(np.mean([abs(math.log(t / p.case.measured_step_s))
                              for t, p in zip(self.predict_s(params), self.rows)]))


def _golden(f, lo, hi, x0, iters, f_x0=None):
    """Golden-section minimum of f on [lo, hi] after `iters` steps, or x0 if that is no better.
    `f_x0`: f(x0) when the caller already has it (coordinate descent: the current score)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    best, fbest = (c, fc) if fc < fd else (d, fd)
    f0 = f(x0) if f_x0 is None else f_x0
    return (best, fbest) if fbest < f0 else (x0, f0)


def parameters_to_fit(group: str, rows: list[Prepared]) -> list[str]:
    dtypes = {p.case.job.dtype for p in rows}
    usable = [n for n in PARAMETER_PRIORITY if n not in FIXED.get(group, ())
              and (n != "matmul_max_fp8" or dtypes & set(LOW_PRECISION))
              and (n != "matmul_max" or dtypes - set(LOW_PRECISION))]
    return usable[:max(1, len(rows) // FIT_ROWS_PER_PARAMETER)]


def fit_group(group: str, rows: list[Prepared], inherited: dict | None = None, sweeps: int = 2,
              iters: int = 11) -> tuple[dict, float]:
    """Parameters of one group (`inherited` ones it does not fit, plus the fitted ones) and the
    mean |log error| reached. Two sweeps stop short of the optimum on purpose: HBM efficiency and
    per-layer overhead trade along a ridge the rows do not pin, and the converged fit predicts the
    held-out runs worse (docs/design.md, the fit)."""
    inherited = dict(inherited or {})
    if not rows:
        return inherited, float("nan")
    names = parameters_to_fit(group, rows)
    params = {**inherited, **{n: START[n] for n in names}}
    batched = Batched(rows)
    score = batched.score(params)
    for _ in range(sweeps):
        for n in names:
            params[n], score = _golden(lambda x, n=n: batched.score({**params, n: x}), *BOUNDS[n], params[n], iters,
                                       score)
    return params, score


def fit_order() -> list[str]:
    """FIT_GROUPS, each after the groups it takes parameters from (INHERITS, WHEN_EMPTY): H100,
    then A100 (empty without GPT: H100's), B200, GB200, then the V100 (A100's)."""
    def depth(group: str) -> int:
        parents = [p for p in (INHERITS.get(group), WHEN_EMPTY.get(group)) if p]
        return 1 + max(map(depth, parents)) if parents else 0
    return sorted(FIT_GROUPS, key=depth)


def fit_groups(prepared: list[Prepared], keep=lambda case: True) -> dict[str, tuple[dict, float, int]]:
    """Per group: (parameters, mean |log error|, rows) fitted on the fitted rows that `keep` accepts;
    groups in INHERITS start from their parent's fitted parameters (which is fitted first)."""
    out: dict[str, tuple[dict, float, int]] = {}
    for group in fit_order():
        rows = [p for p in prepared if p.group == group and p.case.fit and keep(p.case)]
        parent = INHERITS.get(group)
        inherited = {k: v for k, v in out[parent][0].items() if k not in FIXED.get(group, ())} if parent else {}
        if not rows and group in WHEN_EMPTY:
            inherited = _whole_efficiency(WHEN_EMPTY[group], out[WHEN_EMPTY[group]][0])
        params, score = fit_group(group, rows, inherited)
        out[group] = (params, score, len(rows))
    return {g: out[g] for g in FIT_GROUPS}


def _whole_efficiency(group: str, fitted: dict) -> dict:
    """`group`'s fitted parameters and its preset's measured kernel shapes (FIXED): the whole
    Transformer Engine efficiency set (the PyTorch-stack fields are fitted apart, on top)."""
    from hardware.load import load_accelerator
    preset = load_accelerator(PRESET_OF_GROUP[group]).efficiency
    return {**{n: getattr(preset, n) for n in FIXED[group] if getattr(preset, n) is not None}, **fitted}


def fit_all(prepared: list[Prepared]) -> dict[str, dict]:
    """Parameters per fit group from all its fitted rows (what bench/calibrate.py writes)."""
    return {g: v[0] for g, v in fit_groups(prepared).items()}


# --- the PyTorch-native stacks (JobSpec.kernels != "te": torchtitan, llm-foundry) ---------------
# Their rows are not in the hardware fit above (their kernels are not Transformer Engine's). What
# they add is fitted on their own rows, after the hardware fit and on top of it, in this order:
#   attention_max_fa2: FlashAttention-2's in-training ceiling, per fit group (A100; the H100
#     family, its rows taken at the rated clock), on the rows that run FlashAttention-2. As for
#     GEMMs, the lone kernel measured on an H100 (0.286, planner/data/h100_attention.csv) is the
#     reference and the curve's half-efficiency sequence (1110, measured) is kept; the ceiling a
#     training step reaches is fitted end to end.
#   attention_max_triton: MPT's Triton FlashAttention (llm-foundry attn_impl "triton"), on the
#     rows that ran it (only MPT rows did: independent of the FlashAttention-2 fit).
#   A kernel ceiling is fitted only where its rows can tell it apart: at least
#   FIT_ROWS_PER_PARAMETER rows at two or more sequence lengths (at one length the attention
#   share does not vary, and the ceiling would absorb whatever else those rows miss). Otherwise
#   it takes the other flash kernel's in-training ceiling where that one was fitted (an
#   unmeasured flash kernel is taken to be as good as the measured one; on an A100 the two
#   differ by the published FA2_OVER_TRITON_A100, whichever of them was fitted), else the lone kernel.
#   sustained_clock_fraction on the Grand Teton H100: the clock its 500 W power limit sustains,
#     on its rows, with the H100 ceilings fitted before (one coordinate sweep).
# (field, accelerators whose rows fit it, accelerators that take it, bounds, fallback candidates
# in order (a field fitted in this fit for the same accelerators, or a number), companions,
# which rows fit it.)
FA2_MEASURED_H100 = 0.286
FA2_HALF_SEQ_MEASURED = 1110.0
_H100_FAMILY = ("H100-SXM5-80GB", "H200-SXM-141GB", "GH200-96GB", "H100-GT-96GB", "H800-SXM5-80GB")
_A100S = ("A100-SXM4-80GB", "A100-SXM4-40GB", "A800-SXM4-80GB")
ATTENTION_CEILINGS = ("attention_max_fa2", "attention_max_triton")


def _runs_fa2(case: RefCase) -> bool:
    return not case.job.triton_flash_attention


def _runs_triton(case: RefCase) -> bool:
    return case.job.triton_flash_attention


def _any_row(case: RefCase) -> bool:
    return True


# How much faster FlashAttention-2 trains than the Triton FlashAttention on an A100 (Dao 2023,
# arXiv:2307.08691 §4.1: 1.3-1.5x in the forward pass, about 2x in the backward): 1.4 and 2 weighted
# by the passes' FLOPs (backward 2.5x forward, ibid. §4.1), (1.4 + 2.5 * 2) / 3.5 = 1.83. What an
# A100 without Triton rows of its own takes for the Triton ceiling, from its FA2 one (on an H100
# FA2 is not Hopper-tuned either, and no such figure is published: there the two are taken equal).
FA2_OVER_TRITON_A100 = (1.4 + 2.5 * 2.0) / 3.5
_FA2_HALF = {"attention_half_seq_fa2": FA2_HALF_SEQ_MEASURED}
# FlashAttention-2's own best on an A100, forward+backward: up to 73 % of peak forward and 63 %
# backward (Dao 2023, arXiv:2307.08691 §1 and §4), the passes weighted by their FLOPs 1 : 2.5
# (ibid. §4.1): 3.5 / (1/0.73 + 2.5/0.63) = 0.656. An in-training ceiling cannot exceed the lone
# kernel's. (The paper's 225 TFLOP/s, 72 %, is end-to-end model FLOPs utilisation, not attention.)
FA2_BEST_A100 = 3.5 / (1 / 0.73 + 2.5 / 0.63)
TORCH_STACK_FITS = (
    ("attention_max_fa2", _A100S, _A100S, (0.05, FA2_BEST_A100),
     (("attention_max_triton", FA2_OVER_TRITON_A100), FA2_MEASURED_H100), _FA2_HALF, _runs_fa2),
    ("attention_max_fa2", _H100_FAMILY, _H100_FAMILY, (0.05, 0.9), ("attention_max_triton", FA2_MEASURED_H100),
     {**_FA2_HALF, "sustained_clock_fraction": 1.0}, _runs_fa2),
    ("attention_max_triton", _A100S, _A100S, (0.05, 0.9),
     (("attention_max_fa2", 1 / FA2_OVER_TRITON_A100), FA2_MEASURED_H100 / FA2_OVER_TRITON_A100), {}, _runs_triton),
    ("attention_max_triton", _H100_FAMILY, _H100_FAMILY, (0.05, 0.9), ("attention_max_fa2", FA2_MEASURED_H100),
     {}, _runs_triton),
    ("sustained_clock_fraction", ("H100-GT-96GB",), ("H100-GT-96GB",), (0.5, 1.0), (1.0,), {}, _any_row),
    # the A100's torch-era GEMM ceiling (ComputeEfficiency.matmul_max_torch), on all its torch rows,
    # last: the kernel ceilings above are fitted first without it, then everything once more with it
    ("matmul_max_torch", _A100S, _A100S, (0.5, 0.98), (None,), {}, _any_row),
)
# Coordinate sweeps: two over the whole bounds, then narrower ones (TORCH_STACK_NARROW either side
# of the last value, TORCH_STACK_NARROW_ITERS golden steps) until no field moves by more than
# TORCH_STACK_TOL. The A100's FlashAttention-2 and GEMM ceilings trade against each other on the
# A100 torch rows: two sweeps had left the first at its bound (0.72); converged it is 0.56.
TORCH_STACK_SWEEPS = 2
TORCH_STACK_MAX_SWEEPS = 10
TORCH_STACK_NARROW, TORCH_STACK_NARROW_ITERS, TORCH_STACK_TOL = 0.1, 8, 0.01


def identifiable(name: str, rows: list[Prepared]) -> bool:
    """Whether `rows` can fit `name` (see above): enough rows, and for a kernel ceiling more than
    one sequence length among them."""
    if len(rows) < FIT_ROWS_PER_PARAMETER:
        return False
    return name not in ATTENTION_CEILINGS or len({p.case.model.seq_length for p in rows}) >= 2


def torch_stack_row(case: RefCase) -> bool:
    return case.job.kernels != "te"


def fit_torch_stack(prepared: list[Prepared], hardware: dict[str, dict], keep=lambda case: True,
                    iters: int = 14) -> dict[str, dict]:
    """Accelerator name -> {field: value} of TORCH_STACK_FITS, fitted (mean |log error|, golden
    section) on the torch-stack rows that `keep` accepts, each accelerator's rows predicted with
    `hardware` (fit group -> parameters). A field its rows cannot identify takes its first
    fallback candidate that this fit did identify (the two flash kernels' rows are disjoint, so
    one may fall back on the other fitted after it), else the number."""
    rows = [_torch_stack_fit_rows(prepared, keep, fitted_on, row_kind)
            for _, fitted_on, _, _, _, _, row_kind in TORCH_STACK_FITS]
    # a preset's torch GEMM ceiling must not leak into the first sweep
    out: dict[str, dict] = {acc: {"matmul_max_torch": None} for acc in _A100S}
    for _ in range(TORCH_STACK_SWEEPS):
        out = _fit_torch_stack_sweep(rows, hardware, iters, out)
    # then narrower sweeps from where the last one ended, each over the accelerators whose fields
    # still moved (the A100's and the H100 family's rows share no field), until none does
    moving = {_A100S, _H100_FAMILY}
    before = None
    for _ in range(TORCH_STACK_MAX_SWEEPS - TORCH_STACK_SWEEPS):
        if before is not None:
            moving = {accs for accs in moving if any(
                abs((out[acc].get(k) or 0.0) - (before.get(acc, {}).get(k) or 0.0)) > TORCH_STACK_TOL
                for acc in accs for k in out.get(acc, {}))}
        if not moving:
            break
        before = out
        out = _fit_torch_stack_sweep(rows, hardware, TORCH_STACK_NARROW_ITERS, out, only=moving)
    return out


def _torch_stack_fit_rows(prepared: list[Prepared], keep, fitted_on, row_kind) -> tuple[list[Prepared], list]:
    """The rows that fit one TORCH_STACK_FITS field, and the same rows batched for scoring: those
    that share their parameters (fit group, accelerator) in one Batched each, built once per fit."""
    rows = [p for p in prepared if torch_stack_row(p.case) and keep(p.case) and row_kind(p.case)
            and p.case.system.accelerator.name in fitted_on and not untuned_software(p.case.id, p.case.source)]
    parts: dict[tuple, list[Prepared]] = {}
    for p in rows:
        parts.setdefault((p.group, p.case.system.accelerator.name), []).append(p)
    return rows, [(group, acc, Batched(part)) for (group, acc), part in parts.items()]


def _fit_torch_stack_sweep(field_rows: list[tuple[list[Prepared], list]], hardware: dict[str, dict], iters: int,
                           out: dict[str, dict], only: set | None = None) -> dict[str, dict]:
    """One coordinate sweep of TORCH_STACK_FITS (each field on its `field_rows`) from `out` (the
    previous sweep's values); with `only` (of _A100S, _H100_FAMILY: their rows share no field), a
    narrow sweep: only the fields of those accelerators, each searched within TORCH_STACK_NARROW of
    its previous value, from it."""
    out = {acc: dict(v) for acc, v in out.items()}
    fitted: set[tuple[str, str]] = set()
    pending = []  # (field, accelerators, candidates) still on a number
    for (name, _, applies_to, bounds, fallback, companions, _), (rows, batches) in zip(TORCH_STACK_FITS, field_rows):
        if only is not None and not any(set(applies_to) <= set(family) for family in only):
            continue
        if name not in ATTENTION_CEILINGS:  # resolve the ceilings before what depends on them
            for field, accs, candidates in pending:
                _resolve(out, fitted, field, accs, candidates)
            pending = []
        start = _resolve(out, fitted, None, applies_to, fallback)
        value = start
        if start is None:  # matmul_max_torch unset: search from the Megatron rows' ceiling
            start = hardware.get(group_of(applies_to[0]), {}).get("matmul_max", sum(bounds) / 2)
        if only is not None and out.get(applies_to[0], {}).get(name) is not None:
            start = out[applies_to[0]][name]
            bounds = (max(bounds[0], start - TORCH_STACK_NARROW), min(bounds[1], start + TORCH_STACK_NARROW))
        if identifiable(name, rows):
            def score(x, batches=batches, name=name, companions=companions):
                logs = [abs(math.log(t / p.case.measured_step_s)) for group, acc, b in batches
                        for t, p in zip(b.predict_s({**hardware.get(group, {}), **out.get(acc, {}), **companions, name: x}),
                                        b.rows)]
                return float(np.mean(logs))
            value = _golden(score, *bounds, start, iters)[0]
            fitted.add((applies_to[0], name))
        else:
            pending.append((name, applies_to, fallback))
        for acc in applies_to:
            out.setdefault(acc, {}).update({**companions, name: value})
    for field, accs, candidates in pending:
        _resolve(out, fitted, field, accs, candidates)
    return out


def _resolve(out: dict, fitted: set, field: str | None, accs, candidates) -> float:
    """The first candidate that is a number or a field fitted for `accs` in this fit; with `field`,
    also set it on `accs`."""
    def field_and_scale(c):
        return (c, 1.0) if isinstance(c, str) else c if isinstance(c, tuple) else (None, c)
    value = next(out[accs[0]][name] * scale if name else scale
                 for name, scale in map(field_and_scale, candidates) if name is None or (accs[0], name) in fitted)
    if field is not None:
        for acc in accs:
            out[acc][field] = value
    return value


def with_torch_stack(p: Prepared, hardware: dict[str, dict], torch_stack: dict[str, dict]) -> dict | None:
    """The efficiency parameters a prepared case is predicted with (None: its preset's)."""
    params = {**(hardware.get(p.group) or {}), **torch_stack.get(p.case.system.accelerator.name, {})}
    return params or None


# --- sharded data parallel (planner/analytical/data_parallel.py) -------------------------------
# Fitted on the sharded rows of each implementation, after the hardware and torch-stack fits and
# on top of them: FSDP_COMPUTE_CONTENTION on the dense PyTorch FSDP rows (torchtitan, llm-foundry;
# ZeRO-3 and FSDP's ZeRO-2, the same per-layer schedule), MEGATRON_FSDP_COMPUTE_CONTENTION on the
# dense Megatron-FSDP rows; the two DeepSpeed ZeRO-3 parameters jointly on the DeepSpeed rows (the
# only ones: Narayanan et al. SC'21 Table 2, all GPT): 2 parameters on 6 rows, below the hardware
# fit's one per FIT_ROWS_PER_PARAMETER, accepted because the rows fall in two regimes that each
# set one of them (the 4 gather-bound rows at mb 1-2 the bandwidth, the 2 at mb 4 the
# contention). With fewer than FIT_ROWS_PER_PARAMETER rows of an implementation (Megatron-FSDP
# without Llama-3, DeepSpeed without GPT) nothing is known of it: the NCCL ring (efficiency 1)
# with the PyTorch FSDP contention just fitted.
def torch_fsdp_row(case: RefCase) -> bool:
    return case.plan.zero_stage >= 2 and case.plan.dp_impl == "torch-fsdp2" and case.model.moe is None


def megatron_fsdp_row(case: RefCase) -> bool:
    return case.plan.zero_stage == 3 and case.plan.dp_impl == "megatron" and case.model.moe is None


def deepspeed_row(case: RefCase) -> bool:
    return case.plan.zero_stage == 3 and case.plan.dp_impl == "deepspeed"


# (parameters fitted together, rows, bounds of each)
SHARDED_DP_FITS = (
    (("FSDP_COMPUTE_CONTENTION",), torch_fsdp_row, ((0.0, 1.0),)),
    (("MEGATRON_FSDP_COMPUTE_CONTENTION",), megatron_fsdp_row, ((0.0, 1.0),)),
    (("DEEPSPEED_ZERO3_BW_EFFICIENCY", "DEEPSPEED_ZERO3_COMPUTE_CONTENTION"), deepspeed_row, ((0.03, 1.0), (0.0, 1.0))),
)


def _family_weighted_log_error(rows: list[Prepared], params_of) -> float:
    """Mean |log(pred/measured)| with every model family weighted equally (216 llm-foundry MPT
    rows must not outvote the other families' FSDP rows)."""
    fams: dict[str, list[float]] = {}
    for p in rows:
        fams.setdefault(p.case.family, []).append(abs(math.log(p.predict_s(params_of(p)) / p.case.measured_step_s)))
    return float(np.mean([np.mean(v) for v in fams.values()]))


def fit_sharded_dp(prepared: list[Prepared], params_of=lambda p: None, keep=lambda case: True,
                   sweeps: int = 2, iters: int = 12) -> dict[str, float]:
    """data_parallel.FITTED_PARAMETERS fitted on the sharded-DP rows that `keep` accepts, each row
    predicted with efficiency parameters `params_of(row)` (None: its preset's)."""
    out: dict[str, float] = {}
    for names, row_kind, bounds in SHARDED_DP_FITS:
        rows = [p for p in prepared if row_kind(p.case) and keep(p.case)
                and not untuned_software(p.case.id, p.case.source)]
        if len(rows) < FIT_ROWS_PER_PARAMETER:
            # nothing measured of this implementation: the NCCL ring, no contention beyond the
            # NCCL FSDP rows' (none if those are missing too)
            known = out.get("FSDP_COMPUTE_CONTENTION", 0.0)
            unknown = {"FSDP_COMPUTE_CONTENTION": 0.0, "MEGATRON_FSDP_COMPUTE_CONTENTION": known,
                       "DEEPSPEED_ZERO3_BW_EFFICIENCY": 1.0, "DEEPSPEED_ZERO3_COMPUTE_CONTENTION": known}
            out.update({n: unknown[n] for n in names})
            continue
        out.update(_fit_constants(rows, params_of, data_parallel.parameters, dict(zip(names, bounds)),
                                  {n: getattr(data_parallel, n) for n in names},
                                  sweeps if len(names) > 1 else 1, iters, held=dict(out)))
    return out


def _fit_constants(rows: list[Prepared], params_of, override, bounds: dict[str, tuple[float, float]],
                   start: dict[str, float], sweeps: int, iters: int, held: dict | None = None) -> dict[str, float]:
    """Module constants (set through the context `override(**values)`, with `held` ones fixed)
    fitted on `rows` by coordinate descent, golden section per constant within its bounds,
    families weighted equally; the sharded-DP and the MoE fits."""
    values = dict(start)
    for _ in range(sweeps):
        for name, (lo, hi) in bounds.items():
            def score(x, name=name):
                with override(**{**(held or {}), **values, name: x}):
                    return _family_weighted_log_error(rows, params_of)
            values[name] = _golden(score, lo, hi, values[name], iters)[0]
    return values


# MoE constants (planner.analytical.time.MOE_FITTED_PARAMETERS) and their physical bounds. In
# sample they come from bench/fsdp_moe_eval.py's grid; LOFO refits them without the family. The
# host time per expert GEMM (time.EXPERT_GEMM_HOST_US) is a kernel measurement, not refitted.
MOE_FITS = (("A2A_OVERLAP_EFFICIENCY", (0.0, 1.0)),)


def tuned_moe_row(case: RefCase) -> bool:
    """A MoE run of tuned software: every MoE row but untuned ones (planner.reference.untuned_software)."""
    return case.model.moe is not None and not untuned_software(case.id, case.source)


def fit_moe(prepared: list[Prepared], params_of=lambda p: None, keep=lambda case: True,
            sweeps: int = 2, iters: int = 10) -> dict[str, float]:
    """MOE_FITS on the tuned MoE rows that `keep` accepts (coordinate descent, golden section,
    families weighted equally), each row with efficiency parameters `params_of(row)`."""
    rows = [p for p in prepared if tuned_moe_row(p.case) and keep(p.case)]
    values = {name: getattr(tm, name) for name, _ in MOE_FITS}
    if len(rows) < FIT_ROWS_PER_PARAMETER * len(MOE_FITS):
        return values
    return _fit_constants(rows, params_of, tm.moe_parameters, dict(MOE_FITS), values, sweeps, iters)


def lofo_predictions(prepared: list[Prepared], full_fit: dict[str, dict],
                     families: set[str] | None = None, workers: int = 1) -> dict[str, float]:
    """Case id -> step time predicted with parameters fitted without the case's model family:
    the hardware fit (a family with no fitted rows keeps `full_fit`), then on top of it the
    torch-stack parameters, then the sharded-DP and the MoE parameters, each refitted without the
    family.
    `families`: only the cases of these (each family is one refit; the others' rows are still
    fitted on). `workers`: processes refitting families side by side; each family's refit is
    independent of the others', so the result does not depend on it."""
    names = sorted({p.case.family for p in prepared} & (families or {p.case.family for p in prepared}))
    if workers > 1 and len(names) > 1:
        pool = processes.worker_pool(min(workers, len(names)), _lofo_worker_start, (prepared, full_fit))
        try:
            parts = list(pool.map(_lofo_worker_family, names))
        except BaseException:
            processes.end_now(pool)  # Ctrl-C: do not wait for the other families' refits (minutes)
            raise
        pool.shutdown(wait=True)
    else:
        parts = [_lofo_family(prepared, full_fit, family) for family in names]
    return {case_id: t for part in parts for case_id, t in part.items()}


_LOFO_INPUTS: tuple | None = None  # (prepared, full_fit) in a lofo_predictions worker process


def _lofo_worker_start(prepared: list[Prepared], full_fit: dict[str, dict]) -> None:
    global _LOFO_INPUTS
    _LOFO_INPUTS = (prepared, full_fit)


def _lofo_worker_family(family: str) -> dict[str, float]:
    return _lofo_family(*_LOFO_INPUTS, family)


def _own_torch_gemm_ceiling(borrowed: dict, torch_fit: dict) -> dict:
    """A group left without Megatron rows (WHEN_EMPTY: the A100 without GPT) keeps the borrowed
    H100 set but for the GEMM ceiling, which its own PyTorch-stack rows measure where they fitted
    one (`matmul_max_torch`): cuBLAS runs both stacks' GEMMs, and the same GPU's rows say more
    about it than another GPU's."""
    own = torch_fit.get("matmul_max_torch")
    return borrowed if own is None else {**borrowed, "matmul_max": own}


def _lofo_family(prepared: list[Prepared], full_fit: dict[str, dict], family: str) -> dict[str, float]:
    """lofo_predictions for one family's cases."""
    members = [p for p in prepared if p.case.family == family]
    emptied = []
    if any(p.case.fit for p in members):
        groups = fit_groups(prepared, lambda c: c.family != family)
        params = {g: v[0] for g, v in groups.items()}
        emptied = [g for g, v in groups.items() if v[2] == 0 and g in WHEN_EMPTY]
    else:
        params = full_fit
    torch_stack = {}
    if emptied or any(torch_stack_row(p.case) for p in members):
        torch_stack = fit_torch_stack(prepared, params, lambda c: c.family != family)
    for group in emptied:
        params[group] = _own_torch_gemm_ceiling(params[group], torch_stack.get(group, {}))
        # its heirs (the V100 takes the A100's set) inherit the set as mended, not as borrowed
        for heir in (g for g in fit_order() if INHERITS.get(g) == group):
            rows = [p for p in prepared if p.group == heir and p.case.fit and p.case.family != family]
            inherited = {k: v for k, v in params[group].items() if k not in FIXED.get(heir, ())}
            params[heir] = fit_group(heir, rows, inherited)[0]

    def params_of(p):
        return with_torch_stack(p, params, torch_stack) if torch_stack_row(p.case) else (params.get(p.group) or None)
    dp_params = {}
    if any(p.case.plan.zero_stage == 3 for p in members):
        dp_params = fit_sharded_dp(prepared, params_of, lambda c: c.family != family)
    moe_params = {}
    if any(p.case.model.moe is not None for p in members):
        moe_params = fit_moe(prepared, params_of, lambda c: c.family != family)
    with data_parallel.parameters(**dp_params), tm.moe_parameters(**moe_params):
        return {p.case.id: p.predict_s(params_of(p)) for p in members}
