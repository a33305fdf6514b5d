"""Options and loaders shared by every `planner` sub-command (one place, one wording)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from hardware import load_system
from hardware.errors import SpecError
from hardware.spec import SystemSpec
from planner.model import ModelSpec, load_model
from planner.plan import JobSpec

DEFAULT_MODEL = "gpt3-175b"
DEFAULT_SYSTEM = "a100-80g"
DEFAULT_GPUS = 1024
DEFAULT_BATCH = 1536

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m", help="Model preset (see `planner presets`) or a model YAML file.")]
SystemOpt = Annotated[str, typer.Option(
    "--system", "-s", help="System preset (see `planner presets`) or a system YAML file.")]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", "-g", help="Number of GPUs (default: the system preset's count).")]
SeqOpt = Annotated[Optional[int], typer.Option(
    "--seq-length", help="Override the model's sequence length (tokens).")]
BatchOpt = Annotated[Optional[int], typer.Option(
    "--global-batch", "-b", help="Global batch in sequences (fixed).")]
MaxBatchOpt = Annotated[int, typer.Option(
    "--max-global-batch", help="Largest global batch the search may pick when --global-batch is not given.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="Compute precision: bf16, fp16 or fp8.")]
ReserveOpt = Annotated[float, typer.Option(
    "--hbm-reserve-gib", help="HBM per GPU kept free for CUDA context, NCCL and fragmentation (GiB).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


def load_inputs(model: str, system: str, gpus: int | None, seq_length: int | None = None
                ) -> tuple[ModelSpec, SystemSpec]:
    if seq_length is not None and seq_length < 1:
        raise SpecError(f"seq-length: must be a positive integer, got {seq_length}")
    return load_model(model, {"seq_length": seq_length}), load_system(system, gpus)


def make_job(global_batch: int | None = None, max_global_batch: int = 3072, dtype: str = "bf16",
             hbm_reserve_gib: float = 2.0, **extra) -> JobSpec:
    from pydantic import ValidationError

    from hardware.errors import one_line
    try:
        return JobSpec(global_batch=global_batch, max_global_batch=max_global_batch, dtype=dtype,
                       hbm_reserve_gib=hbm_reserve_gib, **extra)
    except ValidationError as err:
        raise one_line(err, "job") from None
