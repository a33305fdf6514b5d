"""Co-design sweeps: the best plan at every point of a one- or two-parameter grid.

A sweep varies one or two of PARAMETERS (GPU count, HBM and offload capacity, offload bandwidth,
NVLink domain, model preset, batch cap) around a base (model, system, job) and runs
`planner.search.plan(..., top_k=1)` at every grid point, in local worker processes (default) or
on an existing Ray cluster. Results are rows (one per point) written as CSV and plotted (MFU and
step time vs the first parameter, one line per value of the second).

    spec = SweepSpec(model="megatron-1t", system="h100-sxm", gpus=4096,
                     axes=[Axis.parse("gpus", "4096:16384:x2"), Axis.parse("nvlink_domain", "8,16")])
    rows = run_sweep(spec, workers=2)
    write_csv(rows, spec, "out/sweep.csv"); plot(rows, spec, "out/sweep")

Value syntax (CLI and `Axis.parse`): a comma list "8,16,32"; a geometric range
"4096:16384:x2" (start, stop inclusive, factor); an arithmetic range "256:2048:256" (start, stop
inclusive, step). offload_gb_per_s accepts "inf" (infinite bandwidth: modelled as
INFINITE_GB_PER_S, reported as inf); offload_gib 0 removes the offload tier.
"""
from __future__ import annotations

import csv
import math
import os
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hardware.errors import SpecError, finite_number, one_line, shortened
from hardware.load import load_system
from hardware.spec import GIB, SystemSpec
from planner.model import ModelSpec, load_model
from planner import processes
from planner.plan import JobSpec

PARAMETERS: dict[str, str] = {
    "gpus": "GPUs",
    "hbm_gib": "HBM per GPU (GiB)",
    "offload_gib": "offload capacity per GPU (GiB)",
    "offload_gb_per_s": "offload bandwidth per GPU (GB/s)",
    "nvlink_domain": "NVLink domain (GPUs)",
    "model": "model",
    "max_batch": "max global batch (sequences)",
}
INTEGER_PARAMETERS = ("gpus", "nvlink_domain", "max_batch")
ALLOWED = ", ".join(PARAMETERS)
INFINITE_GB_PER_S = 1.0e6          # "infinite" offload bandwidth: 1 PB/s per GPU, never the bottleneck
DEFAULT_OFFLOAD_GB_PER_S = 100.0   # bandwidth of an offload tier the sweep adds to a system without one
DEFAULT_OFFLOAD_GIB = 1024.0       # capacity of a tier added when only the bandwidth is varied
MAX_POINTS = 1000
# Points of a two-parameter grid (each is one search, seconds to a minute): a day's work at most.
MAX_GRID_POINTS = 10_000
# Far beyond any real machine: a geometric range that runs past these is refused before any work.
MAX_VALUE = {"gpus": 1 << 20, "nvlink_domain": 1 << 20, "max_batch": 1 << 20, "hbm_gib": 1e6,
             "offload_gib": 1e9, "offload_gb_per_s": INFINITE_GB_PER_S}

ParamName = Literal["gpus", "hbm_gib", "offload_gib", "offload_gb_per_s", "nvlink_domain", "model",
                    "max_batch"]

# Columns of a result row, in CSV order (after the varied parameters).
# the columns an infeasible point fills (the rest are empty)
INFEASIBLE_ROW_COLUMNS = ("model", "system", "num_gpus", "feasible", "reason", "search_s")
RESULT_COLUMNS = [
    "model", "system", "num_gpus", "feasible", "plan", "tp", "pp", "dp", "cp", "ep", "vpp",
    "micro_batch", "global_batch", "recompute", "zero_stage", "offload_weights",
    "offload_activations", "offload_optimizer", "step_time_s", "mfu", "tokens_per_s",
    "hbm_used_gib", "offload_used_gib", "reason", "search_s", "plan_json",
]


# ---------------------------------------------------------------------------------------------
# the spec
# ---------------------------------------------------------------------------------------------

def _bad(msg: str) -> SpecError:
    return SpecError(f"vary: {msg}")


def _number(name: str, text: str) -> float:
    t = text.strip().lower()
    if t in ("inf", "infinity", "∞"):
        if name != "offload_gb_per_s":
            raise _bad(f"{name}: 'inf' is only allowed for offload_gb_per_s")
        return math.inf
    try:
        value = float(t)
    except ValueError:
        value = math.nan
    # float() also reads other scripts' digits ('١٦') and '_' separators ('1_6'); the CLI's number
    # options take neither
    if math.isnan(value) or not t.isascii() or "_" in t:
        raise _bad(f"{name}: {shortened(text.strip())!r} is not a number (in ASCII digits, no '_')")
    return 0.0 if value == 0 else value  # -0.0 is 0: one value, written "0"


