"""Megatron-LM's own parser (../shared/tools/megatron_check, megatron-core 0.19.2 on CPU) for
the tests: a session fixture that finds or builds its environment (bounded time) or skips with
the reason, and the inverse mapping of its parsed arguments back to a Plan and job settings."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from planner.megatron.expressible import offload_fraction_of_layers
from planner.analytical.plans import uniform_chunk_recompute
from planner.pipeline_layout import balanced_layout, fullest_rank_layers, layout_from_flags, layout_from_string
from planner.model import MambaSpec, MLASpec, ModelSpec, MoESpec
from planner.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
CHECKER_DIR = ROOT.parent / "shared" / "tools" / "megatron_check"
BATCH_DRIVER = Path(__file__).resolve().parent / "tools" / "megatron_parse_many.py"
SETUP_TIMEOUT_S = 600


class MegatronParser:
    """Runs many argument lists through the checker in one process (see BATCH_DRIVER)."""

    def __init__(self, python: str, wheel: str):
        self.python, self.wheel = python, wheel

    def parse_many(self, cases: list[dict]) -> list[dict]:
        env = {**os.environ, "PYTHONPATH": f"{self.wheel}:{CHECKER_DIR}"}
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        done = subprocess.run([self.python, str(BATCH_DRIVER)], input=json.dumps(cases), text=True,
                              capture_output=True, env=env, cwd=CHECKER_DIR, timeout=600)
        lines = done.stdout.strip().splitlines()
        assert done.returncode == 0 and lines, done.stderr[-2000:]
        return json.loads(lines[-1])


def find_or_build_parser() -> MegatronParser:
    setup = CHECKER_DIR / "setup.sh"
    if not setup.is_file():
        pytest.skip(f"Megatron's parser: {setup} not found (the shared checker is not available)")
    # idempotent: prints at once when /tmp already holds the environment; the lock keeps
    # parallel test workers (pytest -n 2) from building it twice at the same time
    with open(Path(tempfile.gettempdir()) / "parplan_megatron_check.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = subprocess.run(["bash", str(setup)], capture_output=True, text=True, timeout=SETUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.skip(f"Megatron's parser: setup.sh did not finish within {SETUP_TIMEOUT_S} s")
    words = done.stdout.strip().splitlines()[-1].split() if done.stdout.strip() else []
    if done.returncode != 0 or len(words) != 2:
        pytest.skip(f"Megatron's parser: setup.sh failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return MegatronParser(*words)


# Test modules whose argument lists go through the checker: name -> builder(tmp_path_factory) ->
# (what the module keeps beside the results, the argument lists). All of them run in ONE checker
# process per test session (megatron-core's import, ~7 s, and ~0.7 s per list): the first test
# worker to need them runs the checker and leaves a results file; a worker that needs them later
# reads it, one that needs them while they run runs only its own batch (pytest -n 2 may give the
# tests of one module to both workers, which each ran the module fixture before).
_BATCHES: dict = {}


def checker_batch(name: str):
    """Register a module's builder of argument lists (a decorator)."""
    def register(builder):
        _BATCHES[name] = builder
        return builder
    return register


class CheckedBatches:
    """The registered batches, built and parsed together on first use, once per session."""

    def __init__(self, tmp_path_factory):
        self._tmp, self._done = tmp_path_factory, None

    def _shared_dir(self) -> Path:
        base = self._tmp.getbasetemp()
        # under xdist each worker's base is <session dir>/popen-gwN: the session dir is shared
        return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(self, name: str) -> tuple:
        """(what the builder kept, the checker's results for its argument lists, in order)."""
        if self._done is None:
            parser = find_or_build_parser()
            built = {n: builder(self._tmp) for n, builder in sorted(_BATCHES.items())}
            flat = [case for _, cases in built.values() for case in cases]
            results = self._parse_once(parser, flat)
            if results is None:  # another worker is running them now: run only this batch here
                kept, cases = built[name]
                return kept, parser.parse_many(cases)
            self._done, at = {}, 0
            for n, (kept, cases) in built.items():
                self._done[n] = (kept, results[at:at + len(cases)])
                at += len(cases)
        return self._done[name]

    def _parse_once(self, parser: "MegatronParser", cases: list[dict]) -> list[dict] | None:
        """The checker's results for `cases`, run once per session; None while another worker
        runs them (waiting would idle this worker as long as running its own share)."""
        text = json.dumps(cases, sort_keys=True)
        shared = self._shared_dir()
        done = shared / f"megatron-parsed-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        with open(shared / "megatron-parsed.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            if done.is_file():
                return json.loads(done.read_text())
            results = parser.parse_many(cases)
            done.write_text(json.dumps(results))
            return results


