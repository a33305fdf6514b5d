"""parplan's public Python API: plan, check, estimate and count parallel layouts for LLM training.

    from planner import load_model, load_system, plan, JobSpec
    result = plan(load_model("llama3-8b"), load_system("h100-sxm", 64), JobSpec(global_batch=512))
    print(result.best.plan.short(), result.best.estimate.step_time_s)

Names load on first use (module __getattr__), so `import planner` stays cheap for the CLI.
These names are the stable surface; everything else in the package may change.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from hardware.load import load_system
    from hardware.spec import SystemSpec
    from planner.analytical.estimate import Estimate, estimate
    from planner.model import ModelSpec, load_model
    from planner.plan import JobSpec, Plan
    from planner.search import SearchResult, check, count, plan

_EXPORTS: dict[str, str] = {
    "plan": "planner.search",
    "check": "planner.search",
    "count": "planner.search",
    "SearchResult": "planner.search",
    "estimate": "planner.analytical.estimate",
    "Estimate": "planner.analytical.estimate",
    "load_model": "planner.model",
    "ModelSpec": "planner.model",
    "Plan": "planner.plan",
    "JobSpec": "planner.plan",
    "load_system": "hardware.load",
    "SystemSpec": "hardware.spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """`planner.plan` is both a submodule (Plan, JobSpec live there) and the public search
    function. Importing the submodule would rebind the package attribute to the module; keep the
    attribute the function (`from planner.plan import Plan` still works through sys.modules)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