def _parse_range(name: str, text: str) -> list[float]:
    parts = text.split(":")
    shown = shortened(text)
    if len(parts) != 3:
        raise _bad(f"{name}: range {shown!r} must be START:STOP:STEP or START:STOP:xFACTOR")
    start, stop = _number(name, parts[0]), _number(name, parts[1])
    step_text = parts[2].strip().lower()
    if not math.isfinite(start) or not math.isfinite(stop):
        raise _bad(f"{name}: range {shown!r} needs finite ends")
    if stop < start:
        raise _bad(f"{name}: range {shown!r} is empty (stop < start)")
    values: list[float] = []
    if step_text.startswith(("x", "*")):
        factor = _number(name, step_text[1:])
        if not factor > 1:
            raise _bad(f"{name}: range {shown!r} needs a factor > 1")
        if start <= 0:
            raise _bad(f"{name}: geometric range {shown!r} needs a positive start")
        v = start
        while v <= stop * (1 + 1e-12):
            values.append(v)
            v *= factor
            if len(values) > MAX_POINTS:
                raise _bad(f"{name}: range {shown!r} has more than {MAX_POINTS} values")
    else:
        step = _number(name, step_text.lstrip("+"))
        if not step > 0:
            raise _bad(f"{name}: range {shown!r} needs a step > 0")
        steps = (stop - start) / step  # inf for a subnormal step (1e-320): too many values, not an overflow
        n = int(math.floor(steps + 1e-9)) + 1 if math.isfinite(steps) else math.inf
        if n > MAX_POINTS:
            raise _bad(f"{name}: range {shown!r} has more than {MAX_POINTS} values")
        values = [start + i * step for i in range(n)]
    return values


def _check_value(name: str, v: float) -> float | int:
    if name in INTEGER_PARAMETERS:
        if not float(v).is_integer():
            raise _bad(f"{name}: {v:g} is not an integer")
        if v < 1:
            raise _bad(f"{name}: must be positive, got {int(v)}")
        if v > MAX_VALUE[name]:
            raise _bad(f"{name}: {v:g} is beyond the largest allowed value {MAX_VALUE[name]:,}")
        return int(v)
    if math.isfinite(v) and v > MAX_VALUE[name]:
        raise _bad(f"{name}: {v:g} is beyond the largest allowed value {MAX_VALUE[name]:g}")
    if name == "offload_gib":
        if v < 0:
            raise _bad(f"offload_gib: must be >= 0 (0 = no offload tier), got {v:g}")
    elif not v > 0:
        raise _bad(f"{name}: must be positive, got {v:g}")
    return float(v)


