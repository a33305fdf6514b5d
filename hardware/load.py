"""Preset name or YAML path -> SystemSpec, with one-line errors."""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from hardware.errors import refuse_loose_types, SpecError, one_line, read_yaml_mapping, resolve_preset_or_file
from hardware.spec import Accelerator, SystemSpec

PRESET_DIR = Path(__file__).parent / "presets"
ACCELERATOR_DIR = PRESET_DIR / "accelerators"


def system_preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_accelerator(ref: str) -> Accelerator:
    path, label = resolve_preset_or_file(ref, ACCELERATOR_DIR, "accelerator")
    data = read_yaml_mapping(path, "accelerator")
    try:
        refuse_loose_types(data, Accelerator, "accelerator")
        return Accelerator.model_validate(data)
    except ValidationError as err:
        raise one_line(err, f"accelerator ({label})") from None


def load_system(ref: str, num_gpus: int | None = None) -> SystemSpec:
    """Load a system preset or file; `num_gpus` overrides the preset's GPU count."""
    path, label = resolve_preset_or_file(ref, PRESET_DIR, "system")
    data = read_yaml_mapping(path, "system")
    if isinstance(data.get("accelerator"), str):
        data["accelerator"] = load_accelerator(data["accelerator"]).model_dump()
    if num_gpus is not None:
        if num_gpus < 1:
            raise SpecError(f"gpus: must be a positive integer, got {num_gpus}")
        data["num_gpus"] = num_gpus
    try:
        refuse_loose_types(data, SystemSpec, "system")
        return SystemSpec.model_validate(data)
    except ValidationError as err:
        raise one_line(err, f"system ({label})") from None
