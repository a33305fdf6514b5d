"""Preset name or YAML path -> SystemSpec, with one-line errors."""
from __future__ import annotations

import copy
import functools
from pathlib import Path

from pydantic import ValidationError

from hardware.errors import (SpecError, one_line, other_kind_of_file, read_yaml_mapping, reference_text, refuse_loose_types,
                             resolve_preset_or_file)
from hardware.spec import MAX_GPUS, Accelerator, SystemSpec

PRESET_DIR = Path(__file__).parent / "presets"
ACCELERATOR_DIR = PRESET_DIR / "accelerators"


def system_preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


@functools.lru_cache(maxsize=128)
def _preset_yaml(path: Path, what: str) -> dict:
    return read_yaml_mapping(path, what)


def _read_spec(path: Path, what: str) -> dict:
    """The file's mapping; the shipped presets are parsed once per process (loading the published
    runs asks for the same few presets hundreds of times), a copy handed out each time."""
    if path.resolve().parent in (PRESET_DIR.resolve(), ACCELERATOR_DIR.resolve()):
        return copy.deepcopy(_preset_yaml(path.resolve(), what))
    return read_yaml_mapping(path, what)


def load_accelerator(ref: str) -> Accelerator:
    path, label = resolve_preset_or_file(ref, ACCELERATOR_DIR, "accelerator")
    data = _read_spec(path, "accelerator")
    try:
        refuse_loose_types(data, Accelerator, f"accelerator ({label})")
        return Accelerator.model_validate(data)
    except ValidationError as err:
        other = other_kind_of_file(data, "accelerator")  # a system or model file named as the accelerator
        if other:
            raise SpecError(f"accelerator ({label}): {other}") from None
        raise one_line(err, f"accelerator ({label})", Accelerator) from None


def load_system(ref: str, num_gpus: int | None = None) -> SystemSpec:
    """Load a system preset or file; `num_gpus` overrides the preset's GPU count."""
    ref = reference_text(ref, "system")
    if num_gpus is not None and (isinstance(num_gpus, bool) or not isinstance(num_gpus, int)):
        raise SpecError(f"gpus: expected an integer GPU count, got {type(num_gpus).__name__} {num_gpus!r}")
    path, label = resolve_preset_or_file(ref, PRESET_DIR, "system")
    # cached by GPU count: num_gpus is a plain int (or None) here, so 8.0 or True never share 8's entry
    if path.resolve().parent == PRESET_DIR.resolve():
        return _preset_system(path.resolve(), label, num_gpus)
    return _build_system(path, label, num_gpus)


@functools.lru_cache(maxsize=512)
def _preset_system(path: Path, label: str, num_gpus: int | None) -> SystemSpec:
    """A shipped preset at a GPU count, validated once per process (loading the published runs
    asks for the same few hundred times; SystemSpec is frozen, so one instance serves all)."""
    return _build_system(path, label, num_gpus)


def _check_replaced_num_gpus(value, label: str) -> None:
    """A file's own num_gpus that a GPU count replaces, checked all the same, as without one (a
    `num_gpus: .nan` would pass unseen and fail wherever the file is used alone)."""
    from pydantic import create_model
    field = SystemSpec.model_fields["num_gpus"]
    where = f"system ({label})"
    try:
        refuse_loose_types({"num_gpus": value}, SystemSpec, where)
        gpus = create_model("SystemGpus", num_gpus=(field.annotation, field)).model_validate({"num_gpus": value})
        _check_gpu_cap(gpus.num_gpus, where)
    except ValidationError as err:
        raise SpecError(f"{one_line(err, where)} (the file's own value, which --gpus replaces)") from None
    except SpecError as err:
        raise SpecError(f"{err} (the file's own value, which --gpus replaces)") from None


def _check_gpu_cap(num_gpus: int, where: str) -> None:
    """A file's num_gpus within the cap of --gpus (not a SystemSpec bound: see MAX_GPUS)."""
    if num_gpus > MAX_GPUS:
        raise SpecError(f"{where}: num_gpus: must be an integer from 1 to {MAX_GPUS:,} (as --gpus), got {num_gpus:,}")


def _accelerator_ref(ref: str, system_path: Path, label: str) -> str:
    """A system file's `accelerator:` as load_accelerator takes it: a relative path is read from
    the system file's folder, as a plan file's model: and system: paths are (planner.planfile),
    and from the current folder where nothing is there (what it meant before)."""
    if not (ref.strip() and ("/" in ref or "\\" in ref or ref.endswith((".yaml", ".yml")))) or Path(ref).is_absolute():
        return ref  # a preset name, or a path that means one file wherever the planner runs
    beside = system_path.parent / ref
    if beside.is_file():
        return str(beside)
    if not Path(ref).exists():
        raise SpecError(f"system ({label}): accelerator: file {ref} does not exist beside the system file "
                        f"({beside}) or in the current folder")
    return ref


def accelerator_file_of(system_ref: str) -> Path | None:
    """The accelerator file a system file names (`accelerator: ./my-gpu.yaml`), where it is a file
    and the system file reads: None for a preset, an inline accelerator or an unreadable file (the
    loader says what is wrong with those)."""
    try:
        path, label = resolve_preset_or_file(system_ref, PRESET_DIR, "system")
        ref = _read_spec(path, "system").get("accelerator")
        if not isinstance(ref, str):
            return None
        found, _ = resolve_preset_or_file(_accelerator_ref(ref, path, label), ACCELERATOR_DIR, "accelerator")
    except SpecError:
        return None
    return None if Path(found).resolve().is_relative_to(ACCELERATOR_DIR.resolve()) else Path(found)


def _build_system(path: Path, label: str, num_gpus: int | None) -> SystemSpec:
    data = _read_spec(path, "system")
    if isinstance(data.get("accelerator"), str):
        try:
            data["accelerator"] = load_accelerator(_accelerator_ref(data["accelerator"], path, label)).model_dump()
        except SpecError as err:  # said as the system file's field: which file named it
            text = str(err)
            raise SpecError(text if text.startswith("system (") else f"system ({label}): {text}") from None
    if num_gpus is not None:
        if num_gpus < 1:
            raise SpecError(f"gpus: must be a positive integer, got {num_gpus}")
        if num_gpus > MAX_GPUS:
            raise SpecError(f"gpus: must be an integer from 1 to {MAX_GPUS:,}, got {num_gpus}")
        if "num_gpus" in data:
            _check_replaced_num_gpus(data["num_gpus"], label)
        data["num_gpus"] = num_gpus
    try:
        refuse_loose_types(data, SystemSpec, f"system ({label})")
        system = SystemSpec.model_validate(data)
    except ValidationError as err:
        other = other_kind_of_file(data, "system")
        if other:
            raise SpecError(f"system ({label}): {other}") from None
        raise one_line(err, f"system ({label})", SystemSpec) from None
    if num_gpus is None:
        _check_gpu_cap(system.num_gpus, f"system ({label})")
    # on the system as loaded, GPU override applied (not in the validator: see SystemSpec)
    try:
        system.check_spans_system()
    except SpecError as err:
        raise SpecError(f"system ({label}): {err}") from None
    return system
