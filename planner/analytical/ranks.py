"""Every pipeline rank of one plan: the layers it holds by kind, its microbatch time and HBM
(the same functions the model takes its worst rank from; for reports)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardware.spec import SystemSpec
from planner.analytical.hybrid import rank_excess_s
from planner.analytical.layer_kinds import dense_layer_spec
from planner.analytical.memory import rank_memory
from planner.analytical.plans import PlanArrays
from planner.analytical.time import per_layer_terms, rank_microbatch_s
from planner.model import ModelSpec
from planner.pipeline_layout import plan_layout
from planner.plan import JobSpec, Plan


@dataclass(frozen=True)
class RankRow:
    rank: int
    layers: int           # transformer layers on the rank (all its virtual stages)
    lead_layers: int      # of them, a MoE model's dense layers (leading or interleaved)
    recomputed: int       # layers recomputed in full
    microbatch_s: float   # one microbatch's forward + backward (+ LM head / MTP on the last rank)
    hbm_bytes: float

    def describe(self, model: ModelSpec, pp: int) -> str:
        moe = self.layers - self.lead_layers
        if model.moe:
            kinds = " + ".join(x for x in (f"{self.lead_layers} dense" if self.lead_layers else "",
                                           f"{moe} MoE" if moe or not self.lead_layers else "") if x)
        else:
            kinds = f"{self.layers}"
        extra = (["embedding"] if self.rank == 0 else []) + \
            ([f"{model.mtp_layers} MTP"] if self.rank == pp - 1 and model.mtp_layers else []) + \
            (["LM head"] if self.rank == pp - 1 else [])
        return kinds + "".join(f" + {x}" for x in extra)


def pipeline_ranks(model: ModelSpec, system: SystemSpec, job: JobSpec, plan: Plan) -> list[RankRow]:
    """One row per pipeline rank of `plan` (its layout written out, so every rank is costed)."""
    explicit = plan.model_copy(update={"stage_layers": plan_layout(plan, model.layers)})
    P = PlanArrays.from_plans([explicit], model.layers, dense_layer_spec(model))
    terms = per_layer_terms(model, system, job, P)
    times = rank_microbatch_s(terms, P, rank_excess_s(model, system, job, P, terms))[0]
    hbm = rank_memory(model, system, job, P, by_block=True)["hbm"][0]
    rows = {}
    for j, r in enumerate(P.rank_index[0].astype(int)):
        rows.setdefault(r, RankRow(r, int(P.rank_layers[0, j]), int(P.rank_lead_layers[0, j]),
                                   int(P.rank_recompute[0, j]), float(times[j]), float(np.asarray(hbm)[j])))
    return [rows[r] for r in range(plan.pp)]


__all__ = ["RankRow", "pipeline_ranks"]