class Axis(BaseModel):
    """One varied parameter and its values, in sweep order."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: ParamName
    values: list[Any] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _no_duplicates(cls, values: list) -> list:
        if len(set(map(str, values))) != len(values):
            raise ValueError("values must not repeat")
        return values

    @classmethod
    def parse(cls, name: str, text: str) -> "Axis":
        """'gpus', '4096:16384:x2' -> Axis; comma lists and ranges may be mixed ('8,16:64:x2')."""
        name = name.strip()
        if name not in PARAMETERS:
            raise _bad(f"unknown parameter {shortened(name)!r}; allowed: {ALLOWED}")
        items = [t.strip() for t in text.split(",")]
        if not any(items):
            raise _bad(f"{name}: no values given (e.g. {name}=" + _EXAMPLES[name] + ")")
        if not all(items):
            raise _bad(f"{name}: an empty value in {shortened(text)!r} (e.g. {name}=" + _EXAMPLES[name] + ")")
        if name == "model":
            values: list = []
            for item in items:
                if ":" in item and not Path(item).exists():
                    raise _bad("model: takes a comma list of presets or model files, not a range")
                values.append(item)
        else:
            values = []
            for item in items:
                raw = _parse_range(name, item) if ":" in item else [_number(name, item)]
                values.extend(_check_value(name, v) for v in raw)
        if len(values) > MAX_POINTS:
            raise _bad(f"{name}: more than {MAX_POINTS} values")
        if len(set(map(str, values))) != len(values):
            raise _bad(f"{name}: a value is repeated in {shortened(text)!r}")
        if name == "model":  # one file named two ways (m.yaml, ./m.yaml) is one model, swept once
            from planner.planfile import is_preset
            files = [Path(v).resolve() for v in values if not is_preset(v, "model") and Path(v).is_file()]
            if len(set(files)) != len(files):
                raise _bad(f"model: a file is named twice in {shortened(text)!r} (the same file by two paths)")
        return cls(name=name, values=values)

    @classmethod
    def from_cli(cls, spec: str) -> "Axis":
        """'name=values' as given to `planner sweep --vary`."""
        if "=" not in spec:
            raise _bad(f"{shortened(spec)!r} must look like NAME=VALUES (e.g. gpus=4096,8192); "
                       f"allowed names: {ALLOWED}")
        name, text = spec.split("=", 1)
        return cls.parse(name, text)


_EXAMPLES = {"gpus": "4096:16384:x2", "hbm_gib": "80,120", "offload_gib": "256,512,1024,2048",
             "offload_gb_per_s": "50,100,inf", "nvlink_domain": "8,16", "model": "seed-2t,seed-4t",
             "max_batch": "1536,3072"}


class SweepSpec(BaseModel):
    """Base inputs (model/system presets or files, job) and one or two varied parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str | None = Field(default=None, description="preset or YAML; None when 'model' is varied")
    system: str
    gpus: int | None = Field(default=None, description="override of the system's GPU count")
    seq_length: int | None = None
    job: JobSpec = JobSpec()
    axes: list[Axis] = Field(min_length=1, max_length=2)
    time_limit_s: float = Field(default=30.0, gt=0, description="CP-SAT limit per point")
    explain: bool = Field(default=True, description="run search.check at infeasible points for the reason")

    @classmethod
    def build(cls, **fields) -> "SweepSpec":
        """Validate with one-line errors (the CLI's entry point)."""
        axes = fields.get("axes") or []
        if not axes:
            raise _bad(f"give one or two parameters to vary (--vary NAME=VALUES); allowed: {ALLOWED}")
        if len(axes) > 2:
            raise _bad(f"at most two parameters may be varied, got {len(axes)}; allowed: {ALLOWED}")
        names = [a.name for a in axes]
        if len(set(names)) != len(names):
            raise _bad(f"parameter {names[0]!r} is varied twice; allowed: {ALLOWED}")
        if "model" in names and fields.get("model"):
            raise _bad("give the model either with --model or with --vary model=..., not both")
        if "model" not in names and not fields.get("model"):
            raise SpecError("model: required (--model PRESET, or --vary model=A,B)")
        try:
            return cls.model_validate(fields)
        except ValidationError as err:
            raise one_line(err, "sweep") from None

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.axes]

    def grid(self) -> list[dict]:
        """Every point as {name: value}, the first parameter varying fastest within each line."""
        if len(self.axes) == 1:
            return [{self.axes[0].name: v} for v in self.axes[0].values]
        a, b = self.axes
        if len(a.values) * len(b.values) > MAX_GRID_POINTS:  # each point is a search: days of work
            raise _bad(f"{a.name} x {b.name}: {len(a.values)} x {len(b.values)} = {len(a.values) * len(b.values):,} "
                       f"points; at most {MAX_GRID_POINTS:,} in one sweep")
        return [{a.name: va, b.name: vb} for vb in b.values for va in a.values]


# ---------------------------------------------------------------------------------------------
# grid points -> inputs of the search
# ---------------------------------------------------------------------------------------------

class Point(BaseModel):
    """The fully built inputs of one grid point (what a worker receives)."""

    model_config = ConfigDict(frozen=True)
    index: int
    params: dict[str, Any]
    model: ModelSpec
    system: SystemSpec
    job: JobSpec
    time_limit_s: float = 30.0
    explain: bool = True


def _validated_system(base: SystemSpec, changes: dict, where: str) -> SystemSpec:
    try:
        return base.with_changes(**changes)
    except ValidationError as err:
        raise one_line(err, where) from None


