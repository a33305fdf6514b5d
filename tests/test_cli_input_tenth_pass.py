"""Tenth malformed-input audit (2026-11-28): reference records whose fields were read as something
else or not at all, and one whose dtype error named no record. Each test failed on the code before."""
from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

runner = CliRunner()

# a user's own record (README's example): 7,000 tokens/s per GPU is a 9.36 s step for the batch
OWN = {"id": "myruns_llama3-8b_16gpu_tp2",
       "model": {"name": "Llama-3 8B", "layers": 32, "hidden": 4096, "heads": 32, "query_groups": 8, "ffn": 14336,
                 "seq": 8192, "vocab": 128256, "activation": "swiglu"},
       "system": {"gpu": "H100-SXM5-80GB", "gpus": 16},
       "parallel": {"tp": 2, "pp": 1, "microbatch": 1, "global_batch": 128, "sequence_parallel": True,
                    "recompute": "none", "distributed_optimizer": True},
       "precision": "bf16", "measured": {"tokens_per_sec_per_gpu": 7000}}


def validate(tmp_path, **changes):
    record = yaml.safe_load(yaml.safe_dump(OWN))
    for path, value in changes.items():
        *blocks, key = path.split("__")
        at = record
        for b in blocks:
            at = at.setdefault(b, {})
        at[key] = value
    path = tmp_path / "ref.yaml"
    path.write_text(yaml.safe_dump({"records": [record]}))
    return runner.invoke(app, ["validate", "--reference", str(path)])


def test_the_example_record_still_compares(tmp_path):
    res = validate(tmp_path)
    assert res.exit_code == 0, res.output
    assert "myruns_llama3-8b_16gpu_tp2" in res.output


def test_a_derived_step_that_disagrees_with_the_measured_throughput_is_refused(tmp_path):
    """A derived 5 s step beside 7,000 tokens/s per GPU (9.36 s) replaced the measurement: the error
    read -28.5 % instead of +34 %."""
    one_line_error(validate(tmp_path, derived={"iteration_time_s": 5.0, "how": "x"}),
                   "derived.iteration_time_s (5 s)", "tokens_per_sec_per_gpu (7000", "disagree")
    assert validate(tmp_path, derived={"iteration_time_s": 9.4, "how": "x"}).exit_code == 0


def test_a_step_time_field_the_megatron_schema_ignored_is_read_and_checked(tmp_path):
    one_line_error(validate(tmp_path, measured={"iteration_time_s": 9.36, "step_time_s": 4.0}),
                   "iteration_time_s (9.36 s)", "step_time_s (4 s)", "disagree")
    one_line_error(validate(tmp_path, measured={"step_time_s": 4.0, "tokens_per_sec_per_gpu": 7000}),
                   "step_time_s (4 s)", "disagree")


def test_system_fields_that_contradict_the_gpu_preset_are_refused(tmp_path):
    """gpu_mem_gb 40 beside "A100" was costed on the 80 GB board (fits, 16.4 s); gpus_per_node 4 and
    nvlink_domain 4 beside tp 8 changed nothing."""
    a100 = {"gpu": "A100", "gpus": 16, "gpu_mem_gb": 40}
    slow = {"tokens_per_sec_per_gpu": 1500}
    one_line_error(validate(tmp_path, system=a100, measured=slow), "system.gpu_mem_gb: 40", "80 GiB", "A100 40GB")
    res = validate(tmp_path, system={**a100, "gpu": "A100 40GB"}, measured=slow)  # the 40 GB board: read
    assert res.exit_code == 0 and "A100-SXM4-40GB" in res.output, res.output
    one_line_error(validate(tmp_path, system__gpus_per_node=4), "system.gpus_per_node: 4", "has 8")
    one_line_error(validate(tmp_path, system__nvlink_domain=4), "system.nvlink_domain: 4", "8 GPUs per NVLink")
    one_line_error(validate(tmp_path, system__peak_tflops_per_gpu=312), "peak_tflops_per_gpu: 312", "989.4")
    assert validate(tmp_path, system__peak_tflops_per_gpu=989, system__peak_dtype="fp16/bf16 dense",
                    system__gpu_mem_gb=80, system__gpus_per_node=8).exit_code == 0


def test_a_moe_field_spelled_the_other_schemas_way_is_refused(tmp_path):
    moe = {"num_experts": 8, "topk": 2, "moe_ffn": 14336}
    one_line_error(validate(tmp_path, model__moe={**moe, "experts": 16}), "model.moe.experts", "num_experts")
    one_line_error(validate(tmp_path, model__moe={**moe, "expert_ffn": 1000}), "model.moe.expert_ffn", "moe_ffn")
    one_line_error(validate(tmp_path, model__moe={**moe, "dense_layers_first": 4}), "dense_layers_first",
                   "first_k_dense")


