"""Reading the published runs: all three files, their schemas, precision names, skips with reasons,
one-line errors for malformed records, and the packaged copy equal to the shared original."""
import copy
import filecmp
import re

import pytest
import yaml
from typer.testing import CliRunner

from hardware.errors import SpecError
from planner.cli import app
from planner.reference import (BRIDGE_FP8_IS_CURRENT_SCALING, REFERENCE_DIR, REFERENCE_FILES, Skipped, bridge_release,
                               family_of, load_reference, parse_precision, system_preset_for)
from tests.conftest import SHARED_REFERENCE_DIR, one_line_error, reference_yaml

runner = CliRunner()


@pytest.fixture(scope="module")
def loaded():
    return load_reference()


@pytest.fixture(scope="module")
def records():
    return {f: reference_yaml(REFERENCE_DIR / f)["records"] for f in REFERENCE_FILES}


@pytest.mark.skipif(not SHARED_REFERENCE_DIR.exists(), reason="no shared/reference beside the repository")
@pytest.mark.parametrize("name", list(REFERENCE_FILES) + ["megatron_args.md"])
def test_packaged_copy_equals_shared(name):
    assert filecmp.cmp(REFERENCE_DIR / name, SHARED_REFERENCE_DIR / name, shallow=False)


def test_every_record_is_read_or_skipped_with_a_reason(loaded, records):
    cases, skipped = loaded
    ids = [c.id for c in cases] + [s.id for s in skipped]
    assert sorted(ids) == sorted(r["id"] for recs in records.values() for r in recs)
    assert all(s.reason for s in skipped)
    # each file contributes compared rows
    for f, recs in records.items():
        own = {r["id"] for r in recs}
        assert sum(c.id in own for c in cases) >= 20, f


@pytest.mark.parametrize("text,dtype", [("FP8", "fp8"), ("fp8", "fp8"), ("fp8 (Transformer Engine)", "fp8"),
                                        ("FP8-CS", "fp8-cs"), ("FP8-MX", "mxfp8"), ("MXFP8", "mxfp8"),
                                        ("mxfp8", "mxfp8"), ("NVFP4", "nvfp4"), ("BF16", "bf16"),
                                        ("fp16 mixed", "fp16"), ("na", "bf16")])
def test_precision_names_are_case_insensitive(text, dtype):
    assert parse_precision(text, "r1")[0] == dtype


def test_unknown_precision_is_a_one_line_error_naming_record_and_field():
    with pytest.raises(SpecError, match=r"reference r9: precision: unknown precision 'INT4'"):
        parse_precision("INT4", "r9")


def test_upper_case_fp8_bridge_record_is_fp8_not_bf16(loaded, records):
    # issue 9: `precision: FP8` (as Megatron-Bridge publishes) was read as bf16. From release 25.11
    # on, Bridge's performance scripts run FP8 only as current scaling (their --compute_dtype has
    # fp8_cs, fp8_mx, fp8_sc, no delayed scaling; the 25.11 table names the same runs FP8-CS); the
    # 25.09 scripts defaulted to delayed scaling (--fp8_recipe ds).
    cases, _ = loaded
    by_id = {c.id: c for c in cases}
    fp8_ids = [r["id"] for r in records["bridge_runs.yaml"] if r["precision"] == "FP8" and r["id"] in by_id]
    assert fp8_ids and all(bridge_release(i) >= (26, 2) for i in fp8_ids)
    assert all(by_id[i].job.dtype == "fp8-cs" for i in fp8_ids)
    assert all(BRIDGE_FP8_IS_CURRENT_SCALING in by_id[i].assumptions for i in fp8_ids)
    cs = [r["id"] for r in records["bridge_runs.yaml"] if r["precision"] == "FP8-CS" and r["id"] in by_id]
    assert cs and all(by_id[i].job.dtype == "fp8-cs" for i in cs)
    not_stated = [r["id"] for r in records["bridge_runs.yaml"] if r["precision"].startswith("not stated") and r["id"] in by_id]
    assert all(bridge_release(i) == (25, 9) for i in not_stated)
    assert not_stated and all(by_id[i].job.dtype == "fp8" for i in not_stated)
    mx = [r["id"] for r in records["bridge_runs.yaml"] if r["precision"] in ("MXFP8", "FP8-MX") and r["id"] in by_id]
    assert mx and all(by_id[i].job.dtype == "mxfp8" for i in mx)