def apply_params(model: ModelSpec | None, system: SystemSpec, job: JobSpec, params: dict,
                 seq_length: int | None = None) -> tuple[ModelSpec, SystemSpec, JobSpec]:
    """The (model, system, job) variant of one grid point, re-validated."""
    where = "vary " + ", ".join(f"{k}={sweep_value_text(v)}" for k, v in params.items())
    if "model" in params:
        model = load_model(str(params["model"]), {"seq_length": seq_length})
    assert model is not None
    changes: dict = {}
    if "gpus" in params:
        changes["num_gpus"] = int(params["gpus"])
    if "hbm_gib" in params:
        if float(params["hbm_gib"]) <= job.hbm_reserve_gib:  # the search would refuse it mid-sweep
            raise SpecError(f"vary: hbm_gib={params['hbm_gib']:g} leaves nothing beside the HBM reserve "
                            f"(--hbm-reserve-gib {job.hbm_reserve_gib:g}); allowed: above {job.hbm_reserve_gib:g}")
        changes["accelerator"] = {**system.accelerator.model_dump(), "hbm_capacity_gib": float(params["hbm_gib"])}
    if "nvlink_domain" in params:
        tiers = [t.model_dump() for t in system.network]
        tiers[0]["domain_gpus"] = domain = int(params["nvlink_domain"])
        # a domain as large as the next tier's takes its place (those GPUs talk over NVLink); a larger
        # one is refused by the tiers' nesting rule
        changes["network"] = [tiers[0], *(t for t in tiers[1:] if t["domain_gpus"] != domain)]
    if "offload_gib" in params or "offload_gb_per_s" in params:
        tier = system.offload.model_dump() if system.offload else {
            "name": "sweep-offload", "capacity_gib": DEFAULT_OFFLOAD_GIB,
            "bandwidth_gb_per_s": DEFAULT_OFFLOAD_GB_PER_S}
        if "offload_gb_per_s" in params:
            bw = float(params["offload_gb_per_s"])
            tier["bandwidth_gb_per_s"] = INFINITE_GB_PER_S if math.isinf(bw) else bw
        if "offload_gib" in params:
            tier["capacity_gib"] = float(params["offload_gib"])
        changes["offload"] = tier if tier["capacity_gib"] > 0 else None
    if changes:
        system = _validated_system(system, changes, where)
    if "max_batch" in params:
        mb = int(params["max_batch"])
        if job.global_batch and job.global_batch > mb:
            raise SpecError(f"{where}: the fixed global batch {job.global_batch} exceeds max_batch {mb}")
        job = job.model_copy(update={"max_global_batch": mb})
    if "hbm_gib" not in params:  # (a varied HBM is named above) the search would refuse it mid-sweep
        from planner.analytical.estimate import check_hbm_reserve
        check_hbm_reserve(job, system)
    return model, system, job


def build_points(spec: SweepSpec) -> list[Point]:
    """Load the base inputs and build every grid point up front (so bad values fail before any work)."""
    system = load_system(spec.system, spec.gpus)
    model = load_model(spec.model, {"seq_length": spec.seq_length}) if spec.model else None
    points = []
    for i, params in enumerate(spec.grid()):
        m, s, j = apply_params(model, system, spec.job, params, spec.seq_length)
        points.append(Point(index=i, params=params, model=m, system=s, job=j,
                            time_limit_s=spec.time_limit_s, explain=spec.explain))
    return points


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------

def result_row(params: dict, model: ModelSpec, system: SystemSpec, best, reason: str = "",
               search_s: float = 0.0) -> dict:
    """One CSV row from the best Ranked (or None) of `search.plan`."""
    row: dict = dict(params)
    row.update({"model": params.get("model", model.name), "system": system.name, "num_gpus": system.num_gpus,
                "feasible": best is not None, "reason": reason, "search_s": round(search_s, 3)})
    if best is None:
        for col in RESULT_COLUMNS:
            row.setdefault(col, "")
        return row
    p, e = best.plan, best.estimate
    row.update({
        "plan": p.short(), "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "vpp": p.vpp,
        "micro_batch": p.micro_batch, "global_batch": p.global_batch, "recompute": p.recompute,
        "zero_stage": p.zero_stage, "offload_weights": p.offload_weights,
        "offload_activations": p.offload_activations, "offload_optimizer": p.offload_optimizer,
        "step_time_s": e.step_time_s, "mfu": e.mfu, "tokens_per_s": e.tokens_per_s,
        "hbm_used_gib": e.hbm_bytes / GIB, "offload_used_gib": e.offload_bytes / GIB, "reason": "",
        # every field of the plan (SP, overlaps, etp, the stage layout, ...): the row reproduces as
        # a plan file's `plan:` mapping, which the `plan` string's short form does not
        "plan_json": p.model_dump_json(exclude_defaults=True),
    })
    return row


def evaluate_point(point: Point) -> dict:
    """Best plan at one grid point (runs in a worker process or a Ray task)."""
    from planner import search

    t0 = time.perf_counter()
    result = search.plan(point.model, point.system, point.job, top_k=1, time_limit_s=point.time_limit_s)
    reason = ""
    if result.best is None:
        if point.explain:
            checked = search.check(point.model, point.system, point.job)
            reason = " | ".join(checked.reasons) or "no plan fits"
        else:
            reason = f"no plan fits (search status {result.stats.get('status', '?')})"
    row = result_row(point.params, point.model, point.system, result.best, reason,
                     time.perf_counter() - t0)
    row["_index"] = point.index
    return row


