"""Running the model with some of a module's fitted constants set to other values (the fits try
values this way; the module constants stay the fitted ones)."""
from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType


@contextmanager
def overridden(module: ModuleType, allowed: tuple[str, ...], values: dict[str, float]):
    """`module`'s constants named in `values` (each one of `allowed`) set for the block, restored
    afterwards."""
    unknown = set(values) - set(allowed)
    if unknown:
        raise KeyError(f"not a fitted parameter of {module.__name__}: {sorted(unknown)}")
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