# ---- parsed arguments -> what the plan says -----------------------------------------------------

SHARDING = {"optim_grads": 2, "optim_grads_params": 3}
PRECISIONS = {("hybrid", "delayed"): "fp8", ("hybrid", "tensorwise"): "fp8-cs", ("e4m3", "blockwise"): "fp8-block",
              ("e4m3", "mxfp8"): "mxfp8"}


def plan_from_megatron(ns: dict, cfg: dict, model: ModelSpec, argv: list[str] | None = None) -> Plan:
    """The Plan Megatron will run, read from its parsed namespace and TransformerConfig (and from
    `argv` the one flag the checker does not report, --use-torch-fsdp2)."""
    tp, pp = cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"]
    vpp = cfg["virtual_pipeline_model_parallel_size"] or 1
    recompute, k = cfg["recompute_granularity"] or "none", None
    layout = ns.get("pipeline_model_parallel_layout")
    stage_layers = list(layout_from_string(layout)) if isinstance(layout, str) and layout not in ("<absent>", "None") \
        else None
    first, last = (ns.get(f"decoder_{end}_pipeline_num_layers") for end in ("first", "last"))
    flags = {"account_embedding": ns.get("account_for_embedding_in_pipeline_split") is True,
             "account_loss": ns.get("account_for_loss_in_pipeline_split") is True,
             "first": first if isinstance(first, int) else None, "last": last if isinstance(last, int) else None}
    if stage_layers is None and pp > 1 and (flags["account_embedding"] or flags["account_loss"]
                                            or flags["first"] is not None or flags["last"] is not None):
        # an uneven layout the launch set with Megatron's simpler flags (pipeline_layout.megatron_layout_args)
        stage_layers = list(layout_from_flags(model.layers, pp, vpp, **flags))
    if stage_layers is not None and not _hybrid_pattern(ns) and tuple(stage_layers) == balanced_layout(model.layers, pp, vpp):
        stage_layers = None  # the default split (uneven where pp·vpp does not divide the layers): no layout
    if _hybrid_pattern(ns) and pp > 1:  # a hybrid stack's layout: the pattern's '|' segments
        # the launch always writes them; the default (balanced) split reads back as none, as
        # `canonical` writes a plan that names it (an uneven balanced split such as 5, 6 x 13, 5
        # for 88 layers on pp 3 vpp 5 included)
        counts = [len(seg) for seg in _hybrid_pattern(ns).split("/")[0].split("|")]
        stage_layers = None if tuple(counts) == balanced_layout(model.layers, pp, vpp) else counts
    extra = {}
    if recompute == "full":
        assert cfg["recompute_method"] == "block"
        # block recompute of n layers per chunk is all of them once n covers the largest chunk;
        # below that, an explicit layout recomputes min(n, its layers) in each virtual stage (the
        # Plan's stage_recompute_layers), the default split n per chunk, n·vpp per stage
        n = cfg["recompute_num_layers"]
        # (the default split's fullest chunk where pp·vpp does not divide the layers: 126 layers over
        # pp 16 · vpp 2 run chunks of 4 and 3, so n 3 recomputes 3 of 4, not every layer)
        per_chunk = max(stage_layers) if stage_layers else max(balanced_layout(model.layers, pp, vpp))
        if n < per_chunk and stage_layers:
            extra["stage_recompute_layers"] = [min(n, s) for s in stage_layers]
        elif n < per_chunk:
            k = n * vpp
    if ns["use_megatron_fsdp"]:
        zero = SHARDING[ns["data_parallel_sharding_strategy"]]
    elif ns.get("use_torch_fsdp2") is True or "--use-torch-fsdp2" in (argv or ()):  # shards all three, overlaps
        zero, extra["dp_impl"] = 3, "torch-fsdp2"
    else:
        zero = 1 if ns["use_distributed_optimizer"] else 0
    if recompute == "selective":  # --recompute-modules (TransformerConfig: None -> ["core_attn"])
        extra["recompute_modules"] = cfg["recompute_modules"]
    if stage_layers:  # an explicit layout: the decoder layers per virtual stage (planner.pipeline_layout)
        extra["stage_layers"] = stage_layers
    if "etp" in Plan.model_fields:  # expert tensor parallel, where Plan has it: what Megatron runs
        default, etp = Plan.model_fields["etp"].default, cfg["expert_tensor_parallel_size"]
        extra["etp"] = default if default in (None, tp) and etp == tp else etp
    return Plan(
        **extra, tp=tp, pp=pp, dp=ns["data_parallel_size"], cp=cfg["context_parallel_size"],
        ep=cfg["expert_model_parallel_size"], micro_batch=ns["micro_batch_size"],
        global_batch=ns["global_batch_size"], vpp=vpp, sequence_parallel=cfg["sequence_parallel"],
        recompute=recompute, recompute_num_layers=k, zero_stage=zero,
        offload_activations=(offload_fraction_of_layers(cfg["cpu_offloading_num_layers"], model.layers)
                             if cfg["cpu_offloading"] else 0.0),
        offload_optimizer=ns["optimizer_offload_fraction"] if ns["optimizer_cpu_offload"] else 0.0,
        tp_comm_overlap=cfg["tp_comm_overlap"],
        dp_comm_overlap=ns["overlap_grad_reduce"] or extra.get("dp_impl") == "torch-fsdp2",
        cross_entropy_fusion=cfg["cross_entropy_loss_fusion"],
        grad_reduce_in_bf16=ns["grad_reduce_in_bf16"] and not ns["accumulate_allreduce_grads_in_fp32"],
        fp8_param_gather=ns["fp8_param_gather"],
        moe_a2a_overlap=bool(cfg.get("overlap_moe_expert_parallel_comm", False)),
        # megatron-core 0.19: the cost's DeepEP/HybridEP dispatch is the flex dispatcher with its
        # deepep backend (the config's default) or, on multi-node NVLink, hybridep (the checker
        # does not report the backend field)
        moe_dispatcher=("deepep" if ns.get("moe_token_dispatcher_type") == "flex"
                        and ns.get("moe_flex_dispatcher_backend", "deepep") in ("deepep", "hybridep", "<absent>")
                        else "alltoall"))


