"""What each Megatron-Bridge release's performance recipe set for a bridge_runs.yaml record.

The published performance tables print only the layout and precision; the recipes that produced
them set much more (Megatron-FSDP, CPU offload, token dispatcher, expert all-to-all overlap, recompute, CUDA graphs, fused
kernels), and they changed from release to release. planner/data/bridge_recipe_knobs.yaml holds,
per record id, the knobs read from the Bridge commit that release's container shipped, each with
the commit, path and config name it was read from (the file's header says how). This module only
loads and checks that table; planner/reference_moe.py (MoE) and planner/reference_dense.py (Llama)
apply the knobs the model costs.

The Megatron MoE ModelZoo publishes a launch command under some of its table rows; what those
commands set is kept in the same schema (planner/data/modelzoo_command_knobs.yaml, its header says
how it was read), so a ModelZoo record is costed by the same code as a Bridge record
(`launch_knobs`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from hardware.errors import SpecError, safe_load_packaged

KNOBS_FILE = Path(__file__).resolve().parent / "data" / "bridge_recipe_knobs.yaml"
MODELZOO_KNOBS_FILE = KNOBS_FILE.parent / "modelzoo_command_knobs.yaml"
# The same table for the rows of bench/data/bridge_heldout.csv (ids: bench/heldout_bridge.py row_id),
# kept apart so nothing fitted on bridge_runs.yaml can read a held-out row by accident.
HELDOUT_KNOBS_FILE = KNOBS_FILE.parent / "bridge_recipe_knobs_heldout.yaml"

# The knobs an entry may carry (Megatron / Megatron-Bridge config names, plus
# pipeline_layout_flags for the account_for_embedding/loss split).
KNOB_NAMES: tuple[str, ...] = (
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_router_force_load_balancing",
    "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute", "moe_shared_expert_overlap", "recompute_granularity", "recompute_modules",
    "cuda_graph_impl", "cuda_graph_scope", "cutedsl_fused_grouped_mlp", "fp8_dot_product_attention",
    "pipeline_model_parallel_layout", "pipeline_layout_flags", "expert_tensor_parallel_size",
    "tp_comm_overlap", "moe_router_fusion", "moe_permute_fusion", "moe_paged_stash",
    "moe_expert_rank_capacity_factor", "mtp_num_layers",
    # dense (Llama) recipes: full recompute by block, Megatron-FSDP, activation offload, FP8 weights
    "recompute_method", "recompute_num_layers", "use_megatron_fsdp", "data_parallel_sharding_strategy",
    "cpu_offloading_num_layers", "cpu_offloading_weights", "fp8_param_gather", "overlap_param_gather",
    # ModelZoo commands: Megatron's fine-grained activation offloading (--offload-modules)
    "offload_modules",
    # layers kept in bf16 under a low-precision recipe (JobSpec.bf16_layers)
    "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
    # a per-module TE quantization recipe (quant_recipe), as JobSpec.module_dtypes
    "module_dtypes",
)
_ENTRY_FIELDS = ("release", "commit", "tag", "config", "recipe_layout", "layout_matches_record", "mismatch", "knobs")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Knob:
    value: Any
    where: str  # commit[:12]:path and config/function name


@dataclass(frozen=True)
class RecipeKnobs:
    """One record's recipe, as read at the Bridge commit of its release."""
    record_id: str
    release: str
    commit: str
    tag: str
    config: str
    recipe_layout: dict[str, int | None]
    layout_matches_record: bool
    mismatch: str | None
    knobs: dict[str, Knob]
    source: str = "Megatron-Bridge"  # the repository the knobs were read from

    def value(self, name: str, default: Any = None) -> Any:
        """The knob's value, or `default` when the entry does not carry it."""
        _check_name(name)
        knob = self.knobs.get(name)
        return default if knob is None else knob.value

    def where(self, name: str) -> str:
        """Where in the Bridge source the knob was read ('' when the entry does not carry it)."""
        _check_name(name)
        knob = self.knobs.get(name)
        return "" if knob is None else knob.where

    def cite(self, name: str) -> str:
        """'<source> <tag> <where>' (e.g. 'Megatron-Bridge v0.2.0 7af9601c9da7:...') for an assumption text."""
        return f"{self.source} {self.tag} {self.where(name)}"


def _check_name(name: str) -> None:
    if name not in KNOB_NAMES:
        raise SpecError(f"bridge recipe knob: unknown name {name!r}; allowed: {', '.join(KNOB_NAMES)}")