def _write(tmp_path, base_file, rid, mutate):
    data = reference_yaml(REFERENCE_DIR / base_file)
    rec = copy.deepcopy(next(r for r in data["records"] if r["id"] == rid))
    mutate(rec)
    data["records"] = [rec]
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_non_numeric_layout_field_is_a_one_line_error(tmp_path):
    path = _write(tmp_path, "measured_runs.yaml", "nemo2407_GPT3-5B_64gpu_gbs2048",
                  lambda r: r["parallel"].update(tp="eight"))
    with pytest.raises(SpecError, match=r"reference nemo2407_GPT3-5B_64gpu_gbs2048: parallel\.tp: expected an integer"):
        load_reference(path)
    one_line_error(runner.invoke(app, ["validate", "--reference", str(path), "--summary"]),
                   "nemo2407_GPT3-5B_64gpu_gbs2048", "parallel.tp")


def test_fp8_weights_on_a_bf16_record_are_a_one_line_error(tmp_path):
    """parallel.fp8_param_gather keeps FP8 primary weights, which a bf16 run has not: refused by
    record and field, as planner estimate refuses --fp8-param-gather with --dtype bf16."""
    path = _write(tmp_path, "measured_runs.yaml", "dgxc_v24.11.1_LLAMA3-8B_bf16_8gpu",
                  lambda r: r["parallel"].update(fp8_param_gather=True))
    with pytest.raises(SpecError, match=r"reference dgxc_v24.11.1_LLAMA3-8B_bf16_8gpu: parallel\.fp8_param_gather"):
        load_reference(path)
    one_line_error(runner.invoke(app, ["validate", "--reference", str(path), "--summary"]),
                   "dgxc_v24.11.1_LLAMA3-8B_bf16_8gpu", "parallel.fp8_param_gather")
    worded = _write(tmp_path, "measured_runs.yaml", "dgxc_v24.11.1_LLAMA3-8B_bf16_8gpu",
                    lambda r: r["parallel"].update(fp8_param_gather="yes"))
    with pytest.raises(SpecError, match=r"parallel\.fp8_param_gather: expected true, false"):
        load_reference(worded)


def test_malformed_fsdp_record_names_the_field(tmp_path):
    path = _write(tmp_path, "fsdp_moe_runs.yaml", "torchtitan_llama3-8b_8gpu_fsdp8",
                  lambda r: r["measured"].update(tokens_per_sec_per_gpu="fast"))
    with pytest.raises(SpecError, match=r"torchtitan_llama3-8b_8gpu_fsdp8: measured\.tokens_per_sec_per_gpu"):
        load_reference(path)


def test_fsdp_schema_record_maps_to_zero3_and_its_step_time(loaded):
    cases, _ = loaded
    c = next(c for c in cases if c.id == "torchtitan_llama3-8b_8gpu_fsdp8")
    assert c.framework == "torchtitan FSDP2" and c.plan.zero_stage == 3 and c.plan.dp == 8
    assert c.system.accelerator.name == "H100-GT-96GB" and not c.fit
    # step time = global batch · seq / (tokens/s per GPU · GPUs) = 16 · 8192 / (5762 · 8)
    assert c.measured_step_s == pytest.approx(16 * 8192 / (5762 * 8))
    assert c.family == "Llama-3" and c.kind == "dense"


def test_moe_fields_from_the_fsdp_schema(loaded):
    cases, _ = loaded
    c = next(c for c in cases if c.id == "torchtitan_llama4-scout_256gpu_fsdp256_ep16_mxfp8")
    assert (c.model.moe.num_experts, c.model.moe.top_k, c.model.moe.expert_ffn) == (16, 1, 8192)
    assert c.plan.ep == 16 and c.job.dtype == "mxfp8" and c.system.nvlink_domain_gpus == 72