def _hybrid_pattern(ns: dict) -> str | None:
    pattern = ns.get("hybrid_layer_pattern")
    return pattern if isinstance(pattern, str) and pattern not in ("<absent>", "None") else None


def dtype_from_megatron(ns: dict) -> str:
    if ns["fp4"] is not None:
        assert (ns["fp4"], ns["fp4_recipe"]) == ("e2m1", "nvfp4") and ns["bf16"]
        return "nvfp4"
    if ns["fp8"] is not None:
        assert ns["bf16"]
        return PRECISIONS[ns["fp8"], ns["fp8_recipe"]]
    return "fp16" if ns["fp16"] else "bf16"


# ---- parsed arguments -> the model Megatron builds ------------------------------------------------

# quick_gelu: GPT-OSS's clamped gated activation (--quick-geglu), the planner's swiglu + clamp
ACTIVATIONS = {"silu": "swiglu", "squared_relu": "squared_relu", "gelu": "gelu", "quick_gelu": "swiglu"}


def model_from_megatron(ns: dict, cfg: dict, name: str = "megatron") -> ModelSpec:
    """The ModelSpec of the network Megatron builds from its parsed arguments. Megatron knows one
    shared-expert MLP of the summed width, so shared experts come back as 1 × that width."""
    # the checker prints callables: "<function silu at 0x…>", "<built-in function gelu>"
    act_name = re.search(r"function (\w+)", cfg["activation_func"]).group(1)
    assert (act_name in ("silu", "quick_gelu")) == bool(cfg["gated_linear_unit"]), (act_name, cfg["gated_linear_unit"])
    moe = None
    hybrid = _hybrid_pattern(ns)
    if cfg["num_moe_experts"]:
        freq = cfg["moe_layer_freq"]
        pattern = [1] * cfg["num_layers"] if freq == 1 or hybrid else freq  # a hybrid's pattern places its MoE blocks
        assert isinstance(pattern, list) and len(pattern) == cfg["num_layers"], freq
        first_dense = pattern.index(1)
        # leading dense layers, then every step-th layer MoE (interleaved: Llama 4 Maverick), any
        # dense rest at the end
        step = 1 + next((j for j, x in enumerate(pattern[first_dense + 1:]) if x), len(pattern))
        if step > 1:  # the first MoE layer is the step-th after the leading dense ones
            first_dense -= step - 1
        expected = [0] * first_dense + [1 if (j + 1) % step == 0 else 0 for j in range(len(pattern) - first_dense)]
        assert pattern == expected, pattern
        assert not cfg["moe_pad_expert_input_to_capacity"]
        shared = cfg["moe_shared_expert_intermediate_size"]
        moe = MoESpec(num_experts=cfg["num_moe_experts"], top_k=cfg["moe_router_topk"],
                      expert_ffn=cfg["moe_ffn_hidden_size"], shared_experts=1 if shared else 0,
                      shared_expert_ffn=shared, first_dense_layers=first_dense, layer_step=step,
                      capacity_factor=cfg["moe_expert_capacity_factor"], latent_size=cfg["moe_latent_size"],
                      router_groups=cfg["moe_router_num_groups"], router_group_topk=cfg["moe_router_group_topk"],
                      apply_probs_on_input=bool(cfg.get("moe_apply_probs_on_input")),
                      shared_expert_gate=bool(cfg.get("moe_shared_expert_gate")))
    mamba, main = None, None
    if hybrid:
        main = hybrid.split("/")[0].replace("|", "")
        assert all(part == "*E" for part in hybrid.split("/")[1:]), hybrid  # MTP depths as costed
        if "M" in main:
            mamba = MambaSpec(num_heads=cfg["mamba_num_heads"], head_dim=cfg["mamba_head_dim"],
                              state_dim=cfg["mamba_state_dim"], groups=cfg["mamba_num_groups"])
    mla = None
    if cfg["multi_latent_attention"]:
        # MLA runs Megatron's YaRN RoPE: at its argument defaults (factor 1, mscale 1, mscale_all_dim
        # 0) plain RoPE (core/models/common/embeddings/yarn_rotary_pos_embedding.py), else the
        # checkpoint's scaling the spec carries (MLASpec yarn_factor, mscale, mscale_all_dim)
        assert cfg["rope_type"] == "yarn", cfg["rope_type"]
        yarn = {field: (None if cfg[key] == default else cfg[key]) for field, key, default in (
            ("yarn_factor", "rotary_scaling_factor", 1.0), ("mscale", "mscale", 1.0),
            ("mscale_all_dim", "mscale_all_dim", 0.0))}
        if yarn["yarn_factor"] is not None and yarn["mscale"] is None:
            yarn["mscale"] = 1.0  # emitted as given: a spec's mscale 1 beside its factor
        mla = MLASpec(q_lora_rank=cfg["q_lora_rank"], kv_lora_rank=cfg["kv_lora_rank"],
                      qk_nope_head_dim=cfg["qk_head_dim"], qk_rope_head_dim=cfg["qk_pos_emb_head_dim"],
                      v_head_dim=cfg["v_head_dim"], **yarn)
    assert cfg["attention_dropout"] == cfg["hidden_dropout"]
    return ModelSpec(
        name=name, layers=cfg["num_layers"], hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
        head_dim=cfg["kv_channels"], query_groups=cfg["num_query_groups"], ffn=cfg["ffn_hidden_size"],
        seq_length=ns["seq_length"], vocab=ns["vocab_size"], activation=ACTIVATIONS[act_name],
        tied_embeddings=not ns["untie_embeddings_and_output_weights"],
        position_embedding={"rope": "rope", "none": "none"}.get(ns["position_embedding_type"], "learned"),
        biases=cfg["add_bias_linear"], dropout=cfg["attention_dropout"] > 0, qk_norm=cfg["qk_layernorm"] and not cfg["multi_latent_attention"],
        qk_l2_norm=cfg["qk_l2_norm"], no_rope_every=_nope_period(cfg.get("no_rope_freq")),
        qkv_bias=bool(cfg["add_qkv_bias"]) and not cfg["add_bias_linear"], rotary_percent=ns["rotary_percent"],
        moe=moe, mla=mla, mtp_layers=cfg["mtp_num_layers"] or 0,
        activation_clamp=cfg.get("activation_func_clamp_value"),
        # --softmax-type learnable builds a softmax offset per head (counted, ModelSpec.attention_params)
        attention_sinks=cfg["softmax_type"] == "learnable",
        mtp_shared_weights=bool(cfg["mtp_num_layers"] and cfg["mtp_use_repeated_layer"]),
        hybrid_pattern=main, mamba=mamba)