def test_a_layout_no_rule_allows_is_refused_not_compared(tmp_path):
    """ep 2 on a dense model and vpp 2 at pp 1 were compared ("tp2 pp1 dp8 ep2"); estimate refuses both."""
    one_line_error(validate(tmp_path, parallel__ep=2), "myruns_llama3-8b_16gpu_tp2", "experts_ep")
    one_line_error(validate(tmp_path, parallel__vpp=2), "myruns_llama3-8b_16gpu_tp2", "vpp_needs_pp")


def test_a_dtype_the_gpu_lacks_names_the_record(tmp_path):
    """NVFP4 on an H100 stopped the run with "dtype: H100-SXM5-80GB has no nvfp4 peak" and no record."""
    one_line_error(validate(tmp_path, precision="nvfp4"), "myruns_llama3-8b_16gpu_tp2", "nvfp4")


# ---- Hugging Face configs: what the cost approximates is said; encoders are refused -------------

def test_a_sliding_window_config_says_it_is_costed_as_full_attention():
    """Gemma-3 12B (window 1024) at sequence 32,768 overcounts its attention ~40 %; nothing said so."""
    res = runner.invoke(app, ["estimate", "-m", "tests/fixtures/hf/gemma-3-12b", "-s", "h100-sxm", "-g", "8",
                              "-b", "64", "--tp", "8", "--pp", "1", "--seq-length", "32768", "--json"])
    assert "sliding-window attention (window 1024 < sequence 32768) is costed as full causal attention" in res.stderr
    assert "GeGLU costed as SwiGLU" in res.stderr
    import json
    json.loads(res.stdout)  # the notes stay off the JSON
    quiet = runner.invoke(app, ["estimate", "-m", "tests/fixtures/hf/mistral-7b-v0.1", "-s", "h100-sxm", "-g", "8",
                                "-b", "64", "--tp", "8", "--pp", "1", "--seq-length", "4096"])
    assert "sliding" not in quiet.stderr  # a window no shorter than the sequence is full attention


def test_encoder_and_encoder_decoder_configs_are_refused(tmp_path):
    """BERT was read as a causal decoder and launched as pretrain_gpt.py with RoPE and RMSNorm."""
    import json
    bert = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072, "vocab_size": 30522, "hidden_act": "gelu", "max_position_embeddings": 512}
    for name, cfg, word in (("bert", bert, "an encoder"),
                            ("t5ish", {**bert, "model_type": "custom", "is_encoder_decoder": True}, "encoder-decoder")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        one_line_error(runner.invoke(app, ["estimate", "-m", str(folder), "-s", "h100-sxm", "-g", "8", "-b", "64"]),
                       "model_type", word, "decoder-only")


def test_a_plan_saved_with_idle_gpus_loads_back(tmp_path):
    """--allow-idle-gpus on 12 GPUs chose dp 8 and saved gpus: 12, which estimate/megatron --plan refused."""
    import json
    saved = tmp_path / "p.yaml"
    res = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "12", "-b", "48", "--allow-idle-gpus",
                              "--top", "1", "--save", str(saved), "--json"])
    assert res.exit_code == 0, res.output
    planned = json.loads(res.stdout)
    data = yaml.safe_load(saved.read_text())
    assert data["gpus"] == data["plan"]["tp"] * data["plan"]["pp"] * data["plan"]["dp"] * data["plan"]["cp"] < 12
    again = runner.invoke(app, ["estimate", "--plan", str(saved), "--json"])
    assert again.exit_code == 0, again.output
    best = planned["plans"][0] if "plans" in planned else planned["best"]
    assert json.loads(again.stdout)["step_time_s"] == best["step_time_s"]
    assert runner.invoke(app, ["megatron", "--plan", str(saved)]).exit_code == 0


def test_the_packaged_fsdp_file_validates_when_named_and_alias_bombs_do_not(tmp_path):
    """`--reference planner/data/reference/fsdp_moe_runs.yaml` was refused ("YAML aliases are not
    allowed"): its records share sources by &id/*id, which the default load reads. Aliases are now
    read in reference files, up to a bound on what they expand to."""
    res = runner.invoke(app, ["validate", "--summary", "--reference", "planner/data/reference/fsdp_moe_runs.yaml"])
    assert res.exit_code == 0, res.output
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefghi", "bcdefghij"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text("records:\n- id: x\n" + "\n".join("  " + line for line in lines) + "\n")
    one_line_error(runner.invoke(app, ["validate", "--reference", str(bomb)]), "aliases expand to over")