def test_uneven_pipeline_records_are_read_with_an_explicit_layout(loaded):
    # issue 8/9: 126-, 94- and 61-layer records were skipped (144 skips before, 42 after); no
    # record is skipped for its layout now
    cases, skipped = loaded
    assert not [s for s in skipped if "pipeline layout" in s.reason]
    assert len(skipped) <= 42
    by_id = {c.id: c for c in cases}
    # Llama-3.1-405B, pp 8 vpp 8: 64 virtual stages of 126 layers. Hand-derived: Megatron's
    # --account-for-embedding/loss-in-pipeline-split counts 126 + 2 = 128 slots, 2 a stage, and the
    # first (embedding) and last (loss) stages give one back: 1, 2 × 62, 1.
    c = by_id["bridge_26.06_LLAMA3.1_405B_DGX-H100_FP8_1024gpu_gbs1536"]
    assert (c.plan.pp, c.plan.vpp) == (8, 8)
    assert c.plan.stage_layers == (1,) + (2,) * 62 + (1,)
    assert any("as the recipe sets it" in a and "account_for_embedding/loss" in a for a in c.assumptions)
    # Qwen3-235B, 94 layers over pp 8 vpp 4: 32 stages; every stage holds 2 or 3, the sum is 94
    q = by_id["bridge_26.04_Qwen3_235B_a22B_DGX-H100_FP8_256gpu_gbs8192"]
    assert sum(q.plan.stage_layers) == 94 and len(q.plan.stage_layers) == 32
    assert set(q.plan.stage_layers) == {2, 3}
    # DeepSeek-V3 GB200 guide: 'Et|(tt|)*30L' is the embedding with one layer, thirty stages of two,
    # and the loss alone: 1 + 60 + 0 = 61 layers over pp 8 × vpp 4 = 32 stages; the record's own
    # layout, so no balanced-split assumption
    d = by_id["mcore-dsv3-gb200guide_deepseek-v3_256gpu_tp1_pp8_vpp4_ep32_step00"]
    assert d.plan.stage_layers == (1,) + (2,) * 30 + (0,)
    assert not any("balanced split" in a for a in d.assumptions)


def test_custom_layout_that_does_not_match_the_run_is_skipped_with_the_reason(tmp_path, records):
    rec = copy.deepcopy(next(r for r in records["fsdp_moe_runs.yaml"]
                             if r["id"] == "mcore-dsv3-gb200guide_deepseek-v3_256gpu_tp1_pp8_vpp4_ep32_step00"))
    rec["parallel"]["pp_layout"] = "Et|(tt|)*29L"  # 31 stages of 59 layers: not this run
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"records": [rec]}))
    cases, skipped = load_reference(path)
    assert not cases and "31 stages of 59 layers" in skipped[0].reason and "32 stages of 61" in skipped[0].reason


def test_gpu_names_map_to_presets():
    assert system_preset_for("H100 (Grand Teton, HBM2e 96GB, 500W power limit)")[0] == "h100-grand-teton"
    assert system_preset_for("GB200")[0] == "gb200-nvl72"
    assert system_preset_for("GB300")[0] == "gb300-nvl72"
    assert system_preset_for("a100_40gb")[0] == "a100-40g"
    assert system_preset_for("H100-SXM5-80GB")[0] == "h100-sxm"
    assert system_preset_for("V100-SXM3-32GB (DGX-2)")[0] == "dgx2-v100"
    # the DGX-1's V100 (SXM2, hybrid cube-mesh NVLink, not a switch) has no preset
    assert system_preset_for("V100-SXM2-16GB (DGX-1)")[0] is None
    # the export variants are their own systems (NVLink 400 GB/s), not the H100/A100 presets
    assert system_preset_for("H800")[0] == "h800"
    assert system_preset_for("A800-SXM4-80GB")[0] == "a800-80g"
    assert system_preset_for("GH200 Grace Hopper")[0] == "gh200"  # not the H200 preset
    # a board with other peaks and links is skipped, not read as the SXM part
    assert system_preset_for("H100 PCIe 80GB")[0] is None
    assert system_preset_for("H100 NVL")[0] is None
    assert system_preset_for("A100-PCIe-40GB")[0] is None
    # a vendor prefix does not hide a Blackwell SKU, and a GB200 is not read as a B200
    assert system_preset_for("NVIDIA B200")[0] == "b200"
    assert system_preset_for("NVIDIA B300 SXM")[0] == "b300"
    assert system_preset_for("NVIDIA GB200 NVL72")[0] == "gb200-nvl72"