def _nope_period(pattern) -> int | None:
    """n from the per-layer list Megatron expands --no-rope-freq n into ([0, ..., 0, 1] repeated,
    1 = no RoPE; transformer_config.py __post_init__); None for no NoPE layers."""
    if not pattern:
        return None
    if isinstance(pattern, int):
        return pattern
    n = pattern.index(1) + 1
    assert pattern == ([0] * (n - 1) + [1]) * (len(pattern) // n), pattern
    return n


def model_shape(m: ModelSpec) -> dict:
    """What the cost model reads from a ModelSpec, in forms that do not depend on how the spec was
    written (query_groups None = heads; n shared experts of width w = one of width n·w)."""
    moe = m.moe
    return {
        "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_groups": m.kv_groups,
        "head_dim": m.head_dim, "q_hidden": m.q_hidden, "kv_hidden": m.kv_hidden, "ffn": m.ffn_hidden,
        "seq_length": m.seq_length, "vocab": m.vocab, "activation": m.activation,
        "tied_embeddings": m.tied_embeddings, "position_embedding": m.position_embedding,
        "biases": m.biases, "qkv_bias": m.qkv_bias, "rotary_percent": m.rotary_percent,
        "dropout": m.dropout, "qk_norm": m.qk_norm, "qk_l2_norm": m.qk_l2_norm, "mtp_layers": m.mtp_layers,
        "mla": m.mla.model_dump() if m.mla else None,
        "experts": moe and (moe.num_experts, moe.top_k, m.expert_ffn_hidden,
                            moe.shared_experts * m.shared_expert_ffn_hidden, moe.first_dense_layers,
                            moe.layer_step, moe.capacity_factor),
        "dense_layers": m.dense_layers, "moe_layers": m.moe_layers,
        "hybrid_pattern": m.hybrid_pattern, "mamba": m.mamba.model_dump() if m.mamba else None,
        "latent_size": moe and moe.latent_size, "mtp_shared_weights": m.mtp_shared_weights,
        "router_groups": moe and (moe.router_groups, moe.router_group_topk),
        "no_rope_every": m.no_rope_every, "apply_probs_on_input": moe and moe.apply_probs_on_input,
        "shared_expert_gate": moe and moe.shared_expert_gate,
    }


def canonical(plan: Plan, layers: int) -> Plan:
    """`plan` as `plan_from_megatron` reads one back, the same launch either way: a per-stage
    recompute of every layer, or one count covering the fullest rank, as none; the default split written out as none; over an explicit
    uneven layout, one count per stage as the per-chunk counts Megatron runs
    (uniform_chunk_recompute), and over the default split the reverse. PlanArrays costs both
    alike. A flex (deepep) dispatcher without an expert-parallel group (etp·ep = 1) is launched as
    alltoall (emit.launched_dispatcher): nothing is dispatched across ranks either way."""
    from planner.megatron.emit import launched_dispatcher
    if launched_dispatcher(plan) != plan.moe_dispatcher:
        plan = plan.model_copy(update={"moe_dispatcher": launched_dispatcher(plan)})
    if plan.stage_recompute_layers is not None and tuple(plan.stage_recompute_layers) == tuple(plan.stage_layers):
        plan = plan.model_copy(update={"stage_recompute_layers": None})  # every layer: as no count
    if plan.recompute == "full" and plan.recompute_num_layers and \
            plan.recompute_num_layers >= fullest_rank_layers(plan, layers):
        plan = plan.model_copy(update={"recompute_num_layers": None})  # a count covering every layer: all
    balanced = plan.stage_layers is not None and tuple(plan.stage_layers) == balanced_layout(layers, plan.pp, plan.vpp)
    if plan.stage_layers is not None and plan.recompute == "full":
        if plan.recompute_num_layers and not balanced:
            chunks = uniform_chunk_recompute(plan.stage_layers, plan.recompute_num_layers, plan.vpp)
            if chunks is not None:
                plan = plan.model_copy(update={"recompute_num_layers": None, "stage_recompute_layers": chunks})
        elif plan.stage_recompute_layers and balanced:
            k = max(plan.stage_recompute_layers) * plan.vpp
            if tuple(plan.stage_recompute_layers) == uniform_chunk_recompute(plan.stage_layers, k, plan.vpp):
                plan = plan.model_copy(update={"recompute_num_layers": k, "stage_recompute_layers": None})
    if balanced and plan.stage_recompute_layers is None:
        return plan.model_copy(update={"stage_layers": None})
    return plan
