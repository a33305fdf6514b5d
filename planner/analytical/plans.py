"""Many plans as columns of numpy arrays: the shape the vectorized model and the search share."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from planner.plan import RECOMPUTE_CODES, Plan

RECOMPUTE_NAMES = {code: name for name, code in RECOMPUTE_CODES.items()}


@dataclass(frozen=True)
class PlanArrays:
    """One column per knob; row i is plan i. recompute: 0 none, 1 selective, 2 full;
    recompute_layers: layers per stage recomputed under full recompute (ignored otherwise)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    vpp: np.ndarray
    sequence_parallel: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    zero_stage: np.ndarray
    offload_weights: np.ndarray
    offload_activations: np.ndarray
    offload_optimizer: np.ndarray
    tp_comm_overlap: np.ndarray
    dp_comm_overlap: np.ndarray

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_columns(cls, n: int, layers: int, **cols) -> "PlanArrays":
        """Columns given as arrays or scalars (broadcast to n rows); missing knobs take Plan defaults."""
        default = Plan()
        out = {}
        for f in fields(cls):
            if f.name in cols:
                value = cols[f.name]
            elif f.name == "recompute_layers":
                value = 0  # 0 = all layers of the stage, resolved below
            elif f.name == "recompute":
                value = RECOMPUTE_CODES[default.recompute]
            else:
                value = getattr(default, f.name)
            out[f.name] = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()
        layers_per_stage = layers / out["pp"]
        out["recompute_layers"] = np.where(out["recompute_layers"] <= 0, layers_per_stage,
                                           np.minimum(out["recompute_layers"], layers_per_stage))
        return cls(**out)

    @classmethod
    def from_plans(cls, plans: list[Plan], layers: int) -> "PlanArrays":
        cols: dict[str, list] = {f.name: [] for f in fields(cls)}
        for p in plans:
            for name in cols:
                if name == "recompute":
                    cols[name].append(RECOMPUTE_CODES[p.recompute])
                elif name == "recompute_layers":
                    cols[name].append(p.recompute_num_layers or 0)
                else:
                    cols[name].append(float(getattr(p, name)))
        return cls.from_columns(len(plans), layers, **{k: np.array(v) for k, v in cols.items()})

    def row(self, i: int) -> Plan:
        """Plan i back as a pydantic Plan (for reports and Megatron emission)."""
        layers_per_stage = None  # recompute_layers is stored resolved; keep None when it is "all"
        rc = RECOMPUTE_NAMES[int(self.recompute[i])]
        k = int(self.recompute_layers[i])
        return Plan(
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), cp=int(self.cp[i]),
            ep=int(self.ep[i]), micro_batch=int(self.micro_batch[i]),
            global_batch=int(self.global_batch[i]), vpp=int(self.vpp[i]),
            sequence_parallel=bool(self.sequence_parallel[i]), recompute=rc,
            recompute_num_layers=k if rc == "full" else layers_per_stage,
            zero_stage=int(self.zero_stage[i]), offload_weights=float(self.offload_weights[i]),
            offload_activations=float(self.offload_activations[i]),
            offload_optimizer=float(self.offload_optimizer[i]),
            tp_comm_overlap=bool(self.tp_comm_overlap[i]), dp_comm_overlap=bool(self.dp_comm_overlap[i]))

    def take(self, index: np.ndarray) -> "PlanArrays":
        return PlanArrays(**{f.name: getattr(self, f.name)[index] for f in fields(self)})
