"""Published records whose stated configuration cannot be what ran, and the reading used instead.

A run that was measured fit in its GPUs' memory. Where a record's stated layout needs more HBM
than the GPU has under the memory model (planner/analytical/memory.py), at least one stated field
is wrong; an erratum names the field, the value a second publication of the same authors states,
and where. planner/reference.py applies an erratum only while the record as published does not
fit (so a corrected source file, or a memory model that finds it fits, turns it off), and lists it
among the case's assumptions with the HBM figures that triggered it. No speed factor: only
fields of the record change, and its measured throughput is converted with them.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.reference_launch_fields import with_fields


@dataclass(frozen=True)
class Erratum:
    fields: dict          # dotted record path -> value used
    published: str        # what the record states, in words
    used: str             # what is used, in words
    evidence: str         # where the used value is stated, and why the published one cannot be


# torchtitan's MXFP8 doc (torchtitan/components/quantization/mxfp8.md @ 5b5f578a, first as
# docs/mxfp8.md @ b3da1a2d) states local batch 10 at sequence 8192 with activation checkpointing
# "none" (giving its reason: selective per-op AC had a bug then) for Llama-4 Scout on 256 GB200.
# Without checkpointing every layer keeps ~34 s·b·h bytes (memory.activation_parts: 13.3 GiB per
# layer at b = 10), 638 GiB over 48 layers, against 184 GiB of HBM. The PyTorch blog post of the
# same team on the same model, cluster size and parallelism ("MXFP8 Training for MoEs: 1.3x
# training speedup vs BF16 for Llama4 Scout on GB200 cluster using TorchAO and TorchTitan",
# pytorch.org, 2026, training configuration list) states local batch size 1. The stated
# checkpointing comes with its reason and is kept; the batch is read as the blog's 1, and the
# global batch, which the record derives as local batch x 256, follows.
_SCOUT = Erratum(
    fields={"parallel.microbatch": 1, "parallel.global_batch": 256},
    published="local batch 10 (global 2560)",
    used="local batch 1 (global 256)",
    evidence="PyTorch blog 'MXFP8 Training for MoEs ... Llama4 Scout on GB200 cluster' (same team, "
             "model, 256 GB200, FSDP 256 / EP 16): local batch size 1")

ERRATA: dict[str, Erratum] = {
    "torchtitan_llama4-scout_256gpu_fsdp256_ep16_bf16": _SCOUT,
    "torchtitan_llama4-scout_256gpu_fsdp256_ep16_mxfp8": _SCOUT,
}


def corrected_record(rec: dict, erratum: Erratum) -> dict:
    """A copy of the raw record with the erratum's fields set (the record itself is untouched)."""
    return with_fields(rec, erratum.fields)


__all__ = ["ERRATA", "Erratum", "corrected_record"]