def test_the_python_api_refuses_what_the_cli_refuses():
    """Plan(tp=True) was tp 1, JobSpec(global_batch="64") 64; plan(top_k="3") and an unknown
    restrict knob raised TypeError / KeyError; load_model with a list of overrides AttributeError."""
    import pytest
    from pydantic import ValidationError

    from hardware.errors import SpecError
    from planner import JobSpec, Plan, load_model, load_system, plan
    for make, word in ((lambda: Plan(tp=True), "tp"), (lambda: Plan(sequence_parallel="yes"), "sequence_parallel"),
                       (lambda: JobSpec(global_batch=True), "global_batch"),
                       (lambda: JobSpec(global_batch="64"), "global_batch")):
        with pytest.raises(ValidationError, match=word):
            make()
    assert Plan(tp=2, global_batch=8).tp == 2  # numbers stay numbers
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    for kwargs, word in (({"top_k": "3"}, "top"), ({"top_k": 2.5}, "top"), ({"restrict": {"foo": bool}}, "restrict")):
        with pytest.raises(SpecError, match=word):
            plan(model, system, JobSpec(global_batch=64), **kwargs)
    with pytest.raises(SpecError, match="overrides must be a mapping"):
        load_model("llama3-8b", [("seq_length", 4096)])


def test_what_the_system_check_must_not_refuse_and_must(tmp_path):
    """A sparse peak is the record's truth (2x the dense one); an H100 NVL's 94 GB is not the SXM's
    80; a hybrid stack under context parallelism is a planner limit, compared as before."""
    assert validate(tmp_path, system__peak_tflops_per_gpu=1979, system__peak_dtype="bf16 sparse").exit_code == 0
    one_line_error(validate(tmp_path, system__gpu_mem_gb=94), "system.gpu_mem_gb: 94")
    import numpy as np

    from planner import JobSpec, load_model, load_system, plan
    res = plan(load_model("llama3-8b"), load_system("h100-sxm", 8), JobSpec(global_batch=64), top_k=np.int64(2))
    assert len(res.ranked) == 2


def test_a_hybrid_record_under_context_parallelism_is_compared(tmp_path):
    record = {"id": "probe_hybrid_cp", "model": {"name": "nemotron-h-8b", "seq": 8192},
              "system": {"gpu": "H100-SXM5-80GB", "gpus": 16},
              "parallel": {"tp": 2, "pp": 1, "cp": 2, "microbatch": 1, "global_batch": 64, "sequence_parallel": True},
              "precision": "bf16", "measured": {"tokens_per_sec_per_gpu": 5000}}
    path = tmp_path / "ref.yaml"
    path.write_text(yaml.safe_dump({"records": [record]}))
    res = runner.invoke(app, ["validate", "--reference", str(path)])
    assert res.exit_code == 0 and "probe_hybrid_cp" in res.output, res.output


@pytest.mark.parametrize("columns", ["-5", "0", "39"])
def test_a_narrow_terminal_width_is_read_as_40(monkeypatch, columns):
    from planner.cli.console import MIN_WIDTH, Console
    monkeypatch.setenv("COLUMNS", columns)
    assert Console().width == MIN_WIDTH


@pytest.mark.parametrize("columns", ["0"])
def test_a_terminal_width_of_nothing_still_prints_the_plan(columns):
    """COLUMNS=0 made rich print nothing: `plan` exited 0 with no plan, and 1 ("no plan fits")
    without its reason (2026-11-28, tenth session)."""
    out = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64"],
                        env={"COLUMNS": columns})
    assert out.exit_code == 0 and "TP 1" in out.stdout and "global batch 64" in " ".join(out.stdout.split())
    none = runner.invoke(app, ["plan", "-m", "gpt3-175b", "-s", "a100-80g", "-g", "8", "-b", "64"],
                         env={"COLUMNS": columns})
    assert none.exit_code == 1 and "No plan fits" in none.stdout


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fp8_weights_under_a_16_bit_dtype_are_refused(tmp_path, dtype):
    """--fp8-param-gather under bf16 was costed with 1-byte weights (3.5 GB less HBM), exit 0."""
    args = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64", "--tp", "2", "--dtype", dtype]
    one_line_error(runner.invoke(app, ["estimate", *args, "--fp8-param-gather"]), "fp8_param_gather", dtype,
                   "fp8, fp8-cs")
    saved = tmp_path / "p.yaml"
    assert runner.invoke(app, ["estimate", *args, "--save", str(saved)]).exit_code == 0
    doc = yaml.safe_load(saved.read_text())
    doc["plan"]["fp8_param_gather"] = True
    saved.write_text(yaml.safe_dump(doc))
    one_line_error(runner.invoke(app, ["estimate", "--plan", str(saved)]), "fp8_param_gather", dtype)
    assert runner.invoke(app, ["estimate", *args[:-1], "fp8", "--fp8-param-gather"]).exit_code == 0