def _entry(rid: str, raw: Any, path: Path) -> RecipeKnobs:
    where = f"{path.name}: record {rid}"
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: expected a mapping with {', '.join(_ENTRY_FIELDS)}")
    missing = [f for f in _ENTRY_FIELDS if f not in raw]
    if missing:
        raise SpecError(f"{where}: {missing[0]}: required field is missing")
    if not _COMMIT.match(str(raw["commit"])):
        raise SpecError(f"{where}: commit: expected 40 lower-case hex digits, got {raw['commit']!r}")
    if not isinstance(raw["knobs"], dict):
        raise SpecError(f"{where}: knobs: expected a mapping of knob name to {{value, where}}")
    knobs = {}
    for name, k in raw["knobs"].items():
        if name not in KNOB_NAMES:
            raise SpecError(f"{where}: knobs.{name}: unknown knob; allowed: {', '.join(KNOB_NAMES)}")
        if not isinstance(k, dict) or "value" not in k or not str(k.get("where") or "").strip():
            raise SpecError(f"{where}: knobs.{name}: expected {{value, where}} with a non-empty where")
        knobs[name] = Knob(k["value"], str(k["where"]))
    layout = raw["recipe_layout"]
    if not isinstance(layout, dict) or not {"tp", "pp", "vpp", "ep"} <= set(layout):
        raise SpecError(f"{where}: recipe_layout: expected a mapping with tp, pp, vpp, ep")
    return RecipeKnobs(rid, str(raw["release"]), str(raw["commit"]), str(raw["tag"]), str(raw["config"]),
                       dict(layout), bool(raw["layout_matches_record"]),
                       None if raw["mismatch"] is None else str(raw["mismatch"]), knobs,
                       str(raw.get("source") or "Megatron-Bridge"))


@lru_cache(maxsize=4)
def load_recipe_knobs(path: Path = KNOBS_FILE) -> dict[str, RecipeKnobs]:
    """Every entry of the knobs table, by record id (a malformed entry is a one-line SpecError)."""
    try:
        doc = safe_load_packaged(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"{Path(path).name}: cannot read: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), dict):
        raise SpecError(f"{Path(path).name}: records: expected a mapping of record id to entry")
    return {str(rid): _entry(str(rid), raw, Path(path)) for rid, raw in doc["records"].items()}


@lru_cache(maxsize=1)
def _bridge_tables() -> dict[str, RecipeKnobs]:
    """The in-sample and held-out tables as one mapping; an id in both is a one-line SpecError."""
    inside, heldout = load_recipe_knobs(KNOBS_FILE), load_recipe_knobs(HELDOUT_KNOBS_FILE)
    both = sorted(set(inside) & set(heldout))
    if both:
        raise SpecError(f"{HELDOUT_KNOBS_FILE.name}: record {both[0]}: also in {KNOBS_FILE.name}; an id belongs to one table")
    return {**inside, **heldout}


def recipe_knobs(record_id: str, *, required: bool = False, path: Path | None = None) -> RecipeKnobs | None:
    """The recipe knobs for a bridge_runs.yaml record id or a held-out row id (both Bridge tables
    unless `path` names one); None for a record neither covers (other sources), a one-line
    SpecError instead when `required`."""
    table = _bridge_tables() if path is None else load_recipe_knobs(path)
    entry = table.get(record_id)
    if entry is None and required:
        raise SpecError(f"bridge recipe knobs: no entry for record {record_id!r}; the table covers "
                        f"{len(table)} Megatron-Bridge records (bridge_runs.yaml and the held-out rows)")
    return entry


def launch_knobs(record_id: str) -> RecipeKnobs | None:
    """What the record's own launch set: its release's Bridge recipe (bridge_ records) or its
    published ModelZoo command (mcore-modelzoo records); None where neither table has an entry."""
    if record_id.startswith("bridge_"):
        return recipe_knobs(record_id)
    if record_id.startswith("mcore-modelzoo"):
        return load_recipe_knobs(MODELZOO_KNOBS_FILE).get(record_id)
    return None


def release_number(release: str) -> tuple[int, ...]:
    """A release name as a comparable tuple: "26.02.01" -> (26, 2, 1)."""
    return tuple(int(x) for x in release.split("."))


def release_commits(path: Path = KNOBS_FILE) -> dict[str, tuple[str, str]]:
    """{release: (Bridge tag, commit)} the table was read at."""
    doc = safe_load_packaged(Path(path).read_text())
    return {str(rel): (str(v["tag"]), str(v["commit"])) for rel, v in doc["releases"].items()}


__all__ = ["HELDOUT_KNOBS_FILE", "KNOBS_FILE", "KNOB_NAMES", "MODELZOO_KNOBS_FILE", "Knob", "RecipeKnobs", "launch_knobs", "load_recipe_knobs",
           "recipe_knobs", "release_commits", "release_number"]