def test_blockwise_fp8_reads_as_the_block_recipe():
    from planner.reference import parse_precision
    assert parse_precision("fp8-blockwise", "r")[0] == "fp8-block"
    dtype, note = parse_precision("FP8 blockwise (DeepSeek-V3 tiles)", "r")
    assert dtype == "fp8-block" and "blockwise" in note
    assert parse_precision("FP8", "r")[0] == "fp8"  # delayed scaling stays delayed


def test_family_map():
    assert family_of("LLAMA3.1_405B") == "Llama-3"
    assert family_of("DeepSeekV3 (w/ MTP)") == "DeepSeek-V3"
    assert family_of("Qwen3_235B_a22B") == "Qwen3"
    assert family_of("Nemotron4 340B") == "Nemotron-4"
    assert family_of("GPT-3 175B") == "GPT"


def test_validate_prints_counts_and_skip_reasons():
    result = runner.invoke(app, ["validate", "--summary"])
    assert result.exit_code == 0, result.output
    assert "read 616 records" in result.output
    assert "read 616 records: 595 compared, 21 skipped" in result.output
    assert "skipped torchtitan_b200-dense_8gpu_fsdp8_bf16: model dimensions not published" in result.output
    for title in ("by source", "dense / MoE", "by accelerator", "by framework", "by model family"):
        assert title in result.output


def test_dsv3_ladder_switches_recompute_modules_where_the_guide_does(loaded):
    """The DeepSeek-V3 GB200 guide (§2.2.2): row 4 'Remove up_proj recompute' changed
    --recompute-modules from 'mlp up_proj' to 'mlp moe_act'; rows 0-3 ran the first set."""
    by_id = {c.id: c for c in loaded[0]}
    stem = "mcore-dsv3-gb200guide_deepseek-v3_256gpu_tp1_pp8_vpp4_ep32_step"
    assert by_id[stem + "03"].plan.recompute_modules == ("mla_up_proj", "mlp")
    for row in ("04", "12"):
        assert by_id[stem + row].plan.recompute_modules == ("mlp", "moe_act")
        assert any("from row 4 on" in a for a in by_id[stem + row].assumptions)


def test_a_record_without_dimensions_takes_the_preset_it_names(loaded):
    """torchtitan's NVFP4 page prints "Qwen3 8B" and no dimensions: the qwen3-8b preset (Hugging Face
    Qwen/Qwen3-8B config.json) supplies them, at the record's own sequence length, and the row says
    so; a record naming no preset ("unspecified dense model") stays skipped."""
    cases, skipped = loaded
    qwen = [c for c in cases if c.id.startswith("torchtitan_qwen3-8b")]
    assert len(qwen) == 3
    for c in qwen:
        m = c.model
        assert (m.layers, m.hidden, m.heads, m.query_groups, m.ffn, m.vocab, m.seq_length) == \
            (36, 4096, 32, 8, 12288, 151936, 2048)
        assert any("qwen3-8b preset" in a for a in c.assumptions)
    assert [s for s in skipped if s.id.startswith("torchtitan_b200-dense")]
    assert all("model dimensions not published" in s.reason for s in skipped if s.id.startswith("torchtitan_b200-dense"))


