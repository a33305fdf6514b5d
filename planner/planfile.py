"""A saved plan: what `planner plan --save` writes and `planner megatron/estimate --plan` read.

It carries everything a launch needs, so that the file alone reproduces the run: the Plan (every
knob, batch included), the model and system (preset names, or ABSOLUTE paths for YAML files so
the file works from any directory), GPU count, sequence length, and the job settings the model
was costed under (dtype incl. the FP8/FP4 recipe, HBM reserve, flash attention, bytes per
parameter, framework). The model file carries vocabulary and dropout.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from hardware.errors import SpecError, one_line, read_yaml_mapping
from hardware.spec import SystemSpec
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan

# JobSpec fields a launch depends on (pins, forbids and search bounds do not).
SAVED_JOB_FIELDS = ("dtype", "hbm_reserve_gib", "flash_attention", "bytes_per_param", "framework")


def reference(ref: str) -> str:
    """A model/system reference as it must be saved: a preset name as is, a file as its absolute
    path (a relative one breaks `--plan` from another directory)."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml", ".json") or path.is_file():
        return str(path.resolve())
    return ref


def plan_file_data(plan: Plan, model_ref: str, system_ref: str, model: ModelSpec, system: SystemSpec,
                   job: JobSpec, **results) -> dict:
    """The mapping `planner plan --save` writes; `results` (step_time_s, objective …) are kept
    for the reader and ignored on load."""
    job_data = job.model_dump(include=set(SAVED_JOB_FIELDS))
    return {"plan": plan.model_dump(), "model": reference(model_ref), "system": reference(system_ref),
            "gpus": system.num_gpus, "seq_length": model.seq_length,
            "global_batch": plan.global_batch, "job": job_data, **results}


def saved_job(path: str | Path, plan: Plan) -> JobSpec | None:
    """The JobSpec a plan file was costed under (its global batch fixed to the plan's), or None
    for a bare plan mapping that carries no job settings."""
    data = read_yaml_mapping(Path(path), "plan")
    job = data.get("job")
    if job is None:
        return None
    if not isinstance(job, dict):
        raise SpecError(f"plan ({path}): job: expected a mapping of {', '.join(SAVED_JOB_FIELDS)}")
    unknown = sorted(set(job) - set(SAVED_JOB_FIELDS))
    if unknown:
        raise SpecError(f"plan ({path}): job: unknown field {unknown[0]!r}; allowed: {', '.join(SAVED_JOB_FIELDS)}")
    if "global_batch" in data and data["global_batch"] != plan.global_batch:
        raise SpecError(f"plan ({path}): global_batch ({data['global_batch']}) differs from the plan's "
                        f"({plan.global_batch})")
    try:
        return JobSpec(global_batch=plan.global_batch, max_global_batch=plan.global_batch, **job)
    except ValidationError as err:
        raise one_line(err, f"plan ({path}): job") from None


__all__ = ["SAVED_JOB_FIELDS", "reference", "plan_file_data", "saved_job"]
