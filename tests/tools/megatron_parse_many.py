"""Run the shared Megatron argument checker (../shared/tools/megatron_check) on many argument
lists in ONE process: import megatron-core once (~7 s), then fork a fresh child per list, because
Megatron's parser keeps global state. Runs under the checker's own Python, not the project's:

    PYTHONPATH=<wheel dir>:<checker dir> <checker python> megatron_parse_many.py < cases.json

stdin: a JSON list of {"argv": [...], "world_size": N, "env": {NAME: value}, "arch": 8|9|10};
stdout (last line): a JSON list of the checker's result objects, in the same order."""
import json
import os
import sys

sys.argv = [sys.argv[0]]
import validate_megatron_args as checker  # noqa: E402  (the shared checker; imports Megatron)

# Namespace fields the round trip reads beyond the checker's own list.
checker.NS_FIELDS += [f for f in ("fp4", "fp4_recipe", "optimizer_offload_fraction",
                                  "init_model_with_meta_device", "save_interval", "log_throughput",
                                  "log_interval", "make_vocab_size_divisible_by", "manual_gc_interval",
                                  "save", "load", "cuda_graph_impl", "check_for_nan_in_loss_and_grad",
                                  "apply_rope_fusion", "use_precision_aware_optimizer", "exp_avg_dtype",
                                  "exp_avg_sq_dtype", "cuda_graph_modules", "pipeline_model_parallel_layout",
                                  "hybrid_layer_pattern", "megatron_fsdp_main_grads_dtype",
                                  "accumulate_allreduce_grads_in_fp32", "rotary_percent",
                                  "reuse_grad_buf_for_mxfp8_param_ag", "rotary_base", "use_rope_scaling",
                                  "rope_scaling_factor", "rotary_seq_len_interpolation_factor")
                   if f not in checker.NS_FIELDS]
# TransformerConfig fields of the model's shape beyond the checker's list (MLA, q/k norms,
# shared experts, dense/MoE layer pattern, MTP, capacity) and what GPT-OSS would need.
checker.CFG_FIELDS += [f for f in ("multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                                   "qk_pos_emb_head_dim", "v_head_dim", "qk_layernorm",
                                   "moe_shared_expert_intermediate_size", "moe_layer_freq", "mtp_num_layers",
                                   "moe_expert_capacity_factor", "moe_token_drop_policy",
                                   "moe_pad_expert_input_to_capacity", "softmax_type", "window_size",
                                   "glu_linear_offset", "activation_func_clamp_value", "add_qkv_bias",
                                   "normalization", "position_embedding_type", "seq_length", "rope_type",
                                   "rotary_scaling_factor", "mscale", "mscale_all_dim", "original_max_position_embeddings",
                                   "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                                   "mamba_num_heads", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups",
                                   "moe_latent_size", "mtp_use_repeated_layer", "moe_router_num_groups",
                                   "moe_router_group_topk", "moe_router_fusion", "qk_l2_norm", "layernorm_epsilon",
                                   "moe_router_score_function", "moe_router_enable_expert_bias",
                                   "moe_router_topk_scaling_factor", "window_attn_skip_freq",
                                   "moe_router_pre_softmax", "moe_aux_loss_coeff", "no_rope_freq",
                                   "moe_apply_probs_on_input", "moe_shared_expert_gate")
                       if f not in checker.CFG_FIELDS]


def _share_field_docstrings() -> None:
    """Parse Megatron's config dataclasses' field docstrings once, here, before the forks.

    parse_args builds its parser from the config dataclasses and reads each field's help text
    from the class's source (ArgumentGroupFactory._get_field_docstrings: inspect.getsource +
    ast, ~1 s of the ~1.2 s a child took). The text is a pure function of the class, so the
    parent builds one parser (only that; nothing is parsed or validated) with the lookup
    memoised per class, and every forked child inherits the filled memo."""
    import argparse

    from megatron.training import argument_utils
    factory = argument_utils.ArgumentGroupFactory
    original, memo = factory._get_field_docstrings, {}

    def cached(self, src_cfg_class):
        if src_cfg_class not in memo:
            memo[src_cfg_class] = original(self, src_cfg_class)
        return dict(memo[src_cfg_class])
    factory._get_field_docstrings = cached
    checker.A.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


def _child(case: dict, write_fd: int) -> None:
    arch = int(case.get("arch", 9))
    checker.A.get_device_arch_version = lambda: arch
    # --moe-grouped-gemm asks torch.cuda for the compute capability (arguments.py, needs >= 8):
    # answer as the emulated GPU does (FAKE_GPU_ARCH semantics), not as this CPU-only torch.
    import torch
    torch.cuda.get_device_capability = lambda *args, **kwargs: (arch, 0)
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # as the checker does: only the launch's env
    for key, value in case.get("env", {}).items():
        os.environ[key] = str(value)
    result = checker.validate(case["argv"], int(case["world_size"]))
    with os.fdopen(write_fd, "w") as out:
        out.write(json.dumps(result))


def main() -> None:
    cases = json.load(sys.stdin)
    _share_field_docstrings()
    results = []
    for case in cases:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                _child(case, write_fd)
            finally:
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as inp:
            text = inp.read()
        os.waitpid(pid, 0)
        results.append(json.loads(text) if text else {"ok": False, "error": "checker child died"})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
