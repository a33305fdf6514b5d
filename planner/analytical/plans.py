"""Many plans as columns of numpy arrays: the shape the vectorized model and the search share."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from planner.plan import DP_IMPL_CODES, MOE_DISPATCHER_CODES, RECOMPUTE_CODES, Plan

RECOMPUTE_NAMES = {code: name for name, code in RECOMPUTE_CODES.items()}
DP_IMPL_NAMES = {code: name for name, code in DP_IMPL_CODES.items()}
DISPATCHER_NAMES = {code: name for name, code in MOE_DISPATCHER_CODES.items()}


@dataclass(frozen=True)
class PlanArrays:
    """One column per knob; row i is plan i. recompute: 0 none, 1 selective, 2 full;
    recompute_layers: layers per stage recomputed under full recompute, 0 = all (ignored otherwise)."""

    def full_recompute_layers(self, layers: int) -> np.ndarray:
        """Layers per stage that keep only their input (0 unless recompute is full)."""
        per_stage = layers / self.pp
        k = np.where(self.recompute_layers > 0, np.minimum(self.recompute_layers, per_stage), per_stage)
        return np.where(self.recompute == 2, k, 0.0)

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
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
    dp_impl: np.ndarray
    moe_dispatcher: np.ndarray
    cross_entropy_fusion: np.ndarray
    grad_reduce_in_bf16: np.ndarray
    fp8_param_gather: np.ndarray

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
            elif f.name == "etp":
                value = 0  # 0 = same as tp (Megatron's default), resolved below
            elif f.name == "dp_impl":
                value = DP_IMPL_CODES[default.dp_impl]
            elif f.name == "moe_dispatcher":
                value = MOE_DISPATCHER_CODES[default.moe_dispatcher]
            else:
                value = getattr(default, f.name)
            out[f.name] = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()
        out["etp"] = np.where(out["etp"] > 0, out["etp"], out["tp"])
        # 0 means "every layer of the stage"; a count above the stage's layers means the same
        all_layers = out["recompute_layers"] >= layers / out["pp"]
        out["recompute_layers"] = np.where(all_layers, 0.0, np.maximum(out["recompute_layers"], 0.0))
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
                elif name == "etp":
                    cols[name].append(p.etp or 0)
                elif name == "dp_impl":
                    cols[name].append(DP_IMPL_CODES[p.dp_impl])
                elif name == "moe_dispatcher":
                    cols[name].append(MOE_DISPATCHER_CODES[p.moe_dispatcher])
                else:
                    cols[name].append(float(getattr(p, name)))
        return cls.from_columns(len(plans), layers, **{k: np.array(v) for k, v in cols.items()})

    def row(self, i: int) -> Plan:
        """Plan i back as a pydantic Plan (for reports and Megatron emission)."""
        rc = RECOMPUTE_NAMES[int(self.recompute[i])]
        k = int(self.recompute_layers[i]) if rc == "full" and self.recompute_layers[i] > 0 else None
        return Plan(
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), cp=int(self.cp[i]),
            ep=int(self.ep[i]), etp=None if self.etp[i] == self.tp[i] else int(self.etp[i]),
            dp_impl=DP_IMPL_NAMES[int(self.dp_impl[i])],
            moe_dispatcher=DISPATCHER_NAMES[int(self.moe_dispatcher[i])], micro_batch=int(self.micro_batch[i]),
            global_batch=int(self.global_batch[i]), vpp=int(self.vpp[i]),
            sequence_parallel=bool(self.sequence_parallel[i]), recompute=rc,
            recompute_num_layers=k,
            zero_stage=int(self.zero_stage[i]), offload_weights=float(self.offload_weights[i]),
            offload_activations=float(self.offload_activations[i]),
            offload_optimizer=float(self.offload_optimizer[i]),
            tp_comm_overlap=bool(self.tp_comm_overlap[i]), dp_comm_overlap=bool(self.dp_comm_overlap[i]),
            cross_entropy_fusion=bool(self.cross_entropy_fusion[i]),
            grad_reduce_in_bf16=bool(self.grad_reduce_in_bf16[i]),
            fp8_param_gather=bool(self.fp8_param_gather[i]))

    def take(self, index: np.ndarray) -> "PlanArrays":
        return PlanArrays(**{f.name: getattr(self, f.name)[index] for f in fields(self)})