Progress = Callable[[dict], None]


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def run_points(points: list[Point], workers: int | None = None, ray_address: str | None = None,
               on_result: Progress | None = None) -> list[dict]:
    """Evaluate every point (in grid order in the result); `on_result` is called as each finishes."""
    if ray_address:
        rows = _run_ray(points, ray_address, on_result)
    else:
        workers = default_workers() if workers is None else workers
        if workers < 1:
            raise SpecError(f"workers: must be a positive integer, got {workers}")
        rows = _run_local(points, workers, on_result)
    rows.sort(key=lambda r: r["_index"])
    for r in rows:
        r.pop("_index", None)
    return rows


def _run_local(points: list[Point], workers: int, on_result: Progress | None) -> list[dict]:
    rows = []
    if workers == 1 or len(points) <= 1:
        for p in points:
            rows.append(evaluate_point(p))
            if on_result:
                on_result(rows[-1])
        return rows
    pool = processes.worker_pool(min(workers, len(points)))
    try:
        futures = [pool.submit(evaluate_point, p) for p in points]
        for fut in as_completed(futures):
            rows.append(fut.result())
            if on_result:
                on_result(rows[-1])
    except BaseException:
        processes.end_now(pool)  # Ctrl-C or a failed point: do not wait for the running points (minutes)
        raise
    pool.shutdown(wait=True)
    return rows


def import_ray():
    try:
        import ray  # noqa: PLC0415  (optional dependency, imported lazily)
    except ImportError:
        raise SpecError("ray: not installed; `pip install ray` to run sweeps on a Ray cluster "
                        "(or drop --ray to use local processes)") from None
    return ray


def _run_ray(points: list[Point], address: str, on_result: Progress | None) -> list[dict]:
    ray = import_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise SpecError(f"ray: cannot connect to {address!r}: {str(exc).splitlines()[0]}") from None
    task = ray.remote(evaluate_point)
    pending = [task.remote(p) for p in points]
    rows = []
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            rows.append(ray.get(ref))
            if on_result:
                on_result(rows[-1])
    return rows


def run_sweep(spec: SweepSpec, workers: int | None = None, ray_address: str | None = None,
              on_result: Progress | None = None) -> list[dict]:
    return run_points(build_points(spec), workers, ray_address, on_result)


# ---------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------

def columns(spec: SweepSpec) -> list[str]:
    return [n for n in spec.names if n != "model"] + RESULT_COLUMNS


def sweep_value_text(v, every_digit: bool = False) -> str:
    """A grid or result value as the outputs print it: 6 significant digits (`every_digit`: the
    shortest text that reads back as the same float, as `--json` and `planner plan` give it),
    40 not 40.0, inf."""
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if not every_digit:
            return f"{v:.6g}"
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
    return str(v)


def write_csv(rows: list[dict], spec: SweepSpec, path: str | Path) -> Path:
    """The grid values as the console shows them; the results at full precision (6 significant
    digits had cut the step time a point's `planner plan` gives and written 1.61081e+06 tokens/s)."""
    path = Path(path)
    cols = columns(spec)
    grid = set(spec.names) - {"model"}
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            w.writerow([sweep_value_text(r.get(c, ""), every_digit=c not in grid) for c in cols])
    return path


# The point log's record that the outputs are being written (PointLog.mark_writing).
WRITING_MARK = {"writing_outputs": True}


def resolved_inputs(spec: SweepSpec) -> dict:
    """The model(s) and system a sweep's names resolve to, as JSON: its resume key beside the
    names (a preset or file read again, whatever it now says)."""
    import json
    models = [spec.model] if spec.model else next(a.values for a in spec.axes if a.name == "model")
    return {"models": [json.loads(load_model(m).model_dump_json()) for m in models],
            "system": json.loads(load_system(spec.system, spec.gpus).model_dump_json())}


