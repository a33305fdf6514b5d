"""Strict JSON for everything the CLI prints under --json (no heavy imports: errors use it too)."""
from __future__ import annotations

import json


def json_safe(value):
    """JSON has no Infinity/NaN: write them as the strings "inf", "-inf", "nan" (numpy scalars too)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalar -> Python
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


def json_text(data, indent: int | None = 2) -> str:
    """Valid JSON (strict: no Infinity/NaN tokens) for everything the CLI prints under --json."""
    return json.dumps(json_safe(data), indent=indent, allow_nan=False)
