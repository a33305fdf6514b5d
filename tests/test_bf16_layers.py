"""Layers kept in bf16 under a low-precision recipe (JobSpec.bf16_layers; Megatron
--first-last-layers-bf16, megatron/core/fp8_utils.py is_first_last_bf16_layer): costed as the
count-weighted mean of the two precisions' layers, emitted as Megatron's flags, refused where
Megatron refuses them."""
import pytest
from typer.testing import CliRunner

from hardware.load import load_system
from planner.analytical import estimate
from planner.cli import app
from planner.megatron.rules import MSG_BF16_LAYERS_DELAYED, validate_megatron_args
from planner.model import ModelSpec, load_model
from planner.plan import JobSpec, Plan

runner = CliRunner()
LLAMA = load_model("llama3-8b")  # 32 layers
PLAN = Plan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=64)


def _step_s(model, dtype, kept, plan=PLAN, gpus=8):
    return estimate(model, load_system("b200", gpus), plan, JobSpec(dtype=dtype, bf16_layers=kept)).step_time_s


def test_every_layer_kept_is_the_bf16_job_and_none_is_the_nvfp4_job():
    assert _step_s(LLAMA, "nvfp4", (0, 32)) == pytest.approx(_step_s(LLAMA, "bf16", (0, 0)), rel=1e-12)
    assert _step_s(LLAMA, "nvfp4", (10, 22)) == pytest.approx(_step_s(LLAMA, "bf16", (0, 0)), rel=1e-12)


def test_kept_layers_cost_in_proportion_to_their_count():
    """At pp 1 every rank holds every layer: k bf16 layers add k/32 of the per-layer difference,
    the same at the start or the end."""
    low, high = _step_s(LLAMA, "mxfp8", (0, 0)), _step_s(LLAMA, "bf16", (0, 0))
    for kept in ((0, 4), (4, 0), (2, 6), (0, 16)):
        share = sum(kept) / 32
        assert _step_s(LLAMA, "mxfp8", kept) == pytest.approx(low + share * (high - low), rel=1e-9), kept
    assert low < _step_s(LLAMA, "mxfp8", (0, 4)) < high


def test_kept_activations_are_16_bit():
    """A kept layer saves its GEMM inputs in 16 bits, not as the quantised copies: its HBM lies
    between the two precisions' in proportion."""
    system = load_system("b200", 8)
    hbm = {kept: estimate(LLAMA, system, PLAN, JobSpec(dtype="nvfp4", bf16_layers=kept)).memory_breakdown_bytes
           for kept in ((0, 0), (0, 8), (0, 32))}
    acts = {k: v["activations_bytes"] for k, v in hbm.items()}
    assert acts[(0, 0)] < acts[(0, 8)] < acts[(0, 32)]
    assert acts[(0, 8)] == pytest.approx(acts[(0, 0)] + 0.25 * (acts[(0, 32)] - acts[(0, 0)]), rel=1e-9)


def test_a_hybrid_stack_keeps_its_own_last_blocks():
    """Spelt as alternating attention and MLP blocks, a transformer keeps 2k blocks where it kept
    k layers, and costs the same (the pattern's own first / last blocks, their mean block)."""
    blocks = ModelSpec.model_validate({**LLAMA.model_dump(), "name": "llama-as-blocks", "layers": 64,
                                       "hybrid_pattern": "*-" * 32})
    for kept in ((0, 4), (2, 6)):
        as_blocks = (2 * kept[0], 2 * kept[1])
        assert _step_s(blocks, "nvfp4", as_blocks) == pytest.approx(_step_s(LLAMA, "nvfp4", kept), rel=1e-9)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_recipe_that_cannot_keep_bf16_layers_is_refused(dtype):
    with pytest.raises(ValueError, match="bf16_layers needs a current- or block-scaled"):
        JobSpec(dtype=dtype, bf16_layers=(0, 2))


@pytest.mark.parametrize("value,message", [
    ("14", "expected FIRST,LAST"), ("a,b", "expected FIRST,LAST"), ("-1,2", "expected FIRST,LAST"),
    ("20,20", "exceed llama3-8b's 32"),
])
def test_malformed_bf16_layers_flag_is_a_one_line_error(value, message):
    r = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "b200", "-g", "8", "--tp", "1", "--pp", "1",
                            "-b", "64", "--dtype", "nvfp4", "--bf16-layers", value])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_bf16_dtype_with_bf16_layers_is_a_one_line_error():
    r = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "b200", "-g", "8", "--tp", "1", "--pp", "1",
                            "-b", "64", "--bf16-layers", "0,4"])
    assert r.exit_code == 2 and "bf16-layers needs" in r.output and "Traceback" not in r.output, r.output


def test_megatron_emits_the_flags_and_its_rules_match_megatrons():
    r = runner.invoke(app, ["megatron", "-m", "llama3-8b", "-s", "b200", "-g", "8", "-b", "64", "--tp", "1",
                            "--pp", "1", "--dtype", "nvfp4", "--bf16-layers", "1,4", "--format", "args"])
    assert r.exit_code == 0, r.output
    args = r.output.split()
    assert "--first-last-layers-bf16" in args
    assert args[args.index("--num-layers-at-start-in-bf16") + 1] == "1"
    assert args[args.index("--num-layers-at-end-in-bf16") + 1] == "4"
    base = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "8192",
            "--max-position-embeddings", "8192", "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16",
            "--fp8-format", "e4m3", "--pipeline-model-parallel-size", "4", "--first-last-layers-bf16"]
    # transformer_config.py __post_init__ (0.19.2): refused under delayed scaling; each count at
    # most the layers per stage (here 32 / 4); the message is Megatron's own
    errors = validate_megatron_args(base + ["--fp8-recipe", "delayed"], world_size=8)
    assert MSG_BF16_LAYERS_DELAYED in errors
    errors = validate_megatron_args(base + ["--fp8-recipe", "mxfp8", "--num-layers-at-end-in-bf16", "10"], world_size=8)
    assert ("num_layers_at_end_in_bf16 (10) must be between 0 and number of layers per pipeline stage (8)."
            in errors)
    assert not [e for e in validate_megatron_args(base + ["--fp8-recipe", "mxfp8", "--num-layers-at-end-in-bf16", "8"],
                                                  world_size=8) if "bf16" in e.lower()]


def test_a_plan_file_keeping_more_layers_than_the_model_has_is_a_one_line_error(tmp_path):
    path = tmp_path / "plan.yaml"
    r = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "b200", "-g", "8", "-b", "64", "--dtype", "nvfp4",
                            "--bf16-layers", "0,4", "--top", "1", "--save", str(path)])
    assert r.exit_code == 0, r.output
    import yaml
    data = yaml.safe_load(path.read_text())
    data["job"]["bf16_layers"] = [0, 40]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    for command in ("estimate", "megatron"):
        r = runner.invoke(app, [command, "--plan", str(bad), "-m", "llama3-8b", "-s", "b200", "-g", "8"])
        assert r.exit_code == 2 and "bf16-layers: the job keeps 0 + 40 layers" in r.output, (command, r.output)