def _first_difference(logged, now, path: str = "") -> str:
    """Where a point log's header and this sweep's inputs first differ, as 'sweep.time_limit_s 5 ->
    6' (the log's value, then this run's); 'other inputs' where no one field says it."""
    import json
    if isinstance(logged, dict) and isinstance(now, dict):
        for key in [*logged, *(k for k in now if k not in logged)]:
            if logged.get(key) != now.get(key):
                return _first_difference(logged.get(key), now.get(key), f"{path}.{key}" if path else str(key))
    if isinstance(logged, list) and isinstance(now, list) and len(logged) == len(now):
        for i, (a, b) in enumerate(zip(logged, now)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    if not path:
        return "other inputs"
    def shown(v) -> str:
        text = "(none)" if v is None else json.dumps(v)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"{path}: {shown(logged)} in the log, {shown(now)} now"


class PointLog:
    """Finished points, one JSON line each, appended as they complete (`NAME.points.jsonl`).

    A killed sweep keeps every finished point; a rerun with the same inputs skips them. The first
    line records the sweep's inputs, so a log of a different sweep is never mixed in. Opened (and
    so checked writable) before any point runs. A log that is not one this sweep wrote (a line
    that is not JSON, not a point of this grid, or lacks a result column) is refused in one line
    and left as it is: resuming from it would crash or mix wrong rows into the outputs."""

    def __init__(self, path: Path, spec: SweepSpec, force: bool):
        import json
        self.path = path
        self.spec = spec
        # the model and system as read, not their names: a file edited between the runs is another
        # sweep (resumed, its finished points were of the old file)
        self.header = {"sweep": json.loads(spec.model_dump_json()), "inputs": resolved_inputs(spec)}
        self.done: dict[str, dict] = {}
        # the sweep had begun writing its outputs (WRITING_MARK): any there are its own, half-written
        self.writing = False
        self._cut_at: int | None = None  # where a record cut by a kill starts (dropped before appending)
        self._unterminated = False       # the last line is complete but lacks its "\n"
        refuse_special_file(path)  # before reading it: opening a FIFO would wait for a writer forever
        if force and path.is_file():
            path.unlink()
        if path.is_file():
            self._load()
        try:
            if self._cut_at is not None:
                os.truncate(path, self._cut_at)
            new = not path.is_file() or path.stat().st_size == 0
            self._fh = path.open("a", encoding="utf-8")
            if self._unterminated:
                self._fh.write("\n")  # else the next record would join the last line
            if new:
                self._write(self.header)
        except OSError as exc:
            raise SpecError(f"out: cannot write {path} ({exc.strerror})") from None

    def _malformed(self, line: int, problem: str) -> SpecError:
        return SpecError(f"out: {self.path} line {line}: {problem}, so it is not this sweep's point log; "
                         "delete it (or pass --force) to start afresh, or choose another --out")

    def _load(self) -> None:
        import json
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"out: cannot read {self.path} ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            line = self.path.read_bytes()[:exc.start].count(b"\n") + 1
            raise self._malformed(line, "not UTF-8 text") from None
        lines = text.split("\n")
        last = lines.pop()  # "" when the file ends with a newline, as every record written here does
        if last:
            try:
                json.loads(last)
                lines.append(last)
                self._unterminated = True
            except ValueError:
                # a record cut by a kill mid-write starts as one; with no line before it, only as
                # this sweep's header does (anything else there is someone's file, not a log)
                if not last.startswith("{") or (not lines and not json.dumps(self.header).startswith(last)):
                    raise self._malformed(len(lines) + 1, "not JSON") from None
                # a record cut by a kill mid-write: dropped (that point runs again)
                self._cut_at = len(text.encode("utf-8")) - len(last.encode("utf-8"))
        if not lines:
            return  # empty (killed before its header was written): a fresh log
        records = []
        for number, line in enumerate(lines, start=1):
            try:
                records.append(json.loads(line))
            except ValueError:
                raise self._malformed(number, "not JSON") from None
        header = records[0]
        if not (isinstance(header, dict) and "sweep" in header):
            raise self._malformed(1, 'not the header {"sweep": ...} that records the sweep\'s inputs')
        if header != self.header:
            raise SpecError(f"out: {self.path} holds the points of a different sweep ({_first_difference(header, self.header)}); "
                            "pass --force to start over, or another --name")
        grid = {point_key(params) for params in self.spec.grid()}
        for number, record in enumerate(records[1:], start=2):
            if record == WRITING_MARK:
                self.writing = True
                continue
            problem = self._record_problem(record, grid)
            if problem:
                raise self._malformed(number, problem)
            if point_key(record["_params"]) in self.done:
                raise self._malformed(number, f"the point {json.dumps(record['_params'])[:60]} is logged twice")
            self.done[point_key(record["_params"])] = record

    def _record_problem(self, record, grid: set[str]) -> str | None:
        """What keeps `record` from being a finished point of this grid (the outputs read every
        column, the plot and table these as numbers), else None."""
        import json
        names = self.spec.names
        if not isinstance(record, dict):
            return f"expected a point record (a JSON object), got {json.dumps(record)[:40]}"
        params = record.get("_params")
        if not isinstance(params, dict) or point_key(params) not in grid:
            return (f"_params {json.dumps(params)[:60]} is not a point of this sweep's grid "
                    f"(an object of {', '.join(names)})")
        missing = [c for c in [*names, *RESULT_COLUMNS] if c not in record]
        if missing:
            return f"the point record lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
        if any(record[n] != params[n] for n in names):
            return "the point record's parameters differ from its _params"
        if not isinstance(record["feasible"], bool):
            return "feasible must be true or false"
        if not isinstance(record["reason"], str) or (record["feasible"] and not isinstance(record["plan"], str)):
            return "plan and reason must be strings"
        if not (finite_number(record["search_s"]) and record["search_s"] >= 0):
            return "search_s must be a finite non-negative number"
        if not record["feasible"]:  # an infeasible point has no plan: `result_row` leaves its columns empty
            filled = [c for c in RESULT_COLUMNS if c not in INFEASIBLE_ROW_COLUMNS and c not in names
                      and record[c] != ""]
            return f"{filled[0]} must be empty for an infeasible point" if filled else None
        numeric = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch", "zero_stage",
                   "offload_weights", "offload_activations", "offload_optimizer", "step_time_s", "mfu",
                   "tokens_per_s", "hbm_used_gib", "offload_used_gib")
        bad = [c for c in numeric if not (finite_number(record[c]) and record[c] >= 0)]
        if bad:
            return f"{bad[0]} must be a finite non-negative number"
        # the layout columns are the plan string's (Plan.short: "tp1 pp2 dp8 cp2 ep8 ...")
        # (cp and ep are written only above 1)
        named = [f"{k}{int(record[k])}" for k in ("tp", "pp", "dp", "cp", "ep")
                 if k in ("tp", "pp", "dp") or record[k] > 1]
        stated = [word for word in named if word not in record["plan"].split()]
        if stated:
            return f"its columns ({', '.join(stated)}) differ from its plan {record['plan'][:40]!r}"
        return None

    def _write(self, record: dict) -> None:
        import json
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()  # a killed process keeps what is flushed

    def add(self, row: dict, params: dict) -> None:
        self._write({**{k: v for k, v in row.items() if k != "_index"}, "_params": params})

    def mark_writing(self) -> None:
        """Logged before the outputs are written: a rerun after a kill mid-write may replace them."""
        self._write(WRITING_MARK)

    def close(self, remove: bool = False) -> None:
        self._fh.close()
        if remove:
            self.path.unlink(missing_ok=True)


