"""What a machine is: accelerator, memory tiers, network tiers. Nothing about models."""
from __future__ import annotations

import importlib

# Loaded on first use (PEP 562): `import hardware.errors` (every CLI error path, `planner --help`)
# must not pay for pydantic models and the preset loader.
_EXPORTS = {"load_system": "hardware.load", "system_preset_names": "hardware.load",
            "Accelerator": "hardware.spec", "Dtype": "hardware.spec", "MemoryTier": "hardware.spec",
            "NetworkTier": "hardware.spec", "SystemSpec": "hardware.spec"}

__all__ = ["Accelerator", "MemoryTier", "NetworkTier", "SystemSpec", "Dtype", "load_system",
           "system_preset_names"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hardware' has no attribute {name!r}")
