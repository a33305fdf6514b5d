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

from hardware.errors import SpecError, one_line, read_yaml_mapping, refuse_loose_types
from hardware.spec import SystemSpec
from planner.model import ModelSpec
from planner.plan import (PLAN_FILE_FIELDS, SAVED_JOB_FIELDS, SAVED_RESULT_FIELDS, JobSpec, Plan,
                          check_plan_file_fields)


def is_preset(ref: str, what: str) -> bool:
    """Whether `ref` names a built-in preset (a bare preset name always means the preset)."""
    from hardware.load import PRESET_DIR as SYSTEM_PRESETS
    from planner.model import PRESET_DIR as MODEL_PRESETS
    return ((MODEL_PRESETS if what == "model" else SYSTEM_PRESETS) / f"{ref}.yaml").is_file()


def reference(ref: str, what: str) -> str:
    """A model/system reference as it must be saved: a preset name as is (a bare preset name
    always means the preset), anything else (YAML, config.json, model directory) as its absolute
    path (a relative one breaks `--plan` from another directory)."""
    return ref if is_preset(ref, what) else str(Path(ref).resolve())


def saved_reference(ref: str, what: str, plan_path: str | Path) -> str:
    """A model/system reference read from a plan file: a preset name as is; a relative path taken
    from the plan file's folder (`reference` saves absolute ones; a hand-written relative one
    means the file beside the plan, not one in whatever folder the command runs from)."""
    if not ref.strip() or is_preset(ref, what) or Path(ref).is_absolute():
        return ref
    beside = Path(plan_path).parent / ref
    if not beside.exists() and "/" not in ref and "\\" not in ref and Path(ref).suffix not in (".yaml", ".yml", ".json"):
        return ref  # a bare name that is no file beside the plan: a preset name, refused as one if unknown
    return str(beside)


def plan_file_data(plan: Plan, model_ref: str, system_ref: str, model: ModelSpec, system: SystemSpec,
                   job: JobSpec, **results) -> dict:
    """The mapping `planner plan --save` writes; `results` (step_time_s, objective …) are kept
    for the reader and ignored on load."""
    unknown = sorted(set(results) - set(SAVED_RESULT_FIELDS))
    if unknown:  # the reader would refuse the file: add the field to SAVED_RESULT_FIELDS
        raise ValueError(f"plan_file_data: {unknown[0]!r} is not in SAVED_RESULT_FIELDS")
    job_data = job.model_dump(include=set(SAVED_JOB_FIELDS))
    # the GPUs the plan runs on (with --allow-idle-gpus, fewer than the system has: the idle ones
    # cost nothing, and a file saying the system's count would not load back)
    return {"plan": plan.model_dump(), "model": reference(model_ref, "model"), "system": reference(system_ref, "system"),
            "gpus": plan.gpus, "seq_length": model.seq_length,
            "global_batch": plan.global_batch, "job": job_data, **results}


def saved_job(path: str | Path, plan: Plan) -> JobSpec | None:
    """The JobSpec a plan file was costed under (its global batch fixed to the plan's), or None
    for a bare plan mapping that carries no job settings."""
    return _saved_job_and_fields(path, plan)[0]


def _saved_job_and_fields(path: str | Path, plan: Plan) -> tuple[JobSpec | None, set[str]]:
    """saved_job, and the job fields the file itself writes (the rest are JobSpec's defaults)."""
    data = read_yaml_mapping(Path(path), "plan")
    if "plan" in data:
        check_plan_file_fields(data, path)
    job = data.get("job")
    if job is None:
        return None, set()
    if not isinstance(job, dict):
        raise SpecError(f"plan ({path}): job: expected a mapping of {', '.join(SAVED_JOB_FIELDS)}")
    unknown = sorted(set(job) - set(SAVED_JOB_FIELDS))
    if unknown:
        raise SpecError(f"plan ({path}): job: unknown field {unknown[0]!r}; allowed: {', '.join(SAVED_JOB_FIELDS)}")
    if "global_batch" in data and (not isinstance(data["global_batch"], int) or isinstance(data["global_batch"], bool)):
        raise SpecError(f"plan ({path}): global_batch: expected an integer, got {data['global_batch']!r}")
    if "global_batch" in data and data["global_batch"] != plan.global_batch:
        raise SpecError(f"plan ({path}): global_batch ({data['global_batch']}) differs from the plan's "
                        f"({plan.global_batch})")
    bytes_per_param = job.get("bytes_per_param")
    if bytes_per_param is not None and not isinstance(bytes_per_param, dict):
        raise SpecError(f"plan ({path}): job: bytes_per_param: expected a mapping of bytes per parameter "
                        f"(weights, grads, master, optimizer, grad_reduce), got {bytes_per_param!r}")
    try:
        # as the plan's own fields: `flash_attention: 'no'` or `hbm_reserve_gib: true` is a mistake,
        # not what pydantic's lax mode would make of it
        refuse_loose_types(job, JobSpec, f"plan ({path}): job")
        return JobSpec(global_batch=plan.global_batch, max_global_batch=plan.global_batch, **job), set(job)
    except ValidationError as err:
        raise one_line(err, f"plan ({path}): job") from None


def job_for_plan_file(path: str | Path, plan: Plan, **given) -> JobSpec | None:
    """The saved job of a plan file, checked against the settings a user gave on the command line
    (None = not given): the file says how the plan was costed, so a different value is an error
    rather than a silent re-costing. None for a bare plan mapping without job settings."""
    saved, written = _saved_job_and_fields(path, plan)
    if saved is None:
        return None
    for name, value in given.items():
        if name not in written and name == "moe_load_imbalance":
            continue  # a file saved before the skew was: it says nothing, the flag applies
        if value is not None and value != getattr(saved, name):
            flag = FLAG_OF_JOB_FIELD.get(name, name.replace("_", "-"))
            shown = (lambda v: "full-iteration" if v else "none") if name == "full_iteration_cuda_graph" \
                else setting_text  # as --cuda-graph takes it, not the field's true/false
            raise SpecError(f"{flag}: {shown(value)} differs from the plan file's ({shown(getattr(saved, name))})")
    return saved


# job fields whose command-line flag has another name
FLAG_OF_JOB_FIELD = {"cuda_graph_modules": "cuda-graph", "full_iteration_cuda_graph": "cuda-graph",
                     "module_dtypes": "module-dtype", "moe_load_imbalance": "moe-imbalance"}


def setting_text(value) -> str:
    """A job setting as a user writes it: a list comma-separated ('none' when empty), a mapping as
    MODULE=DTYPE pairs, a flag true/false."""
    if isinstance(value, bool):
        return str(value).lower()
    if hasattr(value, "model_dump"):  # a settings block (bytes_per_param)
        value = value.model_dump()
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "none"
    return str(value)


__all__ = ["SAVED_JOB_FIELDS", "PLAN_FILE_FIELDS", "SAVED_RESULT_FIELDS", "reference", "plan_file_data",
           "check_plan_file_fields", "saved_job", "job_for_plan_file", "setting_text"]
