"""User-facing input errors: one line that names the field and what is allowed."""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError


class SpecError(ValueError):
    """A mistake in what the user gave us; the CLI prints it as one line and exits 2."""


def one_line(err: ValidationError, where: str) -> SpecError:
    """First pydantic error as `where: field.path: message`."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return SpecError(f"{where}: {loc}: {msg}{tail}")


def read_yaml_mapping(path: Path, what: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise SpecError(f"{what} {path}: malformed YAML{at}") from None
    except OSError as exc:
        raise SpecError(f"{what} {path}: cannot read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{what} {path}: expected a YAML mapping of fields, got {type(data).__name__}")
    return data


def resolve_preset_or_file(ref: str, preset_dir: Path, what: str) -> tuple[Path, str]:
    """A preset name or a path to a YAML file -> (path, label)."""
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise SpecError(f"{what}: file {ref} does not exist")
        return candidate, str(candidate)
    preset = preset_dir / f"{ref}.yaml"
    if not preset.is_file():
        names = ", ".join(sorted(p.stem for p in preset_dir.glob("*.yaml")))
        raise SpecError(f"{what}: unknown preset {ref!r}; allowed: {names} (or a path to a .yaml file)")
    return preset, f"preset {ref}"
