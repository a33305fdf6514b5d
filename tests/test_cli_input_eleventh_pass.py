"""An eleventh pass over malformed input (about 1,050 probes): a deep pipelined hybrid stack whose
"why nothing fits" step took 18 GB, a plan file that dropped its routing skew, reference records
whose partial shape was replaced by a preset's or whose two throughputs disagreed, plan files
holding what the same flags refuse, options given twice keeping the last value in silence, a
launch whose checkpoint interval could not work, and messages naming the wrong flag."""
from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from constraints.cost_table import chunk_rows
from constraints.space import build_space
from hardware import load_system
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec
from tests.conftest import one_line_error

runner = CliRunner()
SMALL = ["-m", "llama3.2-1b", "-s", "h100-sxm", "-g", "8", "-b", "64"]


def run(args: list[str]):
    return runner.invoke(app, args)


def test_a_pipelined_hybrid_stack_is_costed_in_chunks_of_bounded_size(monkeypatch):
    """A hybrid stack's rows carry every pipeline rank (pp columns, not 3): 10,000 blocks on 1,024
    GPUs had 24,348 rows x 1,024 ranks per array, 18 GB in all. The rows handed to the memory
    model at a time shrink with the widest pipeline, so a chunk's arrays stay as large as CHUNK
    rows of 3 ranks. Checked on the calls the no-fit diagnosis (memory_floor) makes, with CHUNK
    cut to 3,000 so that a small model needs several."""
    import constraints.cost_table as cost_table
    import planner.search as search
    monkeypatch.setattr(cost_table, "CHUNK", 3000)
    rows_per_call = []
    breakdown = search.memory_breakdown

    def spy(model, system, job, P):
        rows_per_call.append(len(P))
        return breakdown(model, system, job, P)
    monkeypatch.setattr(search, "memory_breakdown", spy)
    space = build_space(load_model("nemotron-h-8b"), load_system("h100-sxm", 64), JobSpec(global_batch=256))
    widest = max(space.domains["pp"])
    assert widest == 32
    search.memory_floor(space)
    assert max(rows_per_call) == chunk_rows(space) == 3000 * 3 // widest  # 281 rows of 32 ranks
    dense = build_space(load_model("llama3-8b"), load_system("h100-sxm", 1024), JobSpec(global_batch=1024))
    assert chunk_rows(dense) == 3000  # 3 representative ranks whatever the pipeline


def test_a_saved_plan_keeps_its_routing_skew(tmp_path):
    """`plan --moe-imbalance 2 --save` wrote no skew, and `estimate --plan` re-costed it balanced
    (2.71 s against the 4.41 s the file itself printed)."""
    saved = tmp_path / "imb.yaml"
    # 16 GPUs, batch 64 (was 64, 256): skew 2 still prices 4.63 s against 2.65 s balanced
    assert run(["plan", "-m", "mixtral-8x7b", "-s", "h100-sxm", "-g", "16", "-b", "64", "--moe-imbalance", "2",
                "--save", str(saved)]).exit_code == 0
    data = yaml.safe_load(saved.read_text())
    assert data["job"]["moe_load_imbalance"] == 2.0
    result = run(["estimate", "--plan", str(saved), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["step_time_s"] == data["step_time_s"]
    one_line_error(run(["estimate", "--plan", str(saved), "--moe-imbalance", "1.5"]), "moe-imbalance",
                   "differs from the plan file's (2.0)")


RECORD = {"id": "myruns_a", "model": {"name": "Llama-3 8B", "seq": 8192, "vocab": 128256, "activation": "swiglu"},
          "system": {"gpu": "H100-SXM5-80GB", "gpus": 16},
          "parallel": {"tp": 2, "pp": 1, "microbatch": 1, "global_batch": 128, "sequence_parallel": True,
                       "recompute": "none", "distributed_optimizer": True},
          "precision": "bf16", "measured": {"tokens_per_sec_per_gpu": 7000}}


def _reference(tmp_path, record) -> str:
    path = tmp_path / "ref.yaml"
    path.write_text(yaml.safe_dump({"records": [record]}))
    return str(path)


def test_a_record_printing_part_of_its_shape_does_not_take_a_presets_whole_shape(tmp_path):
    """'Llama-3 8B' with hidden 8192, heads 64, ffn 28672 and no layers was costed as the llama3-8b
    preset (hidden 4096), its assumptions saying the record printed no dimensions."""
    wide = {**RECORD, "model": {**RECORD["model"], "hidden": 8192, "heads": 64, "query_groups": 8, "ffn": 28672}}
    one_line_error(run(["validate", "--reference", _reference(tmp_path, wide)]), "layers",
                   "beside the hidden, heads, ffn, query_groups it prints")
    named = run(["validate", "--reference", _reference(tmp_path, RECORD), "--json"])  # no shape: the preset's
    assert named.exit_code == 0, named.output
    assert "llama3-8b preset" in json.dumps(json.loads(named.output)["rows"][0]["assumptions"])


def test_two_throughputs_that_disagree_are_refused(tmp_path):
    """7,000 tokens/s per GPU on 16 GPUs is 112,000 tokens/s, not the 500,000 also given: the
    second was ignored in silence."""
    both = {**RECORD, "measured": {"tokens_per_sec_per_gpu": 7000, "tokens_per_sec": 500000}}
    one_line_error(run(["validate", "--reference", _reference(tmp_path, both)]), "tokens_per_sec_per_gpu",
                   "tokens_per_sec (500000)", "disagree")
    agree = {**RECORD, "measured": {"tokens_per_sec_per_gpu": 7000, "tokens_per_sec": 112000}}
    assert run(["validate", "--reference", _reference(tmp_path, agree)]).exit_code == 0


def _plan_file(tmp_path, plan: dict, model="llama3-8b", system="h100-sxm", gpus=8) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"plan": plan, "model": model, "system": system, "gpus": gpus}))
    return str(path)


