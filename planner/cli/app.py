"""`planner`: the typer app. Each sub-command lives in its own module of this package."""
from __future__ import annotations

import importlib

import typer
from typer.core import TyperGroup

from hardware.errors import SpecError

COMMAND_MODULES = ("search", "estimate", "megatron", "checkpoint", "sweep", "validate")


class _UserErrorsAsOneLine(TyperGroup):
    """A user mistake (SpecError) anywhere in a command: one line on stderr, exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=_UserErrorsAsOneLine, add_completion=False, pretty_exceptions_enable=False,
    help="Plan tensor/pipeline/data parallelism, batch, recompute and offload for LLM training.\n\n"
         "Start with `planner plan` (GPT-3 175B on 1024 A100, batch 1536) or `planner presets`.")


@app.callback()
def _root() -> None:
    """Plan tensor/pipeline/data parallelism, batch, recompute and offload for LLM training."""


for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"planner.cli.{_name}")
    except ModuleNotFoundError as exc:  # a command whose module has not landed yet
        if exc.name != f"planner.cli.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    """Console entry point."""
    app()