def test_a_record_with_fewer_moe_layers_interleaves_them(tmp_path, records):
    """A record printing 24 MoE layers of 48 (Llama 4 Maverick's every-second-layer MoE) is costed
    as that, not as 48 MoE layers; a count no whole step gives is refused by name."""
    base = next(r for r in records["fsdp_moe_runs.yaml"] if r["id"] == "torchtitan_llama4-scout_256gpu_fsdp256_ep16_bf16")
    rec = copy.deepcopy(base)
    rec["model"]["moe"]["moe_layers"] = 24
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"records": [rec]}))
    cases, _ = load_reference(path)
    model = cases[0].model
    assert model.moe.layer_step == 2 and (model.dense_layers, model.moe_layers) == (24, 24)
    rec["model"]["moe"]["moe_layers"] = 20  # 48 / 20 is no step
    path.write_text(yaml.safe_dump({"records": [rec]}))
    with pytest.raises(SpecError, match=r"model\.moe\.moe_layers: 20 MoE layers of the 48 after the leading dense ones"):
        load_reference(path)
    rec["model"]["moe"]["moe_layers"] = 48  # every layer: as before
    path.write_text(yaml.safe_dump({"records": [rec]}))
    assert load_reference(path)[0][0].model.moe.layer_step == 1


# --- malformed records found by an independent audit (2026-11-29): each is refused in one line ---

def _refused(path, *words):
    one_line_error(runner.invoke(app, ["validate", "--reference", str(path), "--summary"]), *words)


def test_an_alias_inside_what_it_names_is_refused_not_followed(tmp_path):
    """`a: &a [*a]` builds a list holding itself; every walk over it recursed until Python gave up
    (an internal error, exit 70). Shared aliases (a source two records name) stay allowed."""
    for text, where in (("a: &a [*a]\nrecords: []\n", "a.[0]"), ("records:\n- &r {id: x, model: *r}\n",
                                                                   "records.[0].model"),
                        ("records: &l [*l]\n", "records.[0]")):
        path = tmp_path / "cycle.yaml"
        path.write_text(text)
        _refused(path, str(path), where, "alias")


FSDP_BF16, FSDP_FP8 = "torchtitan_llama3-8b_8gpu_fsdp8", "torchtitan_llama3-8b_8gpu_fsdp8_compile_fp8"


@pytest.mark.parametrize("field", ["float8", "mxfp8", "compile", "async_tp", "fp8_param_gather"])
@pytest.mark.parametrize("value", ["true", 1])
def test_fsdp_schema_switches_are_true_or_false(tmp_path, field, value):
    """`float8: "true"` had read as false (bf16, exit 0): the yes/no fields take true or false."""
    path = _write(tmp_path, "fsdp_moe_runs.yaml", FSDP_BF16, lambda r: r["parallel"].update({field: value}))
    _refused(path, FSDP_BF16, f"parallel.{field}", "expected true, false")


def test_fsdp_schema_reads_fp8_weights_and_refuses_them_in_bf16(tmp_path):
    on_fp8 = _write(tmp_path, "fsdp_moe_runs.yaml", FSDP_FP8, lambda r: r["parallel"].update(fp8_param_gather=True))
    (case,), _ = load_reference(on_fp8)
    assert case.plan.fp8_param_gather and case.job.dtype != "bf16"
    on_bf16 = _write(tmp_path, "fsdp_moe_runs.yaml", FSDP_BF16, lambda r: r["parallel"].update(fp8_param_gather=True))
    _refused(on_bf16, FSDP_BF16, "parallel.fp8_param_gather", "FP8 precision")


def test_fp8_weights_without_a_sharded_optimizer_are_refused(tmp_path):
    """Megatron refuses --fp8-param-gather without the distributed optimizer (planner.megatron.rules)."""
    rid = "nemo2407_GPT3-5B_64gpu_gbs2048"
    path = _write(tmp_path, "measured_runs.yaml", rid,
                  lambda r: r["parallel"].update(fp8_param_gather=True, distributed_optimizer=False))
    _refused(path, rid, "parallel.fp8_param_gather", "sharded optimizer")


@pytest.mark.parametrize("value", ["torchtitn FSDP2", "abc", [1, 2]])
def test_an_fsdp_framework_the_loader_does_not_know_is_refused(tmp_path, value):
    """A misspelt framework had been kept as text: no torch-FSDP2 sharding, 1.77 s instead of 2.95."""
    path = _write(tmp_path, "fsdp_moe_runs.yaml", FSDP_BF16, lambda r: r["parallel"].update(framework=value))
    _refused(path, FSDP_BF16, "parallel.framework")