def test_a_plan_file_holds_no_more_than_the_flags_allow(tmp_path):
    """FSDP2 at ZeRO-1, a pipeline rank with no layer, and DeepEP on a dense model: each refused as
    flags, each costed from a plan file (and launched by `megatron --plan`)."""
    cases = [({"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 64, "dp_impl": "torch-fsdp2",
               "zero_stage": 1}, ("dp_impl torch-fsdp2 runs zero_stage 3 or 2",)),
             ({"tp": 1, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 64, "stage_layers": [0, 32]},
              ("every pipeline rank needs a layer",)),
             ({"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 64, "moe_dispatcher": "deepep"},
              ("moe_dispatcher", "applies to MoE models only"))]
    for plan, words in cases:
        path = _plan_file(tmp_path, plan)
        for command in ("estimate", "megatron"):
            one_line_error(run([command, "--plan", path]), *words)


def test_an_option_given_twice_is_refused(tmp_path, monkeypatch):
    """click kept the last of two: -m llama3-70b -m llama3-8b costed the 8B, --save a --save b
    wrote b only. Options that take several values stay repeatable."""
    one_line_error(run(["estimate", "-m", "llama3-70b", *SMALL, "--tp", "1"]), "model: given 2 times")
    one_line_error(run(["estimate", *SMALL, "--tp", "1", "--tp", "2"]), "tp: given 2 times")
    one_line_error(run(["estimate", *SMALL, "--tp", "1", "--flash-attention", "--no-flash-attention"]),
                   "flash-attention: given 2 times")
    assert run(["estimate", *SMALL, "--tp", "1", "--json", "--json"]).exit_code == 0  # the same flag says one thing
    monkeypatch.chdir(tmp_path)  # a value that starts with a dash is a value, not an option
    result = run(["plan", *SMALL, "--save", "-best.yaml", "-k", "1"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "-best.yaml").exists()
    assert run(["estimate", *SMALL, "--tp", "1", "--dtype", "fp8-cs", "--module-dtype", "attention=bf16",
                "--module-dtype", "attention=bf16"]).exit_code == 0


def test_a_launch_whose_checkpoints_cannot_keep_up_says_so():
    """A 1 kB/s store gave --save-interval 3,131,574 with nothing said; `planner checkpoint` warns."""
    result = runner.invoke(app, ["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "2",
                                 "--write-gb-per-s", "1e-6"])
    assert result.exit_code == 0, result.output
    said = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "note: checkpoint interval: checkpointing cannot keep up" in said
    assert "# NOTE: checkpoint interval: checkpointing cannot keep up" in result.stdout


def test_a_module_dtype_the_gpu_lacks_names_the_module_flag():
    """--module-dtype attention=mxfp8 on an H100 was answered 'dtype: ... allowed: bf16, fp16,
    fp32, fp8, tf32', values neither flag takes."""
    one_line_error(run(["estimate", *SMALL, "--tp", "1", "--dtype", "fp8-cs", "--module-dtype", "attention=mxfp8"]),
                   "module-dtype: attention=mxfp8", "allowed on it: bf16, fp16, fp8, fp8-cs, fp8-block")


def test_a_model_or_system_file_given_as_the_plan_is_named_so():
    """A model YAML as --plan printed a note about default model and system, then 'missing tp'."""
    one_line_error(run(["estimate", "--plan", "planner/presets/llama3-8b.yaml"]), "this is a model file", "-m")
    one_line_error(run(["megatron", "--plan", "hardware/presets/h100-sxm.yaml"]), "this is a system file", "-s")


def test_a_sweeps_sequence_length_is_named_as_the_flag(tmp_path):
    one_line_error(run(["sweep", "-m", "llama3.2-1b", "-s", "h100-sxm", "-b", "64", "--vary", "gpus=8",
                        "--seq-length", "0", "-o", str(tmp_path / "j")]), "seq-length: must be")


def test_the_python_api_refuses_pins_of_the_wrong_kind_and_a_reserve_beyond_the_hbm():
    """JobSpec(pins={"tp": True}) searched tp 1, {"sequence_parallel": "yes"} was taken; an
    estimate with a 500 GiB reserve on an 80 GB GPU returned a negative HBM capacity. numpy's
    integers (coerced to whole floats) stay pins."""
    import numpy as np
    import pytest

    from hardware.errors import SpecError
    from planner import estimate
    from planner.plan import Plan
    for pins, words in (({"tp": True}, "tp: expected an integer"), ({"tp": 2.5}, "tp: expected an integer"),
                        ({"sequence_parallel": "yes"}, "sequence_parallel: expected true or false"),
                        ({"recompute": 3}, "recompute: expected a string")):
        with pytest.raises(ValueError, match=words):
            JobSpec(global_batch=64, pins=pins)
    assert JobSpec(global_batch=64, pins={"tp": np.int64(2), "offload_weights": np.float64(0.5)}).pins["tp"] == 2
    with pytest.raises(SpecError, match="hbm_reserve_gib: the reserve"):
        estimate(load_model("llama3-8b"), load_system("h100-sxm", 8), Plan(tp=1, dp=8, micro_batch=1, global_batch=64),
                 JobSpec(hbm_reserve_gib=500))


def test_an_accelerator_file_given_as_the_system_is_named_so():
    """-s with an accelerator file had said 'peak_flops: unknown field (and 7 more problems)'
    (input audit): it is named, with where an accelerator goes."""
    one_line_error(run(["plan", "-s", "hardware/presets/accelerators/h100-sxm5-80gb.yaml", "-g", "8"]),
                   "this is an accelerator file", "`accelerator:` in a system file")
