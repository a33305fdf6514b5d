"""Parameter counts against the modules Megatron-Core 0.19.2 builds (pretrain_gpt.py's GPTModel /
pretrain_mamba.py's HybridModel from the arguments `planner megatron --tp 1 --pp 1 --format json`
emits, built on the meta device on CPU with ../shared/tools/megatron_check's environment and the
local spec, TE-fused norms counted as TE builds them). The numbers below are those builds'
named_parameters() sums, split by module and sharded as Megatron shards them (column/row-parallel
weights over tp, experts over ep·etp, norms and the router replicated, TE's duplicated MLA
down-projections replicated); the suite cannot rebuild the models cheaply."""

import pytest

from planner.analytical import PlanArrays
from planner.analytical.layer_kinds import dense_layer_spec
from planner.analytical.memory import stage_params
from planner.model import load_model
from planner.plan import Plan


def _stage(name, tp, pp, ep):
    model = load_model(name)
    plan = Plan(tp=tp, pp=pp, dp=8, ep=ep, micro_batch=1, global_batch=64, sequence_parallel=tp > 1)
    P = PlanArrays.from_plans([plan], model.layers, dense_layer_spec(model))
    return [part[0] for part in stage_params(model, P, by_block=True)]


def test_mtp_stage_holds_an_embedding_copy():
    # DeepSeek-V3 at tp2 pp2 ep4: Megatron's last stage (MTP) builds output_layer.weight and
    # embedding.word_embeddings.weight, each [129280, 7168] / tp 2 = 463,339,520 per GPU;
    # the first stage only the embedding
    _, vocab, _ = _stage("deepseek-v3", 2, 2, 4)
    assert list(vocab[:2]) == [463_339_520, 926_679_040]


# per-GPU transformer-block parameters of pipeline rank 0, as Megatron shards its built modules,
# less the norms, which stage_params divides by tp (documented: negligible)
@pytest.mark.parametrize("name, built, norms", [
    # 31 layers (3 dense); MLA's down-projections h·(1536 + 512 + 64) = 15,138,816 a layer (TELinear,
    # duplicated) and the MoE layers' router 256×7168 stay whole on each TP rank; norms
    # 31·(2·7168 + 1536 + 512)/2
    ("deepseek-v3", 4_397_776_896, 253_952),
    # 47 MoE layers with a 128×4096 router each; norms 47·(2·4096 + 2·128)/2
    ("qwen3-235b-a22b", 1_700_663_040, 198_528),
])
def test_weights_tensor_parallelism_does_not_split(name, built, norms):
    blocks, _, _ = _stage(name, 2, 2, 4)
    assert blocks[0] == built - norms


def test_learned_positions_are_not_split_over_tensor_parallelism():
    # GPT-3 175B at tp2 pp2: Megatron's first stage holds word_embeddings [51200, 12288] / tp 2 =
    # 314,572,800 and position_embeddings [2048, 12288] = 25,165,824 whole; the last stage the
    # tied LM head copy only
    _, vocab, _ = _stage("gpt3-175b", 2, 2, 1)
    assert list(vocab[:2]) == [339_738_624, 314_572_800]


def test_gpt_oss_counts_sinks_and_router_bias_and_no_rmsnorm_bias():
    # gpt-oss-20b as Megatron builds it from `planner megatron`'s arguments (linear biases,
    # --normalization RMSNorm, --softmax-type learnable): 20,914,757,184 parameters. A layer
    # 823,186,976 = qkv 2880·5120 + 5120 bias, proj 4096·2880 + 2880 bias, 64 softmax offsets
    # (sinks), router 32·2880 + 32 bias, two RMSNorm weights 2·2880 (no bias), 32 experts ×
    # (3·2880·2880 + 2·2880 + 2880 biases); the final RMSNorm 2880
    m = load_model("gpt-oss-20b")
    assert m.moe_layer_params == 823_186_976
    assert m.output_params - m.vocab * m.hidden == 2880
    assert m.num_params == 20_914_757_184


@pytest.mark.parametrize("name, ep, built, norms, experts", [
    # GPT-3 175B at tp2 pp2, rank 0's 48 layers: 43,492,147,200 per GPU, the row-parallel biases
    # (linear_proj.bias, linear_fc2.bias: 48·2·12288) whole on each TP rank; less half the norms
    # (LayerNorm weight + bias: 48·4·12288/2 = 1,179,648)
    ("gpt3-175b", 1, 43_492_147_200, 1_179_648, 0),
    # gpt-oss-20b at tp2 pp2 ep4, rank 0's 12 layers: 160,493,568 per GPU, linear_proj.bias 2880 and
    # the router's 32×2880 + 32 whole on each TP rank, the 64 sinks split (32 a rank); norms
    # 12·2·2880/2. Experts 1,194,946,560: 8 local experts a layer, fc1 weight and bias split over
    # etp 2, each fc2 bias (2880) whole: 12·8·((5760·2880 + 5760 + 2880·2880)/2 + 2880)
    ("gpt-oss-20b", 4, 160_493_568, 34_560, 1_194_946_560),
])
def test_row_parallel_biases_are_not_split(name, ep, built, norms, experts):
    blocks, _, expert = _stage(name, 2, 2, ep)
    assert blocks[0] == built - norms
    assert expert[0] == experts


def test_mla_without_a_query_lora_counts_the_checkpoints_weights():
    # DeepSeek-V2-Lite (q_lora_rank null): the checkpoint's attention is q_proj 2048×16·192,
    # kv_a_proj_with_mqa 2048×(512 + 64), kv_a_layernorm 512, kv_b_proj 512×16·(128 + 128),
    # o_proj 16·128×2048, and no query norm. Megatron-Core 0.19.2 builds 15,706,539,520 parameters
    # from planner megatron's arguments: under --qk-layernorm without a query LoRA its
    # QKNormConfigResolver (transformer/mla_qk_norm_config.py) fuses a hidden-wide norm into
    # linear_q_proj, 27·2048 weights the checkpoint does not have (Megatron-Bridge's conversion
    # tests call it a phantom parameter); parplan counts the checkpoint's
    m = load_model("deepseek-v2-lite")
    attention = 2048 * 16 * 192 + 2048 * (512 + 64) + 512 + 512 * 16 * (128 + 128) + 16 * 128 * 2048
    assert m.attention_params == attention == 13_763_072
    assert m.num_params == 15_706_539_520 - 27 * 2048