@pytest.mark.parametrize("value", ["MLA", "MLA (q_lora 1536)", "abc", [1, 2]])
def test_attention_text_without_mla_ranks_is_refused(tmp_path, value):
    """The field names MLA with its ranks; other text had silently left DeepSeek-V3 on standard attention."""
    rid = "bridge_25.11_DeepSeekV3_DGX-GB200_BF16_256gpu_gbs4096"
    path = _write(tmp_path, "bridge_runs.yaml", rid, lambda r: r["model"].update(attention=value))
    _refused(path, rid, "model.attention")


@pytest.mark.parametrize("value", ["abc", "nan"])
def test_vpp_text_must_say_interleaved(tmp_path, value):
    rid = "bridge_26.06_LLAMA3.1_405B_DGX-GB200_FP8_256gpu_gbs1536"
    path = _write(tmp_path, "bridge_runs.yaml", rid, lambda r: r["parallel"].update(vpp=value))
    _refused(path, rid, "parallel.vpp", "interleaved")


def test_a_record_missing_its_fsdp_degree_is_told_which_schema_it_was_read_as(tmp_path):
    path = _write(tmp_path, "fsdp_moe_runs.yaml", FSDP_BF16, lambda r: r["parallel"].pop("fsdp_or_zero3_degree"))
    _refused(path, FSDP_BF16, "precision", "fsdp_or_zero3_degree")


@pytest.mark.parametrize("base_file,rid,block,field,value", [
    ("measured_runs.yaml", "nemo2407_GPT3-5B_64gpu_gbs2048", "parallel", "grad_accum", "abc"),
    ("measured_runs.yaml", "nemo2407_GPT3-5B_64gpu_gbs2048", "parallel", "grad_accum", 0),
    ("measured_runs.yaml", "dgxc_v24.11.1_LLAMA3-8B_bf16_8gpu", "measured", "mfu", -5),
    ("measured_runs.yaml", "dgxc_v24.11.1_LLAMA3-8B_bf16_8gpu", "measured", "mfu", "abc"),
    ("fsdp_moe_runs.yaml", FSDP_BF16, "measured", "memory_gib", "lots"),
])
def test_printed_numbers_the_loader_does_not_use_are_still_numbers(tmp_path, base_file, rid, block, field, value):
    """A table's other numbers (MFU, accumulation steps, memory) are reported, not used; a typo in
    one is named rather than carried along."""
    path = _write(tmp_path, base_file, rid, lambda r: r.setdefault(block, {}).update({field: value}))
    _refused(path, rid, f"{block}.{field}")


def test_llm_foundry_mpt_rows_count_what_the_benchmark_trained(loaded, records):
    """llm-foundry's benchmark table prints each MPT run's NumParams (scripts/train/benchmarking/
    README.md, copied into the record's notes). Its pretrain YAMLs leave MPTConfig's defaults:
    learned_pos_emb true with alibi false, no_bias false, tied embeddings; so the runs trained a
    max_seq_len × d_model position embedding and every linear and LayerNorm bias, and the printed
    counts move with the sequence (MPT-7b at 2048: 6,649,024,512 without positions and biases, +
    2048·4096 positions, + 32·11·4096 biases a layer (qkv 3h, out h, fc1 4h, fc2 h, two norms 2h), +
    4096 the final norm's = 6,658,859,008). The released MPT checkpoints use ALiBi without biases;
    these rows are read as what the benchmark ran."""
    published = {r["id"]: int(re.search(r"NumParams (\d+)", r["notes"]).group(1))
                 for r in records["fsdp_moe_runs.yaml"] if r["id"].startswith("llmfoundry_mpt")}
    mpt = {c.id: c.model for c in loaded[0] if c.id in published}
    assert len(mpt) == len(published) == 216
    mpt7 = next(m for i, m in mpt.items() if i.startswith("llmfoundry_mpt-7b") and m.seq_length == 2048)
    assert (mpt7.position_embedding, mpt7.biases, mpt7.tied_embeddings) == ("learned", True, True)
    assert mpt7.num_params == 6_658_859_008
    assert {i: m.num_params for i, m in mpt.items()} == {i: published[i] for i in mpt}