def point_key(params: dict) -> str:
    import json
    return json.dumps(params, sort_keys=True)


def output_paths(out_dir: str | Path, name: str = "sweep") -> dict[str, Path]:
    out = Path(out_dir)
    return {ext: out / f"{name}.{ext}" for ext in ("csv", "png", "svg")}


def refuse_inputs_as_outputs(outputs: list[Path], inputs: dict[str, list[str]]) -> None:
    """An output path that is one of the sweep's input files (`--force` overwrites outputs, never
    the model or system it reads, nor the accelerator file a system file names): {flag:
    references} of the inputs, presets left out."""
    from hardware.load import accelerator_file_of
    from planner.planfile import is_preset
    written = {p.resolve() for p in outputs}
    for flag, refs in inputs.items():
        for ref in refs:
            if not ref or is_preset(ref, "system" if flag == "--system" else "model"):
                continue
            named = [(Path(ref), f"the {flag} input")]
            if flag == "--system":
                accelerator = accelerator_file_of(ref)
                named += [(accelerator, f"the accelerator file of --system {ref}")] if accelerator else []
            for path, what in named:
                if path.resolve() in written:
                    raise SpecError(f"out: {path} is {what} and would be overwritten; choose another --out or --name")


def refuse_overwrite(paths: dict[str, Path], force: bool) -> None:
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not force:
        raise SpecError(f"out: {existing[0]} already exists (a finished sweep: only an interrupted one, whose "
                        "point log is still there, resumes); read it, or pick another --out/--name, or pass "
                        "--force to overwrite")
    for p in paths.values():
        refuse_special_file(p)


def refuse_special_file(p: Path) -> None:
    """An output (or the point log) that is not a plain file of the sweep's own: a FIFO would block
    the sweep, a folder or device cannot take it, and a symbolic link would have the sweep write
    into whatever file it points at."""
    if p.exists() and not p.is_file():
        raise SpecError(f"out: {p} exists and is not a file")
    if p.is_symlink():  # --force overwrites the sweep's own files, not what a link points at
        raise SpecError(f"out: {p} is a symbolic link; remove it or pick another --out/--name")


def _label(name: str, v) -> str:
    if name == "offload_gib" and v == 0:
        return "no offload tier"
    if name == "offload_gb_per_s" and isinstance(v, float) and math.isinf(v):
        return "∞ GB/s"
    unit = {"hbm_gib": " GiB", "offload_gib": " GiB", "offload_gb_per_s": " GB/s", "gpus": " GPUs",
            "nvlink_domain": "-GPU NVLink", "max_batch": " max batch"}.get(name, "")
    return f"{sweep_value_text(v)}{unit}"


