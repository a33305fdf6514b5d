"""Record fields the reference leaves null that the source sets in the launch it publishes.

A benchmark page may print only its command lines, and a command may take a field from the
config file it names. Where the reference record leaves such a field null and the source's
command names a config file that sets it, the loader (planner/reference.py) reads the field
from that file at the framework commit the source names. The case's assumptions list the field
and its evidence. A field the record states is never replaced, so a completed source file wins.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchField:
    path: str         # dotted record path, e.g. "model.seq"
    value: object
    evidence: str     # the command, the config file it names, and the commit read


# torchtitan's async-TP benchmark page (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md)
# prints no sequence length. Each of its commands starts from
# torchtitan/models/llama3/train_configs/llama3_{8b,70b}.toml. Both files set
# training.seq_len = 8192 at torchtitan 820504e (2025-06-13), the commit the page's version
# table names, and the commands do not override it.
_TORCHTITAN_ASYNC_TP_SEQ = LaunchField(
    path="model.seq", value=8192,
    evidence="the page's commands start from llama3_{8b,70b}.toml: seq_len 8192 at torchtitan 820504e")

LAUNCH_FIELDS: dict[tuple[str, str], tuple[LaunchField, ...]] = {
    ("pytorch/torchtitan", "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"): (_TORCHTITAN_ASYNC_TP_SEQ,),
}


def _source_key(rec: dict) -> tuple[str, str] | None:
    source = rec.get("source")
    if not isinstance(source, dict):
        return None
    return str(source.get("repo") or ""), str(source.get("file") or "")


def _get(rec: dict, path: str):
    node = rec
    for key in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def with_fields(rec: dict, fields: dict) -> dict:
    """A copy of a raw record with dotted `fields` set; the record itself is untouched."""
    out = copy.deepcopy(rec)
    for path, value in fields.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def completed_record(rec: dict) -> tuple[dict, list[str]]:
    """(the record with the unstated fields its source's launch config sets, what was filled in
    words); the record itself and [] where nothing applies."""
    key = _source_key(rec) if isinstance(rec, dict) else None
    filled = [f for f in LAUNCH_FIELDS.get(key, ()) if _get(rec, f.path) is None] if key else []
    if not filled:
        return rec, []
    notes = [f"{f.path} = {f.value}, not printed ({f.evidence})" for f in filled]
    return with_fields(rec, {f.path: f.value for f in filled}), notes


__all__ = ["LAUNCH_FIELDS", "LaunchField", "completed_record", "with_fields"]