def test_a_versus_file_is_checked_as_estimate_checks_it_and_named_in_its_errors(tmp_path):
    """--versus compared a file whose gpus: contradicts its layout (`estimate --plan` refuses it),
    and the plan's own errors against this model named no file."""
    job = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64"]
    saved = tmp_path / "p.yaml"
    assert runner.invoke(app, ["plan", *job, "--save", str(saved)]).exit_code == 0
    doc = yaml.safe_load(saved.read_text())
    doc["gpus"] = 32
    saved.write_text(yaml.safe_dump(doc))
    one_line_error(runner.invoke(app, ["estimate", "--plan", str(saved)]), "gpus: 32")
    one_line_error(runner.invoke(app, ["plan", *job, "--versus", str(saved)]), "versus:", str(saved), "gpus: 32")
    moe = tmp_path / "m.yaml"
    assert runner.invoke(app, ["plan", "-m", "mixtral-8x7b", *job[2:], "--save", str(moe)]).exit_code == 0
    moe_plan = yaml.safe_load(moe.read_text())["plan"]
    assert "layernorm" in moe_plan["recompute_modules"] and moe_plan["ep"] > 1
    # said as `estimate --plan` says it: the layout is a MoE model's (its expert parallelism first)
    one_line_error(runner.invoke(app, ["plan", *job, "--versus", str(moe)]), "versus:", str(moe),
                   "ep: applies to MoE models only; llama3-8b has no experts")