def _title(spec: SweepSpec, rows: list[dict]) -> str:
    fixed = []
    if spec.model:
        fixed.append(rows[0]["model"] if rows else spec.model)
    sysname = rows[0]["system"] if rows else spec.system
    fixed.append(sysname)
    if "gpus" not in spec.names and rows:
        fixed.append(f"{rows[0]['num_gpus']} GPUs")
    fixed.append(f"framework {spec.job.framework}")
    batch = f"batch {spec.job.global_batch}" if spec.job.global_batch else f"batch ≤ {spec.job.max_global_batch}"
    if "max_batch" not in spec.names or spec.job.global_batch:
        fixed.append(batch)
    varied = " and ".join(PARAMETERS[n] for n in spec.names)
    return f"Best plan vs {varied}\n" + ", ".join(fixed)


def plot(rows: list[dict], spec: SweepSpec, stem: str | Path) -> tuple[Path, Path]:
    """MFU (top) and step time (bottom) vs the first parameter, one line per second-parameter value.
    Writes stem.png and stem.svg."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xname = spec.axes[0].name
    xvals = spec.axes[0].values
    categorical = xname == "model" or any(isinstance(v, float) and math.isinf(v) for v in xvals)
    positions = list(range(len(xvals))) if categorical else [float(v) for v in xvals]
    lines = spec.axes[1].values if len(spec.axes) == 2 else [None]
    lname = spec.axes[1].name if len(spec.axes) == 2 else None

    def key(v):
        return sweep_value_text(v) if not isinstance(v, str) else v

    by_point = {}
    for r in rows:
        by_point[(key(r[xname]), key(r[lname]) if lname else None)] = r

    # names are the user's text (a model called "run_$1_$2"): no $...$ mathtext in any label,
    # tick labels included (made when the figure is drawn, so the whole drawing is inside)
    with plt.rc_context({"text.parse_math": False}):
        fig, (ax_mfu, ax_t) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
        infeasible = 0
        markers = "osD^v<>p*h"
        for li, lv in enumerate(lines):
            mfu, st = [], []
            for xv in xvals:
                r = by_point.get((key(xv), key(lv) if lname else None))
                ok = r is not None and r["feasible"]
                infeasible += 0 if ok else 1
                mfu.append(100 * r["mfu"] if ok else math.nan)
                st.append(r["step_time_s"] if ok else math.nan)
            label = _label(lname, lv) if lname else None
            m = markers[li % len(markers)]
            ax_mfu.plot(positions, mfu, marker=m, label=label)
            ax_t.plot(positions, st, marker=m, label=label)
            for x, y in zip(positions, mfu):
                if not math.isnan(y) and len(lines) <= 1:  # values on the line; with several lines they overlap
                    ax_mfu.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 6),
                                    ha="center", fontsize=7)
        ax_mfu.set_ylabel("MFU (%)")
        ax_mfu.set_ylim(bottom=0, top=max(100, ax_mfu.get_ylim()[1]))
        ax_t.set_ylabel("step time (s)")
        ax_t.set_xlabel(PARAMETERS[xname])
        if not categorical and len(positions) > 1 and min(positions) > 0 and max(positions) / min(positions) >= 4:
            ax_t.set_xscale("log", base=2)
        ax_t.set_xticks(positions)
        ax_t.set_xticklabels([sweep_value_text(v) if not (isinstance(v, float) and math.isinf(v)) else "∞" for v in xvals],
                             rotation=30 if categorical and xname == "model" else 0)
        ax_t.minorticks_off()
        times = [r["step_time_s"] for r in rows if r["feasible"]]
        if times and min(times) > 0 and max(times) / min(times) > 20:
            ax_t.set_yscale("log")  # step times spanning decades (model-size sweeps)
        for ax in (ax_mfu, ax_t):
            ax.grid(True, alpha=0.3)
        if lname:
            ax_mfu.legend(title=PARAMETERS[lname], fontsize=8, title_fontsize=8)
        title = _title(spec, rows)
        if infeasible:
            title += f"\n{infeasible} grid point{'s' if infeasible > 1 else ''} with no feasible plan (not drawn)"
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        # NAME.png exactly, the files the overwrite check guards: with_suffix would cut a dotted
        # name ("run.v1") and write over run.png
        stem = Path(stem)
        paths = output_paths(stem.parent, stem.name)
        png, svg = paths["png"], paths["svg"]
        fig.savefig(png, dpi=120)
        fig.savefig(svg)
        plt.close(fig)
        return png, svg


__all__ = ["PARAMETERS", "Axis", "SweepSpec", "Point", "apply_params", "build_points", "evaluate_point",
           "run_points", "run_sweep", "result_row", "write_csv", "plot", "columns", "output_paths",
           "refuse_overwrite", "import_ray", "default_workers", "INFINITE_GB_PER_S"]
