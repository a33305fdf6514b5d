"""Per-stage choices of one layout, decided by CP-SAT: layers per virtual stage and the
recompute count, under per-rank memory, minimising the pipeline's step time.

Why a solver here and not an enumeration: the layout-level knobs (tp, pp, dp, ...) have a few
thousand combinations, but the split of L layers over pp·vpp virtual stages has C(L−1, S−1)
(126 layers over 64 stages: ~3·10^36). The exact model is LINEAR in the per-rank counts, so
the problem is a small integer program:

  variables   n_s >= 1 layers of virtual stage s (s = chunk·pp + rank, Megatron's order),
              k   (full recompute) layers recomputed per virtual stage, Megatron's
                  --recompute-method block --recompute-num-layers k: stage s recomputes min(k, n_s)
  rank loads  N_r = Σ_{s ≡ r} n_s,  K_r = Σ_{s ≡ r} min(k, n_s)
  time        T_r = a·N_r + b·K_r + [r last]·h           (seconds per microbatch, from the model)
  memory      c_r + w_r·N_r + x_r·K_r <= HBM − reserve  (bytes, from the model, per rank)
  optimizer   P_r = p0_r + p1·N_r <= Pmax   (optimizer-state elements; the step waits for the largest)
  DP exposed  E = max_r E_r, the DP collectives the step leaves exposed
              (data_parallel.dp_comm_exposed_s): each rank's collectives G_r = g0_r + g1·N_r (its
              own bytes; a MoE model's expert bytes at the expert-DP group's rate, e0_r + e1·N_r)
              overlapped with its own microbatch window W_r = wf·N_r or wb·N_r + wbr·K_r,
              vpp·E_r = max(0, G_r − W_r, vpp·G_r − ((vpp−1)·pp + 1)·W_r) per collective
              (+ vpp·(m−1)·max(0, G_rs,r − W_r) under ZeRO-2)
  objective   m·T* + (Σ_r T_r − T*)/vpp + opt·Pmax + E, T* = max_r T_r; times vpp this is
              (m·vpp − 1)·T* + b·Σ K_r + vpp·opt·Pmax + vpp·E + const — linear.

Coefficients a, b, h, c_r, w_r, x_r, p0_r, p1 are read from the exact model itself
(`planner.analytical`) by costing probe ranks with 0 and 1 layer (recomputed or not), so the
solver and the model cannot drift. They are exact where memory is affine in the counts: no
ZeRO-3 (it gathers params/N per layer) and no offload (it keeps 2/N of a layer); those rows keep
the default balanced split. The DP exposure is the exact model's (but for the expert-DP group's
ring latency on a rank without MoE layers, a few µs); FSDP2's per-layer ZeRO-2, a MoE model's parameter
all-gather where elements gather different bytes (FP8 weights beside 16-bit embeddings) leave
it out; the per-block problems (hybrid stacks, interleaved MoE) price it per block kind. Every answer is re-scored by
the exact model and kept only when it is no worse than the default split.

Two layer kinds (a MoE model's first D layers are dense, DeepSeek-V3: 3): they fill the first
virtual stages in order, so stage s holds d_s = min(n_s, max(0, D − Σ_{s'<s} n_s')) of them
(only s < D can), recomputed first (block recompute takes a stage's first layers):
dk_s = min(k, d_s). Every coefficient above has a leading-dense twin (a_d, b_d, w_d, x_d, p1_d),
and each rank's time, memory and parameters count its D_r = Σ d_s and DK_r = Σ dk_s at those.

Symmetry breaking (exact, not a heuristic): chunks of one rank are interchangeable in the model,
so they are ordered n_{r,0} >= n_{r,1} >= ...; two middle ranks differ only in in-flight
microbatches (fewer on later ranks), so giving the later rank the larger load never hurts: middle
ranks' loads are non-decreasing. With leading dense layers both hold only where no stage involved
can hold one (stage index >= D: its prefix is >= D). One worker, fixed seed: deterministic.

A MoE model whose dense layers interleave with its MoE layers (Llama 4 Maverick: every second
layer MoE) is posed the same way as a hybrid stack below, with two block kinds, dense and MoE, at
the dense and MoE layers' probed coefficients (`_interleaved_fields`).

A pipelined hybrid stack (Nemotron-H / Nemotron 3: one Mamba, attention, MLP or MoE block per
layer) has as many layer kinds as block kinds, in the pattern's order: stage s spans layers
[e_s, e_{s+1}) and holds C_X(e_{s+1}) − C_X(e_s) blocks of kind X (C_X: the pattern's running
count of X, a table read with AddElement), recomputing C_X(e_s + ks_s) − C_X(e_s); every kind has
its own a, b, w, x, p1 probed from the model with one block of that kind per rank. No symmetry
holds there. The optimizer term counts optimizer-state elements (a MoE block's experts are
sharded over expert-data-parallel, its other weights over data-parallel), in units whose step
costs one time unit.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace

import numpy as np
from ortools.sat.python import cp_model

from constraints.solve import SEED, WORKERS, interruptible_solve, new_solver
from hardware.spec import SystemSpec
from planner.analytical import PlanArrays, data_parallel
from planner.analytical.hybrid import rank_excess_s
from planner.analytical.layer_kinds import by_block, dense_layer_spec, interleaved, lead_layers
from planner.analytical.memory import rank_memory
from planner.analytical.time import (optimizer_step_bytes_per_param, per_layer_terms, rank_compute_s,
                                     rank_microbatch_s)
from planner.model import HYBRID_BLOCKS, ModelSpec
from planner.pipeline_layout import balanced_layout
from planner.plan import JobSpec, Plan

# Limits in nominal seconds, enforced as CP-SAT's deterministic time (WORK_PER_S units per second,
# what one worker does in a second on this project's 2-core machine: 0.25-0.33 measured), so that
# an unproven answer is the same on any machine; the wall clock is only a safety net.
TIME_LIMIT_S = 10.0
FREE_K_LIMIT_S = 3.0  # the model with k a variable first; if unproven by then, k is enumerated
WORK_PER_S = 0.3
WALL_SAFETY = 3.0     # the wall-clock limit, as a multiple of the nominal one
TIME_SCALE = 10**6   # one microbatch on the balanced split's rank ~ 1e6 integer units (finer
                     # scales made CP-SAT slow to prove; coarser ones lost near-ties: tests)
MEMORY_STEPS = 10**7  # memory unit = capacity / 1e7 (~8 KB on 80 GB), coefficients rounded up:
                      # the solver never admits a split the model rejects
PARAM_UNIT = 1e3     # parameters counted in thousands where the optimizer step costs nothing
FIXED_SEARCH_MAX_SPLITS = 10**4  # up to this many layer splits, search over the splits (solve_stages)
# A hybrid stack's per-block problem (_solve_blocks): its element constraints do not prove 8-16
# stages within seconds (Nemotron 3 Super, pp 8 vpp 2: no solution in 3 units of deterministic
# time, ~12 s here), so it is searched near the mean-block answer, in deterministic time units.
BLOCK_WORK_LIMIT = 0.25
# ... and where no mean-block split fits, the whole per-block problem, in a larger limit: the
# layout is dropped otherwise (Nano at pp 8 vpp 2 with HBM at 75 % of the balanced split's need:
# a fitting split found, and proven optimal, in 1.0 and 3.0 units; none in 0.25)
BLOCK_WHOLE_WORK_LIMIT = 1.0
# Blocks x virtual stages above which a hybrid stack's split is priced at its mean block instead
# (the exact model still re-scores it): the per-block problem's element tables grow with their
# product (10,000 blocks over hundreds of stages filled 24 GB). Real stacks are far below it
# (Nemotron 3 Super: 88 blocks x 16 virtual stages = 1,408).
BLOCK_PROBLEM_MAX_CELLS = 200_000
# Deterministic time the whole problem, DP exposure included, gets from the exposure-free
# optimum when its splits are too many to search all (llama3-405b at pp 8 vpp 8 with memory
# binding: not proven in 3 units; the exposure is ~0.2 % of its step there)
EXPOSURE_WORK_LIMIT = 0.5
# ... and none where the exposure-free optimum exposes at most this share of its objective more
# than any split could (dp_exposure_floor): the search's tie window (planner.ties TIE_REL_TOL)
EXPOSURE_GAIN_FLOOR = 1e-3
BLOCK_WINDOW = 3  # layers each stage bound may move from the mean-block answer (Nemotron 3 Nano at
                  # pp 8 vpp 2: the window's optimum is the whole problem's, proven in 0.7 s; in 6 s whole)


@dataclass(frozen=True)
class StageProblem:
    """Everything the per-stage choice depends on (hashable: solutions are cached by it)."""

    layers: int
    pp: int
    vpp: int
    microbatches: int
    recompute: bool                 # full recompute: k >= 1 chosen (k = 0 is the recompute-none problem)
    a: int                          # per layer, per microbatch (scaled time)
    b: int                          # per recomputed layer
    h: int                          # LM head (last rank)
    opt: int                        # 1: the optimizer step of one unit of p (0: it costs nothing)
    c: tuple[int, ...]              # per rank: fixed memory (capacity / MEMORY_STEPS units)
    w: tuple[int, ...]              # per rank: memory per layer
    x: tuple[int, ...]              # per rank: memory change per recomputed layer (<= 0)
    p0: tuple[int, ...]             # per rank: fixed optimizer-state elements (in units of one time unit's step)
    p1: int                         # optimizer-state elements per layer
    capacity: int                   # the same units
    lead: int = 0                   # dense layers of a MoE model (their own coefficients:)
    a_d: int = 0
    b_d: int = 0
    w_d: tuple[int, ...] = ()
    x_d: tuple[int, ...] = ()
    p1_d: int = 0
    # A pipelined hybrid stack (layer_kinds.by_block): a layer's costs follow its block, so a
    # stage's costs are its blocks', read off the pattern at the stage's bounds. Per kind:
    pattern: str = ""                       # the block pattern ("" : layers priced by a, b, w, ...)
    kinds: tuple[str, ...] = ()
    a_k: tuple[int, ...] = ()               # per held block (scaled time)
    b_k: tuple[int, ...] = ()               # per recomputed block
    w_k: tuple[tuple[int, ...], ...] = ()   # per rank, per kind: memory per held block
    x_k: tuple[tuple[int, ...], ...] = ()   # per rank, per kind: memory change per recomputed block
    p1_k: tuple[int, ...] = ()              # optimizer-state elements per held block
    # The data-parallel collectives each rank's microbatch leaves exposed (layer problems;
    # dp_zero -1: none, or not posed). Windows per layer (a leading dense layer's twin _d):
    # forward, backward, and what a recomputed layer adds to the backward; collective seconds
    # (all-reduce, reduce-scatter, all-gather) per rank at no layers (g0) and per layer (g1).
    dp_zero: int = -1
    dp_hide: bool = True
    time_unit_s: float = 0.0                # seconds per time unit (for reading the exposure back)
    wf: int = 0
    wb: int = 0
    wbr: int = 0
    wf_d: int = 0
    wb_d: int = 0
    wbr_d: int = 0
    g0: tuple[tuple[int, int, int], ...] = ()
    g1: tuple[int, int, int] = (0, 0, 0)
    g1_d: tuple[int, int, int] = (0, 0, 0)
    # a MoE model's expert parameters move over the expert-DP group instead: what that changes in
    # each collective, per rank at no layers and per layer (signed: that group may be faster)
    e0: tuple[tuple[int, int, int], ...] = ()
    e1: tuple[int, int, int] = (0, 0, 0)
    e1_d: tuple[int, int, int] = (0, 0, 0)
    # a per-block problem's (kinds as `kinds`): windows and collective seconds per held block
    wf_k: tuple[int, ...] = ()
    wb_k: tuple[int, ...] = ()
    wbr_k: tuple[int, ...] = ()
    g1_k: tuple[tuple[int, int, int], ...] = ()
    e1_k: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class StageSolution:
    stage_layers: tuple[int, ...] | None
    recompute_layers: int             # k per virtual stage (0 = none)
    status: str                       # OPTIMAL, FEASIBLE, INFEASIBLE, ...
    proven_optimal: bool
    variables: int
    constraints: int
    wall_s: float
    objective: int | None = None
    work: float = 0.0                 # CP-SAT deterministic time spent
    window: int | None = None         # a hybrid's stage bounds searched within this many layers of a hint's
    # proven optimal without the DP exposure (solve_stages: that problem is solved first); None:
    # no exposure posed, as proven_optimal
    linear_proven: bool | None = None

    @property
    def proven_without_exposure(self) -> bool:
        return self.proven_optimal if self.linear_proven is None else self.linear_proven

    @property
    def stage_recompute(self) -> tuple[int, ...] | None:
        if self.stage_layers is None or not self.recompute_layers:
            return None
        return tuple(min(self.recompute_layers, n) for n in self.stage_layers)


def _probe(model: ModelSpec, system: SystemSpec, job: JobSpec, plan: Plan):
    """Exact per-rank coefficients: cost every rank r with (N, K) = (0, 0), (1, 0), (1, 1), and
    with that one layer a leading dense one, (N, K, D, DK) = (1, 0, 1, 0), (1, 1, 1, 1)."""
    P = PlanArrays.from_plans([plan], model.layers, dense_layer_spec(model))
    p = plan.pp
    idx = np.tile(np.arange(p, dtype=np.float64), 5)[None, :]
    lay = np.repeat([0.0, 1.0, 1.0, 1.0, 1.0], p)[None, :]
    rec = np.repeat([0.0, 0.0, 1.0, 0.0, 1.0], p)[None, :]
    lead = np.repeat([0.0, 0.0, 0.0, 1.0, 1.0], p)[None, :] if lead_layers(model) else np.zeros_like(lay)
    lead_rc = np.repeat([0.0, 0.0, 0.0, 0.0, 1.0], p)[None, :] if lead_layers(model) else np.zeros_like(lay)
    Q = replace(P, rank_index=idx, rank_layers=lay, rank_recompute=rec, rank_lead_layers=lead,
                rank_lead_recompute=lead_rc)
    mem = rank_memory(model, system, job, _without_paired_layer(Q))
    # the optimizer step reads and writes each rank's optimizer-state elements (dense ones
    # sharded over dp, expert ones over expert-dp: not a fixed share of the parameters)
    hbm, params = mem["hbm"][0], mem["opt_elems"][0]
    terms = per_layer_terms(model, system, job, Q)
    times = rank_microbatch_s(terms, Q)[0]
    compute = rank_compute_s(terms, Q)
    fwd, bwd = compute["fwd"][0], compute["bwd"][0] + compute["recompute"][0]
    grad_b, weight_b = mem["grad_reduce"][0], mem["param_gather"][0]
    elems, expert = mem["params_elems"][0], mem["expert_params_elems"][0]
    zero, one, one_rc = slice(0, p), slice(p, 2 * p), slice(2 * p, 3 * p)
    one_d, one_d_rc = slice(3 * p, 4 * p), slice(4 * p, 5 * p)
    per_layer = lambda x, at, base=zero: x[at][0] - x[base][0]  # noqa: E731
    windows = {"wf": per_layer(fwd, one), "wb": per_layer(bwd, one), "wbr": per_layer(bwd, one_rc, one),
               "wf_d": per_layer(fwd, one_d), "wb_d": per_layer(bwd, one_d), "wbr_d": per_layer(bwd, one_d_rc, one_d),
               "grad_bytes0": grad_b[zero], "grad_bytes1": per_layer(grad_b, one),
               "grad_bytes1_d": per_layer(grad_b, one_d),
               "weight_bytes0": weight_b[zero], "weight_bytes1": per_layer(weight_b, one),
               "weight_bytes1_d": per_layer(weight_b, one_d),
               "elems0": elems[zero], "elems1": per_layer(elems, one), "elems1_d": per_layer(elems, one_d),
               "expert0": expert[zero], "expert1": per_layer(expert, one), "expert1_d": per_layer(expert, one_d)}
    return {**windows, "paired": _paired_layer_bytes(plan, mem, [one, one_d] if lead_layers(model) else [one]),
        "a_d": times[one_d][0] - times[zero][0], "b_d": times[one_d_rc][0] - times[one_d][0],
        "w_d": hbm[one_d] - hbm[zero], "x_d": hbm[one_d_rc] - hbm[one_d],
        "p1_d": params[one_d][0] - params[zero][0],
        "a": times[one][0] - times[zero][0], "b": times[one_rc][0] - times[one][0], "h": times[zero][p - 1],
        "c": hbm[zero], "w": hbm[one] - hbm[zero], "x": hbm[one_rc] - hbm[one],
        "p0": params[zero], "p1": params[one][0] - params[zero][0],
        "opt_s_per_elem": optimizer_step_bytes_per_param(job) / (system.accelerator.hbm_bandwidth_bytes_per_s
                                                       * system.accelerator.efficiency.hbm_efficiency),
    }


def _without_paired_layer(Q: PlanArrays) -> PlanArrays:
    """The probe without the all-to-all overlap's paired layer (memory.in_flight_microbatches:
    one more layer, costed as the rank's mean layer, 1/N of it): at one probed layer that is the
    whole layer again, which the per-layer coefficient would charge every layer of the rank.
    Its bytes are a per-rank constant instead (`_paired_layer_bytes`)."""
    return replace(Q, moe_a2a_overlap=np.zeros_like(Q.moe_a2a_overlap))


def _paired_layer_bytes(plan: Plan, mem: dict, one_layer: list[slice]) -> np.ndarray:
    """Per rank: the all-to-all overlap's paired layer as a constant, the largest one-layer
    activations of any layer kind (the model's mean layer of the rank lies between its kinds':
    the solver never admits a split the model rejects). Zero without the overlap."""
    act = mem["activations_per_microbatch"][0]
    largest = np.max([act[s] for s in one_layer], axis=0)
    return largest if plan.moe_a2a_overlap else np.zeros_like(largest)


def _probe_blocks(model: ModelSpec, system: SystemSpec, job: JobSpec, plan: Plan) -> dict:
    """Exact per-block coefficients of a pipelined hybrid stack: every rank r costed with no
    block, one block of each kind, and that block recomputed in full, given to the model as the
    blocks-per-rank counts it reads (`layer_kinds.rank_block_counts`' form)."""
    P = PlanArrays.from_plans([plan], model.layers, 0)
    p = plan.pp
    kinds = [k for k in HYBRID_BLOCKS if model.blocks(k)]
    probes = 1 + 2 * len(kinds)  # none; per kind: held, held and recomputed
    held, rec = np.zeros((probes * p, len(kinds))), np.zeros((probes * p, len(kinds)))
    for j in range(len(kinds)):
        held[(1 + 2 * j) * p:(3 + 2 * j) * p, j] = 1.0
        rec[(2 + 2 * j) * p:(3 + 2 * j) * p, j] = 1.0
    zeros = np.zeros((1, probes * p))
    Q = replace(P, rank_index=np.tile(np.arange(p, dtype=np.float64), probes)[None, :],
                rank_layers=held.sum(axis=1)[None, :], rank_recompute=rec.sum(axis=1)[None, :],
                rank_lead_layers=zeros, rank_lead_recompute=zeros)
    counts = (kinds, [(np.array([0]), held, rec)])
    terms = per_layer_terms(model, system, job, Q)
    excess = rank_excess_s(model, system, job, Q, terms, counts)
    times = rank_microbatch_s(terms, Q, excess)[0]
    compute = rank_compute_s(terms, Q, excess)
    fwd, bwd = compute["fwd"][0], compute["bwd"][0] + compute["recompute"][0]
    mem = rank_memory(model, system, job, _without_paired_layer(Q), by_block=True, counts=counts)
    hbm, params = mem["hbm"][0], mem["opt_elems"][0]
    one = [slice((1 + 2 * j) * p, (2 + 2 * j) * p) for j in range(len(kinds))]
    one_rc = [slice((2 + 2 * j) * p, (3 + 2 * j) * p) for j in range(len(kinds))]
    per_block = lambda x: [x[i][0] - x[0] for i in one]  # noqa: E731 (rank 0's column: the same on every rank)
    grad_b, weight_b = mem["grad_reduce"][0], mem["param_gather"][0]
    elems, expert = mem["params_elems"][0], mem["expert_params_elems"][0]
    return {"kinds": kinds, "paired": _paired_layer_bytes(plan, mem, one),
            "a": [times[i][0] - times[0] for i in one], "b": [times[i][0] - times[o][0] for o, i in zip(one, one_rc)],
            "w": [hbm[i] - hbm[:p] for i in one], "x": [hbm[i] - hbm[o] for o, i in zip(one, one_rc)],
            "p1": [params[i][0] - params[0] for i in one],
            # the DP terms (_dp_fields): windows and bytes per held block, bytes per rank with none
            "wf": per_block(fwd), "wb": per_block(bwd), "wbr": [bwd[i][0] - bwd[o][0] for o, i in zip(one, one_rc)],
            "grad_bytes": per_block(grad_b), "weight_bytes": per_block(weight_b), "elems": per_block(elems),
            "expert": per_block(expert), "grad_bytes0": grad_b[:p], "weight_bytes0": weight_b[:p],
            "elems0": elems[:p], "expert0": expert[:p]}


def stage_problem(model: ModelSpec, system: SystemSpec, job: JobSpec, plan: Plan) -> StageProblem | None:
    """The per-stage problem of `plan`'s layout, or None when the model is not affine in the
    counts (ZeRO-3, offload) or there is no pipeline to split."""
    if plan.pp == 1 or plan.zero_stage >= 3 or plan.uses_offload or model.layers < plan.pp * plan.vpp:
        return None
    pr = _probe(model, system, job, plan)
    per_block = by_block(model) and not any(job.bf16_layers) \
        and model.layers * plan.pp * plan.vpp <= BLOCK_PROBLEM_MAX_CELLS
    blocks = _probe_blocks(model, system, job, plan) if per_block else None
    m = plan.num_microbatches
    v = plan.vpp
    # time unit: one microbatch on a rank of the balanced split ~ TIME_SCALE
    ref = model.layers / plan.pp * (pr["a"] + max(pr["b"], 0.0)) + pr["h"]
    unit = ref / TIME_SCALE
    opt_per_param = pr["opt_s_per_elem"] * v
    # parameters in units whose optimizer step takes one time unit (opt = 1), so rounding them
    # costs under a time unit (in thousands, a small model's step per unit rounded to 0: ignored)
    param_unit = unit / opt_per_param if opt_per_param > 0 else PARAM_UNIT
    params_in = lambda x: int(round(x / param_unit))  # noqa: E731
    capacity = system.accelerator.hbm_capacity_bytes - job.hbm_reserve_gib * 2**30
    unit_bytes = max(capacity, 1.0) / MEMORY_STEPS
    mib = lambda x: int(np.ceil(x / unit_bytes))  # noqa: E731
    return StageProblem(
        layers=model.layers, pp=plan.pp, vpp=v, microbatches=m, recompute=plan.recompute == "full",
        a=max(1, round(pr["a"] / unit)), b=max(0, round(pr["b"] / unit)), h=max(0, round(pr["h"] / unit)),
        opt=1 if opt_per_param > 0 else 0,
        c=tuple(mib(x) for x in pr["c"] + (blocks or pr)["paired"]), w=tuple(mib(x) for x in pr["w"]),
        x=tuple(mib(x) for x in pr["x"]),
        p0=tuple(params_in(x) for x in pr["p0"]), p1=max(0, params_in(pr["p1"])),
        capacity=int(capacity // unit_bytes),
        **({} if not lead_layers(model) else dict(
            lead=lead_layers(model), a_d=max(1, round(pr["a_d"] / unit)), b_d=max(0, round(pr["b_d"] / unit)),
            w_d=tuple(mib(x) for x in pr["w_d"]), x_d=tuple(mib(x) for x in pr["x_d"]),
            p1_d=max(0, params_in(pr["p1_d"])))),
        **({} if blocks is None else _by_block_fields(model, blocks, unit, mib, params_in)),
        **(_interleaved_fields(model, pr, unit, mib, params_in) if interleaved(model) else {}),
        **(_dp_fields(model, system, plan, pr, unit) if blocks is None and not interleaved(model) else
           _interleaved_dp_fields(_dp_fields(model, system, plan, pr, unit)) if blocks is None else
           _hybrid_dp_fields(model, system, plan, blocks, unit)))


def _hybrid_dp_fields(model: ModelSpec, system: SystemSpec, plan: Plan, blocks: dict, unit: float) -> dict:
    """A pipelined hybrid stack's DP terms per block kind, from the block probe (the rates read
    off the kind with the most bytes)."""
    j = int(np.argmax(blocks["grad_bytes"]))
    one = {"grad_bytes1": blocks["grad_bytes"][j], "weight_bytes1": blocks["weight_bytes"][j],
           "elems1": blocks["elems"][j]}
    weights = [(blocks["weight_bytes0"], blocks["elems0"]), (blocks["weight_bytes"], blocks["elems"])]
    rates = _dp_rates(model, system, plan, one, weights, unit)
    if rates is None:
        return {}
    window = lambda x: max(0, round(x / unit))  # noqa: E731
    return {**_dp_rank_fields(model, plan, unit, rates, blocks),
            "wf_k": tuple(map(window, blocks["wf"])), "wb_k": tuple(map(window, blocks["wb"])),
            "wbr_k": tuple(map(window, blocks["wbr"])),
            "g1_k": tuple(rates.bytes_part(g, w) for g, w in zip(blocks["grad_bytes"], blocks["weight_bytes"])),
            **({"e1_k": tuple(map(rates.expert_part, blocks["expert"]))} if model.moe is not None else {})}


def _interleaved_dp_fields(fields: dict) -> dict:
    """A MoE model with interleaved dense layers: `_dp_fields`' dense-layer (_d) and MoE-layer
    coefficients as the per-block problem's kinds D and E."""
    if not fields:
        return {}
    pair = lambda key: (fields[f"{key}_d"], fields[key])  # noqa: E731
    out = {k: v for k, v in fields.items() if k in ("dp_zero", "dp_hide", "time_unit_s", "g0", "e0")}
    out.update(wf_k=pair("wf"), wb_k=pair("wb"), wbr_k=pair("wbr"), g1_k=pair("g1"))
    if fields.get("e0"):
        out["e1_k"] = pair("e1")
    return out


@dataclass(frozen=True)
class _DpRates:
    """A DP collective's seconds, in a stage problem's time units, as (all-reduce,
    reduce-scatter, all-gather): `bytes_part` of a rank's gradient and weight bytes at the dense
    group's rate (`fixed`: with the ring latencies), `expert_part` of its expert elements at the
    expert-DP group's rate difference."""
    unit: float
    latency: np.ndarray
    dense_rate: np.ndarray   # s per byte
    shift: np.ndarray        # s per expert element

    def _in_units(self, x) -> tuple[int, int, int]:
        return tuple(round(float(y) / self.unit) for y in x)

    def bytes_part(self, grad_bytes, weight_bytes, fixed: bool = False) -> tuple[int, int, int]:
        return self._in_units((self.latency if fixed else 0.0)
                              + self.dense_rate * np.array([grad_bytes, grad_bytes, weight_bytes]))

    def expert_part(self, elems) -> tuple[int, int, int]:
        return self._in_units(self.shift * elems)


def _dp_rates(model: ModelSpec, system: SystemSpec, plan: Plan, one: dict, weights: list, unit: float
              ) -> _DpRates | None:
    """The rates of `_DpRates`, read off the exact model's collectives (data_parallel.replica_groups)
    at one layer's (or block's) bytes `one` and twice them: a rank's bytes B_r, of which its expert
    parameters' share E_r/P_r goes over the expert-DP group, take latency + s_dp·(B_r − b·E_r)
    + s_edp·b·E_r (b bytes per element). None where nothing is posed: ZeRO-3 and FSDP2's per-layer
    ZeRO-2 (not linear in the layers), no collective, or a MoE model's parameter all-gather where
    elements gather different bytes (FP8 weights beside 16-bit embeddings; `weights`: (bytes,
    elements) pairs that must share one ratio)."""
    if plan.zero_stage >= 3 or (plan.zero_stage == 2 and plan.dp_impl == "torch-fsdp2") \
            or one["grad_bytes1"] <= 0 or one["weight_bytes1"] <= 0:
        return None
    P = PlanArrays.from_plans([plan], model.layers, dense_layer_spec(model))
    # bytes per parameter element on the wire (memory.py: the same for every element's gradient)
    grad_per_elem, weight_per_elem = one["grad_bytes1"] / one["elems1"], one["weight_bytes1"] / one["elems1"]
    moe = model.moe is not None
    if moe and plan.zero_stage >= 1 and not all(
            np.allclose(b, weight_per_elem * np.asarray(e), rtol=1e-9) for b, e in weights):
        return None

    def seconds(share: float, scale: float) -> np.ndarray:
        """(all-reduce, reduce-scatter, all-gather) with `share` of the bytes on the expert-DP
        group, at `scale` x one layer's bytes."""
        groups = data_parallel.replica_groups(system, P, share, scale * one["grad_bytes1"], scale * one["weight_bytes1"])
        t = data_parallel.collective_totals_s(groups, P.dp_impl)
        return np.array([float(t[k][0]) for k in ("grad_ar", "grad_rs", "param_ag")])
    per_byte = np.array([one["grad_bytes1"], one["grad_bytes1"], one["weight_bytes1"]])
    dense_rate = (seconds(0.0, 2.0) - seconds(0.0, 1.0)) / per_byte  # s per byte over each group
    expert_rate = (seconds(1.0, 2.0) - seconds(1.0, 1.0)) / per_byte
    latency = (2 * seconds(0.0, 1.0) - seconds(0.0, 2.0)) + (2 * seconds(1.0, 1.0) - seconds(1.0, 2.0) if moe else 0.0)
    if not np.any(dense_rate > 0):
        return None
    shift = (expert_rate - dense_rate) * np.array([grad_per_elem, grad_per_elem, weight_per_elem])
    return _DpRates(unit, latency, dense_rate, shift)


def _dp_rank_fields(model: ModelSpec, plan: Plan, unit: float, rates: _DpRates, probe: dict) -> dict:
    """The fields every DP-posed StageProblem has: what is exposed how, and each rank's
    collectives with no layers (its embedding or LM head, the ring latencies)."""
    return dict(dp_zero=plan.zero_stage, dp_hide=plan.dp_comm_overlap, time_unit_s=unit,
                g0=tuple(rates.bytes_part(g, w, fixed=True) for g, w in zip(probe["grad_bytes0"], probe["weight_bytes0"])),
                **({"e0": tuple(map(rates.expert_part, probe["expert0"]))} if model.moe is not None else {}))


def _dp_fields(model: ModelSpec, system: SystemSpec, plan: Plan, pr: dict, unit: float) -> dict:
    """StageProblem's data-parallel fields of a layer problem, in its time units: a rank's windows
    per layer and each collective's seconds, affine in the rank's layers (`_dp_rates`: the rank's
    bytes at the dense group's rate, g, plus its expert elements at the rate difference, e).
    Empty where `_dp_rates` poses nothing (dp_zero stays -1)."""
    rates = _dp_rates(model, system, plan, pr, [(pr["weight_bytes0"], pr["elems0"])], unit)
    if rates is None:
        return {}
    window = lambda key: max(0, round(pr[key] / unit))  # noqa: E731
    return dict(**_dp_rank_fields(model, plan, unit, rates, pr),
                **{key: window(key) for key in ("wf", "wb", "wbr", "wf_d", "wb_d", "wbr_d")},
                g1=rates.bytes_part(pr["grad_bytes1"], pr["weight_bytes1"]),
                g1_d=rates.bytes_part(pr["grad_bytes1_d"], pr["weight_bytes1_d"]),
                **({} if model.moe is None else dict(e1=rates.expert_part(pr["expert1"]),
                                                     e1_d=rates.expert_part(pr["expert1_d"]))))


def _interleaved_fields(model: ModelSpec, pr: dict, unit: float, mib, params_in) -> dict:
    """A MoE model whose dense layers interleave with its MoE layers as a per-block problem of two
    kinds, D (dense) and E (MoE), at the dense and MoE layers' probed coefficients: a stage's count
    of each follows from where its bounds fall, as a hybrid stack's blocks do (`_block_loads`)."""
    dense = set(model.dense_layer_positions)
    p = len(pr["c"])
    return dict(pattern="".join("D" if i in dense else "E" for i in range(model.layers)), kinds=("D", "E"),
                a_k=(max(1, round(pr["a_d"] / unit)), max(1, round(pr["a"] / unit))),
                b_k=(max(0, round(pr["b_d"] / unit)), max(0, round(pr["b"] / unit))),
                w_k=tuple((mib(pr["w_d"][r]), mib(pr["w"][r])) for r in range(p)),
                x_k=tuple((mib(pr["x_d"][r]), mib(pr["x"][r])) for r in range(p)),
                p1_k=(max(0, params_in(pr["p1_d"])), max(0, params_in(pr["p1"]))))


def _by_block_fields(model: ModelSpec, pr: dict, unit: float, mib, params_in) -> dict:
    """StageProblem's per-kind fields, in its units (bf16 first/last layers keep the mean block,
    as the model's time does: hybrid.rank_excess_s)."""
    per_rank = lambda per_kind: tuple(tuple(mib(x[r]) for x in per_kind) for r in range(len(per_kind[0])))  # noqa: E731
    return dict(pattern=model.hybrid_pattern, kinds=tuple(pr["kinds"]),
                a_k=tuple(max(1, round(x / unit)) for x in pr["a"]), b_k=tuple(max(0, round(x / unit)) for x in pr["b"]),
                w_k=per_rank(pr["w"]), x_k=per_rank(pr["x"]),
                p1_k=tuple(max(0, params_in(x)) for x in pr["p1"]))


@functools.lru_cache(maxsize=4096)
def solve_stages(problem: StageProblem, time_limit_s: float = TIME_LIMIT_S, k_value: int | None = None,
                 hint: tuple | None = None, work_limit: float | None = None, window: int | None = None) -> StageSolution:
    """CP-SAT over the per-stage variables (see the module docstring); `k_value` fixes the
    recompute count. `hint`: (stage layers, k) to start from; `work_limit`: a cap on CP-SAT's
    deterministic time (the same answer on any machine, unlike the wall-clock limit); `window`:
    a hybrid stack's stage bounds kept within that many layers of the hint's.

    With the DP exposure posed, the problem without it is solved first: the exposure is never
    negative, so an optimum of that problem that exposes nothing is the whole problem's optimum
    (most large layouts hide their DP collectives, and the exposure's max(0, ·) terms slowed the
    proof 10x: bench/search_speed.py). With many splits, also where no split could expose less by
    more than the tie window (EXPOSURE_GAIN_FLOOR; its proof then holds within that window).
    Otherwise the whole problem is solved from that answer."""
    if problem.dp_zero < 0 or problem.pattern:
        return _solve_cpsat(problem, time_limit_s, k_value, hint, work_limit, window)
    plain = _solve_cpsat(replace(problem, dp_zero=-1), time_limit_s, k_value, hint, work_limit, window)
    if plain.stage_layers is None:  # the exposure changes no memory: nothing fits either way
        return plain
    plain = replace(plain, objective=layer_objective(problem, plain.stage_layers, plain.recompute_layers),
                    linear_proven=plain.proven_optimal)
    exposed = dp_exposure_at(problem, plain.stage_layers, plain.recompute_layers)
    if plain.proven_optimal and exposed == 0:
        return plain
    if not few_splits(problem) and exposed - dp_exposure_floor(problem) <= EXPOSURE_GAIN_FLOOR * plain.objective:
        # no split can expose less by more than the search's tie window: not worth a solve (with
        # the collectives not overlapped the exposure is never 0, and the whole problem took
        # seconds per layout: llama3-70b at pp 8 vpp 2, 0.0 -> 5.6 s)
        return plain
    left = (work_limit if work_limit is not None else time_limit_s * WORK_PER_S) - plain.work
    if not few_splits(problem):
        left = min(left, EXPOSURE_WORK_LIMIT)
    if left <= 0:
        return replace(plain, status="FEASIBLE", proven_optimal=False)
    whole = _solve_cpsat(problem, time_limit_s, k_value, (plain.stage_layers, plain.recompute_layers), left, window)
    whole = replace(whole, linear_proven=plain.proven_optimal)
    if whole.stage_layers is not None:  # a FEASIBLE answer's T and G may be above its ranks' max
        whole = replace(whole, objective=layer_objective(problem, whole.stage_layers, whole.recompute_layers))
    if whole.stage_layers is None or whole.objective > plain.objective:
        return _with_effort_of(replace(plain, status=whole.status if whole.proven_optimal else "FEASIBLE",
                                       proven_optimal=whole.proven_optimal), whole, work=plain.work + whole.work)
    return _with_effort_of(whole, plain, work=plain.work + whole.work)


def _solve_cpsat(problem: StageProblem, time_limit_s: float, k_value: int | None, hint: tuple | None,
                 work_limit: float | None, window: int | None) -> StageSolution:
    t0 = time.perf_counter()
    L, p, v = problem.layers, problem.pp, problem.vpp
    S = p * v
    md = cp_model.CpModel()
    n = [md.NewIntVar(1, L - S + 1, f"n{s}") for s in range(S)]
    md.Add(sum(n) == L)
    kmax = L - S + 1 if problem.recompute else 0
    k = md.NewIntVar(1 if problem.recompute else 0, kmax, "k") if k_value is None else k_value
    ks = []
    for s in range(S):
        if problem.recompute:
            ks_s = md.NewIntVar(0, kmax, f"k{s}")
            md.AddMinEquality(ks_s, [k, n[s]])
            ks.append(ks_s)
        else:
            ks.append(0)
    if problem.pattern:
        near = _bounds(hint[0]) if hint is not None and window is not None else None
        loads = _block_loads(md, problem, n, ks, near, window)
    else:
        loads = _layer_loads(md, problem, n, ks, k)
    times, memory, params, recompute_sum, horizon, params_max, rank_terms = loads
    T = md.NewIntVar(0, horizon, "T")
    pmax = md.NewIntVar(0, params_max, "Pmax")
    for r in range(p):
        md.Add(T >= times[r] + (problem.h if r == p - 1 else 0))
        md.Add(memory[r] <= problem.capacity)
        md.Add(pmax >= params[r])
    exposed, dp_vars = _dp_exposure(md, problem, rank_terms, times, T) if rank_terms else (0, None)
    md.Minimize((problem.microbatches * v - 1) * T + recompute_sum + problem.opt * pmax + exposed)
    # Few splits (C(L−1, S−1) compositions): branch on the layer counts, after which everything
    # else follows by propagation, so the search tree is at most the splits themselves. CP-SAT's
    # automatic search (one worker) branched on the wide time and parameter bounds instead and,
    # for some coefficient values, did not prove a 7-layer, 3-stage problem (15 splits) in 10 s;
    # on large problems (126 layers over 64 stages) the automatic search is the fast one.
    # (a per-block problem with the DP exposure: the fixed search left CP-SAT stepping through the
    # exposure's wide domains after the layer counts, 30 s on a 21-split problem; the automatic
    # search proves those in milliseconds)
    fixed_search = few_splits(problem) and not (problem.pattern and dp_vars is not None)
    if fixed_search:
        md.AddDecisionStrategy(n, cp_model.CHOOSE_FIRST, cp_model.SELECT_MIN_VALUE)
        if dp_vars is not None:
            # then the exposure's variables at their least: left to the default order, the fixed
            # search stepped through their wide domains (a 21-split problem ran out its wall clock)
            md.AddDecisionStrategy(dp_vars[1], cp_model.CHOOSE_FIRST, cp_model.SELECT_MIN_VALUE)
    if hint is not None:
        for x, value in zip(n, hint[0]):
            md.AddHint(x, value)
        if problem.recompute and k_value is None and hint[1]:
            md.AddHint(k, hint[1])
    # the same solver settings and Ctrl-C handling as the row search (constraints.solve): a
    # SIGINT during this solve must stop it, not abort the process with the solver mid-flight
    solver = new_solver(WALL_SAFETY * time_limit_s)
    solver.parameters.max_deterministic_time = work_limit if work_limit is not None else time_limit_s * WORK_PER_S
    if fixed_search:
        solver.parameters.search_branching = cp_model.FIXED_SEARCH
    status = interruptible_solve(solver, md)
    proto = md.Proto()
    name = solver.StatusName(status)
    wall = time.perf_counter() - t0
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return StageSolution(None, 0, name, False, len(proto.variables), len(proto.constraints), wall,
                             work=solver.deterministic_time)
    layers = tuple(int(solver.Value(x)) for x in n)
    kval = int(solver.Value(k)) if problem.recompute else 0
    if kval == 0 and not problem.pattern:  # (a hybrid's blocks differ with their place)
        layers = _spread_over_chunks(layers, p, v, problem.lead)
    return StageSolution(layers, kval, name, status == cp_model.OPTIMAL, len(proto.variables),
                         len(proto.constraints), wall, int(solver.ObjectiveValue()), work=solver.deterministic_time)


def _layer_loads(md: cp_model.CpModel, problem: StageProblem, n: list, ks: list, k):
    """Per rank: (time, memory, parameters) from its layer counts, each layer kind (the repeated
    layer, a MoE model's leading dense layers) at its coefficients; Σ_r of the recompute time;
    bounds on the time and parameters. Adds the exact symmetry breaking (module docstring)."""
    L, p, v, S = problem.layers, problem.pp, problem.vpp, len(n)
    N = [sum(n[c * p + r] for c in range(v)) for r in range(p)]
    K = [sum(ks[c * p + r] for c in range(v)) for r in range(p)]
    # leading dense layers: d_s of stage s (only s < D can hold any), dk_s of them recomputed
    D = problem.lead
    ds, dks = [0] * S, [0] * S
    for s in range(min(D, S)):
        left = md.NewIntVar(0, D, f"left{s}")  # leading layers not in stages before s
        md.AddMaxEquality(left, [0, D - sum(n[:s])])
        ds[s] = md.NewIntVar(0, D, f"d{s}")
        md.AddMinEquality(ds[s], [n[s], left])
        if problem.recompute:
            dks[s] = md.NewIntVar(0, D, f"dk{s}")
            md.AddMinEquality(dks[s], [k, ds[s]])
    Dr = [sum(ds[c * p + r] for c in range(v)) for r in range(p)]
    DKr = [sum(dks[c * p + r] for c in range(v)) for r in range(p)]
    # per-kind coefficients: the repeated layer's, plus the leading dense layer's difference
    a_d, b_d, p1_d = (problem.a_d, problem.b_d, problem.p1_d) if D else (problem.a, problem.b, problem.p1)
    w_d, x_d = (problem.w_d, problem.x_d) if D else (problem.w, problem.x)
    # symmetry breaking (exact, see the docstring): only among stages that hold no leading layer
    for r in range(p):
        for c in range(v - 1):
            if c * p + r >= D:
                md.Add(n[c * p + r] >= n[(c + 1) * p + r])
    for r in range(max(1, D), p - 2):
        md.Add(N[r] <= N[r + 1])
    times = [problem.a * N[r] + (a_d - problem.a) * Dr[r] + problem.b * K[r] + (b_d - problem.b) * DKr[r]
             for r in range(p)]
    memory = [problem.c[r] + problem.w[r] * N[r] + (w_d[r] - problem.w[r]) * Dr[r] + problem.x[r] * K[r]
              + (x_d[r] - problem.x[r]) * DKr[r] for r in range(p)]
    params = [problem.p0[r] + problem.p1 * N[r] + (p1_d - problem.p1) * Dr[r] for r in range(p)]
    # Σ_r T_r: the recompute part varies with the split (the layer part is a constant)
    recompute_sum = problem.b * sum(K) + (b_d - problem.b) * sum(DKr)
    horizon = (max(problem.a, a_d) + max(problem.b, b_d)) * L + problem.h
    rank_terms = _layer_rank_dp_terms(problem, N, Dr, K, DKr) if _dp_posed(problem) else None
    return times, memory, params, recompute_sum, horizon, max(problem.p0) + max(problem.p1, p1_d) * L, rank_terms


def _layer_rank_dp_terms(problem: StageProblem, N, D, K, DK) -> list[tuple]:
    """Per rank of a layer problem: (its three collectives' seconds, its forward window, its
    backward window), from its layer counts (CP-SAT expressions or plain numbers alike)."""
    out = []
    for r in range(problem.pp):
        G = [problem.g0[r][x] + problem.g1[x] * N[r] + (problem.g1_d[x] - problem.g1[x]) * D[r]
             + (problem.e0[r][x] + problem.e1[x] * N[r] + (problem.e1_d[x] - problem.e1[x]) * D[r] if problem.e0 else 0)
             for x in range(3)]
        Wf = problem.wf * N[r] + (problem.wf_d - problem.wf) * D[r]
        Wb = problem.wb * N[r] + (problem.wb_d - problem.wb) * D[r] + problem.wbr * K[r] \
            + (problem.wbr_d - problem.wbr) * DK[r]
        out.append((G, Wf, Wb))
    return out


def _block_rank_dp_terms(problem: StageProblem, held, recomputed) -> list[tuple]:
    """`_layer_rank_dp_terms` of a per-block problem, from each rank's held and recomputed blocks
    of each kind."""
    kinds = range(len(problem.kinds))
    out = []
    for r in range(problem.pp):
        G = [problem.g0[r][x] + sum(problem.g1_k[j][x] * held[r][j] for j in kinds)
             + (problem.e0[r][x] + sum(problem.e1_k[j][x] * held[r][j] for j in kinds) if problem.e0 else 0)
             for x in range(3)]
        Wf = sum(problem.wf_k[j] * held[r][j] for j in kinds)
        Wb = sum(problem.wb_k[j] * held[r][j] + problem.wbr_k[j] * recomputed[r][j] for j in kinds)
        out.append((G, Wf, Wb))
    return out


def _dp_exposure(md: cp_model.CpModel, problem: StageProblem, rank_terms: list, times: list, T) -> tuple:
    """vpp x the DP communication the step leaves exposed (the objective's scale), as the exact
    model costs it (planner.analytical.data_parallel.dp_comm_exposed_s): every rank's collectives
    G_r (its own bytes) overlapped with its own microbatch window W_r, vpp·E_r = max(0, G_r − W_r,
    vpp·G_r − ((vpp−1)·pp + 1)·W_r) (time.overlapped_collective_s), Megatron's ZeRO-2 adding
    vpp·(m−1)·max(0, G_rs,r − W_r) for every other microbatch's reduce-scatter; the step waits for
    the largest (E >= every E_r, minimised: their max). Returns (the term, decision variables)."""
    p, v, m = problem.pp, problem.vpp, problem.microbatches
    L = problem.layers
    per_layer_g = (*problem.g1, *problem.g1_d, *(g for gk in problem.g1_k for g in gk))
    per_layer_e = (*problem.e1, *problem.e1_d, *(e for ek in problem.e1_k for e in ek))
    e_top = max((max(abs(e) for e in e0) for e0 in problem.e0), default=0) + max(map(abs, per_layer_e)) * L
    g_top = max(max(g) for g in problem.g0) + max(per_layer_g) * L + e_top
    alpha = (v - 1) * p + 1
    E = md.NewIntVar(0, v * (m + 2) * g_top, "E")
    parts = []

    def exceeding(value, name: str, top: int):
        """A variable >= max(0, value) (minimised, so equal to it)."""
        out = md.NewIntVar(0, top, name)
        md.Add(out >= value)
        parts.append(out)
        return out
    for r, (G, Wf, Wb) in enumerate(rank_terms):
        G_ar, G_rs, G_ag = G
        if not problem.dp_hide:
            md.Add(E >= v * {0: G_ar, 1: G_rs + G_ag, 2: m * G_rs + G_ag}[problem.dp_zero])
            continue

        def overlapped(G_x, W, name):
            e = exceeding(G_x - W, name, v * g_top)
            md.Add(e >= v * G_x - alpha * W)
            return e
        if problem.dp_zero == 0:
            md.Add(E >= overlapped(G_ar, Wb, f"E_ar{r}"))
            continue
        rank = overlapped(G_rs, Wb, f"E_rs{r}") + overlapped(G_ag, Wf, f"E_ag{r}")
        if problem.dp_zero == 2:  # every other microbatch's reduce-scatter, each behind its backward
            rank = rank + v * (m - 1) * exceeding(G_rs - Wb, f"E_rs_each{r}", g_top)
        md.Add(E >= rank)
    return E, ([], [E, *parts])


def _bounds(layers: tuple[int, ...]) -> list[int]:
    return [sum(layers[:s]) for s in range(len(layers) + 1)]


def _block_loads(md: cp_model.CpModel, problem: StageProblem, n: list, ks: list, near: list[int] | None = None,
                 window: int | None = None):
    """`_layer_loads` of a hybrid stack, each block at its kind's coefficients. Stage s spans
    layers [e_s, e_s + n_s) of the pattern (e_s = Σ_{s'<s} n_s'), so it holds
    C_X(e_{s+1}) − C_X(e_s) blocks of kind X, C_X(i) the count of X among the pattern's first i
    (a table, read with AddElement), and recomputes C_X(e_s + ks_s) − C_X(e_s) (block recompute:
    its first ks_s). No symmetry breaking: the stages' blocks differ with their place. `near`,
    `window`: each bound e_s kept within `window` layers of near[s]."""
    L, p, S = problem.layers, problem.pp, len(n)
    kinds = range(len(problem.kinds))
    table = [[problem.pattern[:i].count(x) for i in range(L + 1)] for x in problem.kinds]

    def count_before(j: int, index, name: str):
        if isinstance(index, int):
            return table[j][index]
        out = md.NewIntVar(0, table[j][L], name)
        md.AddElement(index, table[j], out)
        return out
    bounds: list = [0]
    for s in range(1, S):
        lo, hi = s, L - S + s
        if near is not None:
            lo, hi = max(lo, near[s] - window), min(hi, near[s] + window)
        e = md.NewIntVar(lo, hi, f"e{s}")
        md.Add(e == sum(n[:s]))
        bounds.append(e)
    bounds.append(L)
    before = [[count_before(j, e, f"c{j}_{s}") for s, e in enumerate(bounds)] for j in kinds]
    # terms collected, then summed: OR-tools' `+=` on an expression may extend it in place, and
    # the boundary expressions are shared by neighbouring stages
    held_terms = [[[] for _ in kinds] for _ in range(p)]
    recomputed_terms = [[[] for _ in kinds] for _ in range(p)]
    for s in range(S):
        r = s % p  # Megatron's order: virtual stage s = chunk·pp + rank
        end = None
        if problem.recompute:
            end = md.NewIntVar(0, L, f"rc_end{s}")
            md.Add(end == bounds[s] + ks[s])
        for j in kinds:
            held_terms[r][j] += [before[j][s + 1], -before[j][s]]
            if end is not None:
                recomputed_terms[r][j] += [count_before(j, end, f"rc{j}_{s}"), -before[j][s]]
    held = [[sum(t) for t in per_rank] for per_rank in held_terms]
    recomputed = [[sum(t) for t in per_rank] for per_rank in recomputed_terms]
    times = [sum(problem.a_k[j] * held[r][j] + problem.b_k[j] * recomputed[r][j] for j in kinds) for r in range(p)]
    memory = [problem.c[r] + sum(problem.w_k[r][j] * held[r][j] + problem.x_k[r][j] * recomputed[r][j] for j in kinds)
              for r in range(p)]
    params = [problem.p0[r] + sum(problem.p1_k[j] * held[r][j] for j in kinds) for r in range(p)]
    recompute_sum = sum(problem.b_k[j] * recomputed[r][j] for r in range(p) for j in kinds)
    horizon = (max(problem.a_k) + max(problem.b_k)) * L + problem.h
    rank_terms = _block_rank_dp_terms(problem, held, recomputed) if _dp_posed(problem) else None
    return times, memory, params, recompute_sum, horizon, max(problem.p0) + max(problem.p1_k) * L, rank_terms


def solve_over_k(problem: StageProblem, budget_s: float = TIME_LIMIT_S) -> StageSolution:
    """The recompute count k enumerated, one CP-SAT model per k (k a constant: min(k, n_s) is
    then easy for CP-SAT; with k a variable it failed to prove 4-stage problems in 10 s), the
    best kept. Proven optimal when every k was solved to optimality or infeasibility within the
    budget (deterministic time, as every limit here)."""
    t0 = time.perf_counter()
    best, proven, variables, constraints, work = None, True, 0, 0, 0.0
    for k in range(1, problem.layers - problem.pp * problem.vpp + 2):
        left = budget_s * WORK_PER_S - work
        if left <= 0:
            proven = False
            break
        sol = solve_stages(problem, budget_s, k, work_limit=left)
        variables, constraints, work = variables + sol.variables, constraints + sol.constraints, work + sol.work
        proven &= sol.status in ("OPTIMAL", "INFEASIBLE")
        if sol.stage_layers is not None and (best is None or sol.objective < best.objective):
            best = sol
    wall = time.perf_counter() - t0
    if best is None:
        return StageSolution(None, 0, "INFEASIBLE" if proven else "UNKNOWN", False, variables, constraints, wall)
    return replace(best, status="OPTIMAL" if proven else "FEASIBLE", proven_optimal=proven,
                   variables=variables, constraints=constraints, wall_s=wall)


def best_stages(model: ModelSpec, system: SystemSpec, job: JobSpec, plan: Plan) -> tuple[Plan | None, StageSolution | None]:
    """The per-stage optimum of `plan`'s layout: under full recompute, the better of k >= 1
    (recompute costs and buffers) and k = 0 (the plan without recompute, whose memory has no
    recompute buffer; not with recompute pinned to full), by the solver's objective. (None, None): no per-stage problem."""
    problem = stage_problem(model, system, job, plan)
    if problem is None:
        return None, None
    if problem.pattern:
        sol, solve = _solve_blocks(problem), _solve_blocks
    else:
        sol, solve = solve_stages(problem, FREE_K_LIMIT_S if problem.recompute else TIME_LIMIT_S), solve_stages
    if problem.recompute and not sol.proven_without_exposure and sol.status != "INFEASIBLE" \
            and not problem.pattern:
        # k as a variable did not prove in time (it happens even on 4 stages): enumerate k. Not
        # where it was proven infeasible: its k ranges over every count the enumeration would fix,
        # so each of those is infeasible too (`check`'s HBM bisection enumerated 102 k per step on
        # Llama 3.1 405B at pp 25, each proven infeasible: ~4 s of its ~7)
        alt = solve_over_k(problem)
        better = alt if alt.stage_layers is not None and (sol.stage_layers is None or alt.objective <= sol.objective) \
            else sol
        sol = _with_effort_of(better, sol if better is alt else alt, proven_optimal=alt.proven_optimal,
                              status=alt.status if alt.proven_optimal else better.status)
    # k = 0 is the plan without recompute: not a choice when the user pinned recompute
    if plan.recompute == "full" and job.pins.get("recompute") != "full":
        plain = plan.model_copy(update={"recompute": "none", "recompute_num_layers": None,
                                        "stage_recompute_layers": None})
        alt = solve(stage_problem(model, system, job, plain))
        # proven: each sub-problem solved whole, to optimality or proven infeasible
        proven = all(x.status in ("OPTIMAL", "INFEASIBLE") and x.window is None for x in (sol, alt))
        if alt.stage_layers is not None and (sol.stage_layers is None or alt.objective < sol.objective):
            sol, alt, plan = alt, sol, plain
        # the status of the two together: OPTIMAL only where both were proven
        status = "OPTIMAL" if proven and sol.stage_layers is not None else \
            ("FEASIBLE" if sol.status == "OPTIMAL" else sol.status)
        sol = _with_effort_of(sol, alt, proven_optimal=proven, status=status)
    if sol.stage_layers is None:
        return None, sol
    return plan_with_stages(plan, sol), sol


def few_splits(problem: StageProblem) -> bool:
    """Whether the layer splits (C(L−1, S−1) compositions) are few enough to search them all."""
    return math.comb(problem.layers - 1, problem.pp * problem.vpp - 1) <= FIXED_SEARCH_MAX_SPLITS


def mean_block_twin(problem: StageProblem) -> StageProblem:
    """A hybrid stack's per-block problem with every layer the pattern's mean block (its probed
    one); an interleaved MoE model's, every layer the mean of its dense and MoE layers."""
    # (without the DP exposure: the twin only places the window the per-block problem searches)
    twin = replace(problem, pattern="", kinds=(), a_k=(), b_k=(), w_k=(), x_k=(), p1_k=(), dp_zero=-1,
                   wf_k=(), wb_k=(), wbr_k=(), g1_k=(), e1_k=())
    if not problem.lead:
        return twin
    share = [problem.pattern.count(kind) / problem.layers for kind in problem.kinds]
    mean = lambda values: round(sum(f * x for f, x in zip(share, values)))  # noqa: E731
    return replace(twin, lead=0, a=max(1, mean(problem.a_k)), b=mean(problem.b_k), p1=mean(problem.p1_k),
                   w=tuple(mean(w) for w in problem.w_k), x=tuple(mean(x) for x in problem.x_k))


def _with_effort_of(sol: StageSolution, *others: StageSolution, **changes) -> StageSolution:
    """`sol` counting the variables, constraints and wall time of the solves `others` too."""
    return replace(sol, variables=sol.variables + sum(o.variables for o in others),
                   constraints=sol.constraints + sum(o.constraints for o in others),
                   wall_s=sol.wall_s + sum(o.wall_s for o in others), **changes)


def _solve_blocks(problem: StageProblem) -> StageSolution:
    """A hybrid stack's per-block problem. Few splits (as in solve_stages' fixed search): solved
    whole, proven. Else around the answer of its mean-block twin (the same problem with every layer
    the pattern's mean block, as the search costed hybrids before): each stage bound within
    BLOCK_WINDOW layers of the twin's, each solve within BLOCK_WORK_LIMIT of CP-SAT's
    deterministic time; optimal in that window at best, so not reported as proven. Where the twin
    has no split that fits, the per-block problem is searched whole, in BLOCK_WHOLE_WORK_LIMIT.
    The answer is then the most regular split that ties with it (smooth_split)."""
    near = None
    if few_splits(problem):
        sol = solve_stages(problem, TIME_LIMIT_S)
    else:
        mean = solve_stages(mean_block_twin(problem), TIME_LIMIT_S, work_limit=BLOCK_WORK_LIMIT)
        if mean.stage_layers is None:  # no mean-block split fits: the per-block problem whole, unhinted
            sol = _with_effort_of(solve_stages(problem, TIME_LIMIT_S, work_limit=BLOCK_WHOLE_WORK_LIMIT), mean)
        else:
            hint = (mean.stage_layers, mean.recompute_layers)
            near = (hint[0], BLOCK_WINDOW)
            sol = solve_stages(problem, TIME_LIMIT_S, hint=hint, work_limit=BLOCK_WORK_LIMIT, window=BLOCK_WINDOW)
            if sol.stage_layers is not None:  # a FEASIBLE answer's T and Pmax may be above its ranks' max
                sol = replace(sol, objective=block_objective(problem, sol.stage_layers, sol.recompute_layers))
            # CP-SAT's presolve may drop the hint: where its answer is worse than the hint's (or it
            # found none in its work limit), the hint stands
            at_hint = block_objective(problem, *hint)
            if at_hint is not None and (sol.objective is None or at_hint < sol.objective):
                sol = replace(sol, stage_layers=hint[0], recompute_layers=hint[1], status="FEASIBLE",
                              objective=at_hint)
            sol = _with_effort_of(sol, mean, proven_optimal=False, window=BLOCK_WINDOW)
    if sol.stage_layers is None:
        return sol
    smooth, at = smooth_split(problem, sol.stage_layers, sol.recompute_layers,
                              block_objective(problem, sol.stage_layers, sol.recompute_layers), near)
    return replace(sol, stage_layers=smooth, objective=at)


# block_objective evaluations smooth_split may spend (~40 us each on 88 blocks)
SMOOTH_MAX_EVALUATIONS = 4000


def _run_moves(split: list[int]):
    """(s, t, step) in smooth_split's order: bounds s..t move by `step` together, the shortest
    runs first, then from the first bound on."""
    for span in range(len(split) - 1):
        for s in range(1, len(split) - span):
            for step in (-1, 1):
                yield s, s + span, step


def smooth_split(problem: StageProblem, layers: tuple[int, ...], k: int, objective: int,
                 near: tuple[tuple[int, ...], int] | None = None) -> tuple[tuple[int, ...], int]:
    """Among the splits that tie with `layers` under block_objective (many do: a rank's time is
    the sum of its blocks, whichever of its chunks holds them), a more regular one, and its
    objective: bounds s..t move together by one layer (stage s-1 gains or gives a layer that
    stage t gives or gains, the stages between keep their counts), the first move in _run_moves'
    order kept that brings the split closer to the balanced one (sum of squared differences) at
    an objective of at most `objective`; until no move does, or SMOOTH_MAX_EVALUATIONS. `near` =
    (split, w): every bound stays within w layers of that split's (the window the solve
    searched). Deterministic."""
    target = balanced_layout(problem.layers, problem.pp, problem.vpp)
    ref = _bounds(near[0]) if near is not None else None

    def rough(split):
        return sum((a - b) ** 2 for a, b in zip(split, target))
    current, at, evaluations = list(layers), objective, 0
    moved = True
    while moved:
        moved, now, bounds = False, rough(current), _bounds(current)
        for s, t, step in _run_moves(current):
            if evaluations >= SMOOTH_MAX_EVALUATIONS:
                return tuple(current), at
            cand = current.copy()
            cand[s - 1] += step
            cand[t] -= step
            if min(cand[s - 1], cand[t]) < 1 or rough(cand) >= now:
                continue
            if ref is not None and any(abs(bounds[i] + step - ref[i]) > near[1] for i in range(s, t + 1)):
                continue
            evaluations += 1
            cost = block_objective(problem, tuple(cand), k)
            if cost is not None and cost <= objective:
                current, at, moved = cand, cost, True
                break
    return tuple(current), at


def _rank_counts(problem: StageProblem, layers: tuple[int, ...], k: int) -> tuple[list[int], ...]:
    """Per rank of a layer problem's split: layers N, leading dense layers D, recomputed layers K
    and recomputed leading dense layers DK (block recompute: a stage's first min(k, n_s))."""
    p = problem.pp
    N, D, K, DK = [0] * p, [0] * p, [0] * p, [0] * p
    before = 0
    for s, n in enumerate(layers):
        r = s % p
        d = min(n, max(0, problem.lead - before))
        N[r] += n
        D[r] += d
        K[r] += min(k, n)
        DK[r] += min(k, d)
        before += n
    return N, D, K, DK


def layer_objective(problem: StageProblem, layers: tuple[int, ...], k: int) -> int | None:
    """A layer problem's objective at a split and recompute count, as solve_stages poses it; None
    where a rank's memory exceeds the capacity."""
    N, D, K, DK = _rank_counts(problem, layers, k)
    a_d, b_d, p1_d = (problem.a_d, problem.b_d, problem.p1_d) if problem.lead else (problem.a, problem.b, problem.p1)
    w_d, x_d = (problem.w_d, problem.x_d) if problem.lead else (problem.w, problem.x)
    p = problem.pp
    times = [problem.a * N[r] + (a_d - problem.a) * D[r] + problem.b * K[r] + (b_d - problem.b) * DK[r]
             for r in range(p)]
    memory = [problem.c[r] + problem.w[r] * N[r] + (w_d[r] - problem.w[r]) * D[r] + problem.x[r] * K[r]
              + (x_d[r] - problem.x[r]) * DK[r] for r in range(p)]
    if max(memory) > problem.capacity:
        return None
    params = max(problem.p0[r] + problem.p1 * N[r] + (p1_d - problem.p1) * D[r] for r in range(p))
    slowest = max(times[r] + (problem.h if r == p - 1 else 0) for r in range(p))
    recomputed = problem.b * sum(K) + (b_d - problem.b) * sum(DK)
    exposed = _exposure_of(problem, _layer_rank_dp_terms(problem, N, D, K, DK)) if _dp_posed(problem) else 0
    return (problem.microbatches * problem.vpp - 1) * slowest + recomputed + problem.opt * params + exposed


def dp_exposure_floor(problem: StageProblem) -> int:
    """A lower bound of `dp_exposure_at` over every split: 0 with the collectives overlapped (a long
    enough window hides them), else each collective at no fewer bytes than the fullest rank has
    in any split (every rank holds >= vpp layers, and the ranks hold L layers between them)."""
    if problem.dp_zero < 0 or problem.pattern or problem.dp_hide or problem.e0:
        return 0  # (a MoE model's expert part: bounded by 0 too, not worth a tighter form)
    p, v, m, L = problem.pp, problem.vpp, problem.microbatches, problem.layers
    g1 = [min(a, b) for a, b in zip(problem.g1, problem.g1_d)] if problem.lead else list(problem.g1)
    G = [max(max(problem.g0[r][x] for r in range(p)) + g1[x] * v,
             math.ceil((sum(problem.g0[r][x] for r in range(p)) + g1[x] * L) / p)) for x in range(3)]
    G_ar, G_rs, G_ag = G
    return v * {0: G_ar, 1: G_rs + G_ag, 2: m * G_rs + G_ag}[problem.dp_zero]


def _dp_posed(problem: StageProblem) -> bool:
    return problem.dp_zero >= 0 and (not problem.pattern or bool(problem.g1_k))


def dp_exposure_at(problem: StageProblem, layers: tuple[int, ...], k: int) -> int:
    """`_dp_exposure` at a split and recompute count (vpp x seconds, in the problem's units); 0
    where the problem poses none."""
    if not _dp_posed(problem):
        return 0
    if problem.pattern:
        return _exposure_of(problem, _block_rank_dp_terms(problem, *_rank_blocks(problem, layers, k)))
    return _exposure_of(problem, _layer_rank_dp_terms(problem, *_rank_counts(problem, layers, k)))


def _exposure_of(problem: StageProblem, rank_terms: list[tuple]) -> int:
    """`_dp_exposure`'s value at the ranks' (collectives, forward window, backward window)."""
    p, v, m = problem.pp, problem.vpp, problem.microbatches
    alpha = (v - 1) * p + 1

    def overlapped(G_x, W):
        return max(0, G_x - W, v * G_x - alpha * W)

    def exposed(G, Wf, Wb):
        G_ar, G_rs, G_ag = G
        if not problem.dp_hide:
            return v * {0: G_ar, 1: G_rs + G_ag, 2: m * G_rs + G_ag}[problem.dp_zero]
        if problem.dp_zero == 0:
            return overlapped(G_ar, Wb)
        out = overlapped(G_rs, Wb) + overlapped(G_ag, Wf)
        return out + (v * (m - 1) * max(0, G_rs - Wb) if problem.dp_zero == 2 else 0)
    return max(exposed(*terms) for terms in rank_terms)


def _rank_blocks(problem: StageProblem, layers: tuple[int, ...], k: int) -> tuple[list, list]:
    """Per rank and block kind of a per-block problem's split: blocks held, blocks recomputed (a
    stage's first k)."""
    p, kinds = problem.pp, len(problem.kinds)
    held, recomputed = [[0] * kinds for _ in range(p)], [[0] * kinds for _ in range(p)]
    at = 0
    for s, n in enumerate(layers):
        for i, block in enumerate(problem.pattern[at:at + n]):
            j = problem.kinds.index(block)
            held[s % p][j] += 1
            if problem.recompute and i < k:
                recomputed[s % p][j] += 1
        at += n
    return held, recomputed


def block_objective(problem: StageProblem, layers: tuple[int, ...], k: int) -> int | None:
    """The per-block problem's objective at a split and recompute count (k per stage, its first
    blocks), block by block; None where a rank's memory exceeds the capacity."""
    p, kinds = problem.pp, range(len(problem.kinds))
    held, recomputed = _rank_blocks(problem, layers, k)
    memory = [problem.c[r] + sum(problem.w_k[r][j] * held[r][j] + problem.x_k[r][j] * recomputed[r][j] for j in kinds)
              for r in range(p)]
    if max(memory) > problem.capacity:
        return None
    times = [sum(problem.a_k[j] * held[r][j] + problem.b_k[j] * recomputed[r][j] for j in kinds) for r in range(p)]
    params = max(problem.p0[r] + sum(problem.p1_k[j] * held[r][j] for j in kinds) for r in range(p))
    slowest = max(times[r] + (problem.h if r == p - 1 else 0) for r in range(p))
    recompute_sum = sum(problem.b_k[j] * recomputed[r][j] for r in range(p) for j in kinds)
    exposed = _exposure_of(problem, _block_rank_dp_terms(problem, held, recomputed)) if _dp_posed(problem) else 0
    return (problem.microbatches * problem.vpp - 1) * slowest + recompute_sum + problem.opt * params + exposed


def _spread_over_chunks(layers: tuple[int, ...], p: int, v: int, lead: int) -> tuple[int, ...]:
    """Without recompute only a rank's total matters to the model (and which stages hold the
    leading dense layers): each rank's layers spread evenly over its chunks (Megatron's simplest
    flags; the same cost), except the stages that hold leading dense layers, kept as solved (the
    chunks' order places those), with the rank's other layers spread over its other chunks. The
    solver is indifferent between these splits; left alone it returned e.g. 1,25,1,1,... chunks."""
    out = list(layers)
    for r in range(p):
        stages = [c * p + r for c in range(v)]
        held = [s for s in stages if sum(layers[:s]) < lead]  # holds a leading dense layer
        free = [s for s in stages if s not in held]
        if not free:
            continue
        load = sum(layers[s] for s in free)
        if load < len(free):  # every stage keeps at least one layer: leave it as solved
            continue
        for s, n in zip(free, _even_chunks(load, len(free), r == 0)):
            out[s] = n
    return tuple(out)


def _even_chunks(n: int, v: int, short_first: bool) -> list[int]:
    q, e = divmod(n, v)
    chunks = [q + 1] * e + [q] * (v - e)
    return chunks[::-1] if short_first else chunks


def plan_with_stages(plan: Plan, solution: StageSolution) -> Plan:
    """`plan` with the solver's layout and recompute written into it."""
    fields = plan.model_dump()
    fields["stage_layers"] = solution.stage_layers
    if plan.recompute == "full":
        if solution.recompute_layers:
            fields["recompute_num_layers"] = None
            fields["stage_recompute_layers"] = solution.stage_recompute
        else:
            fields.update(recompute="none", recompute_num_layers=None, stage_recompute_layers=None)
    return Plan.model_validate(fields)


def default_stage_layers(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    return plan.stage_layers or balanced_layout(model.layers, plan.pp, plan.vpp)


__all__ = ["StageProblem", "StageSolution", "stage_problem", "solve_stages", "best_stages", "plan_with_stages",
           "smooth_split", "default_stage_layers", "SEED", "WORKERS"]