def test_a_system_files_relative_accelerator_is_read_beside_it(tmp_path, monkeypatch):
    """`accelerator: ./acc.yaml` was read from the current folder, so the same system file worked
    from its own folder only (plan files read their model:/system: paths beside themselves)."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    sub = tmp_path / "sub"
    sub.mkdir()
    system = yaml.safe_load((root / "examples" / "custom_system.yaml").read_text())
    system["accelerator"] = "./acc.yaml"
    (sub / "s.yaml").write_text(yaml.safe_dump(system))
    (sub / "acc.yaml").write_text((root / "hardware/presets/accelerators/h100-sxm5-80gb.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    args = ["estimate", "-m", "llama3-8b", "-g", "8", "-b", "16", "--tp", "2", "--json"]
    from_here = runner.invoke(app, [*args, "-s", "sub/s.yaml"])
    assert from_here.exit_code == 0, from_here.output
    monkeypatch.chdir(sub)
    from_there = runner.invoke(app, [*args, "-s", "s.yaml"])
    assert from_there.exit_code == 0, from_there.output
    here, there = (json.loads(r.stdout) for r in (from_here, from_there))
    assert here["step_time_s"] == there["step_time_s"] and here["hbm_bytes"] == there["hbm_bytes"]
    system["accelerator"] = "./nope.yaml"
    (sub / "s.yaml").write_text(yaml.safe_dump(system))
    one_line_error(runner.invoke(app, [*args[:-1], "-s", "s.yaml"]), "accelerator: file ./nope.yaml does not exist")


def test_a_plan_file_with_its_layout_beside_model_and_system_says_so(tmp_path):
    """A file with model:/system: beside tp/pp/dp (or a saved file whose `plan:` line was lost)
    printed a note that it "names no model and no system" and then "model: unknown field"."""
    job = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64"]
    saved = tmp_path / "p.yaml"
    assert runner.invoke(app, ["plan", *job, "--save", str(saved)]).exit_code == 0
    doc = yaml.safe_load(saved.read_text())
    flat = {k: v for k, v in doc.items() if k != "plan"} | doc["plan"]
    saved.write_text(yaml.safe_dump(flat))
    line = one_line_error(runner.invoke(app, ["estimate", "--plan", str(saved)]), "model, seq_length, system",
                          "under plan:")
    assert "names no model" not in line
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({"tp": 2, "pp": 1, "dp": 8, "global_batch": 64}))
    # a bare layout has no gpus: field to add: the fix it is told is the flag
    line = one_line_error(runner.invoke(app, ["estimate", "--plan", str(bare), "-m", "llama3-8b", "-s", "h100-sxm"]),
                          "pass --gpus 16")
    assert "add gpus" not in line
    assert runner.invoke(app, ["estimate", "--plan", str(bare), "-m", "llama3-8b", "-s", "h100-sxm",
                               "-g", "16"]).exit_code == 0


@pytest.mark.parametrize("name", ["\u200b", "\u200b\u2060", "a\u200fb", "a\u200eb", "x\u061cy"], ids=ascii)
def test_a_name_of_only_zero_width_text_or_with_a_bidi_mark_is_refused(tmp_path, name):
    """A zero-width space passed as a model's name (the header printed nothing); a right-to-left
    mark passed where the overrides were refused."""
    from pathlib import Path
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "planner/presets/llama3-8b.yaml").read_text())
    doc["name"] = name
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=False))
    one_line_error(runner.invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"]),
                   "name", "one line of visible text")
    doc["name"] = "llama\u200bjoined"  # a zero-width character between visible ones is text
    path.write_text(yaml.safe_dump(doc, allow_unicode=False))
    assert runner.invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"]).exit_code == 0


@pytest.mark.parametrize("value", [0, 2 ** 20 + 1, 10 ** 30])
def test_gpus_per_node_is_bounded_as_the_gpu_count_is(tmp_path, value):
    """gpus_per_node 1e30 was accepted, and `checkpoint` called 8 GPUs "part of one node"."""
    from pathlib import Path
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples/custom_system.yaml").read_text())
    doc["gpus_per_node"] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    one_line_error(runner.invoke(app, ["count", "-m", "llama3-8b", "-s", str(path), "-g", "8"]),
                   "gpus_per_node", "from 1 to 1,048,576")


@pytest.mark.parametrize("field,value,words", [
    ("position_embedding", float("inf"), ("position_embedding: must be 'learned', 'rope' or 'none', got inf",)),
    ("activation", 5, ("activation: must be 'gelu', 'swiglu' or 'squared_relu', got 5",)),
    ("seq_length", 1e300, ("seq_length: must be an integer in its range", "1e+300")),
])
def test_a_choice_or_a_huge_integer_is_named_as_what_it_is(tmp_path, field, value, words):
    """A choice given a number was told "must be a finite number"; an integral 1e300 got pydantic's
    "Unable to parse input string as an integer"."""
    from pathlib import Path
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "planner/presets/llama3-8b.yaml").read_text())
    doc[field] = value
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    one_line_error(runner.invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"]), *words)


def test_an_unknown_recompute_in_a_plan_file_is_named_before_its_modules(tmp_path):
    saved = tmp_path / "p.yaml"
    args = ["-m", "mixtral-8x7b", "-s", "h100-sxm", "-g", "16", "-b", "64"]
    assert runner.invoke(app, ["plan", *args, "--save", str(saved)]).exit_code == 0
    doc = yaml.safe_load(saved.read_text())
    doc["plan"].update(recompute="selective", recompute_modules=["moe_act"])
    doc["plan"]["recompute"] = "fulll"
    saved.write_text(yaml.safe_dump(doc))
    one_line_error(runner.invoke(app, ["estimate", "--plan", str(saved)]),
                   "recompute: must be 'none', 'selective' or 'full', got 'fulll'")


@pytest.mark.parametrize("value", [-1, 0, 0.5])
def test_a_yarn_factor_below_one_is_told_its_range(tmp_path, value):
    """-1 was told pydantic's "greater than 0", while the field takes 1 to 10,000."""
    from pathlib import Path
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "planner/presets/deepseek-v3.yaml").read_text())
    doc["mla"]["yarn_factor"] = value
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    one_line_error(runner.invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"]),
                   "yarn_factor", "from 1 to 10000")


def test_a_sweeps_console_table_prints_grid_values_as_its_csv_does(tmp_path):
    """The console printed hbm_gib 40.0 where the CSV wrote 40 (an audit, 2026-11-28)."""
    out = runner.invoke(app, ["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64",
                              "--vary", "hbm_gib=40,80", "-o", str(tmp_path / "sw")], env={"COLUMNS": "120"})
    assert out.exit_code == 0, out.output
    first = [line.split("│")[0].strip() for line in out.stdout.splitlines() if "│" in line][:1]
    csv_first = (tmp_path / "sw" / "sweep.csv").read_text().splitlines()[1].split(",")[0]
    assert first == [csv_first] == ["40"]
