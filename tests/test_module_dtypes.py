"""Per-module precision (JobSpec.module_dtypes, a Transformer Engine quantization recipe): the
named modules' GEMMs and scaling passes run in their own dtype, everything else in the job's."""
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hardware.load import load_system
from planner.analytical import estimate
from planner.bridge_recipes import HELDOUT_KNOBS_FILE, recipe_knobs
from planner.cli import app
from planner.model import ModelSpec, load_model
from planner.plan import MODULE_GROUPS, JobSpec, Plan
from planner.reference_moe import bridge_recipe_job_updates

runner = CliRunner()
LLAMA = load_model("llama3-8b")
SUPER = load_model("nemotron-3-super")
SUPER_RECIPE = {"attention": "bf16", "latent_proj": "bf16", "mtp": "bf16", "mamba_out_proj": "mxfp8"}


def _step_s(model, job, plan=Plan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=64), system=("b200", 8)):
    return estimate(model, load_system(*system), plan, job).step_time_s


def test_a_module_in_the_jobs_own_dtype_changes_nothing():
    base = _step_s(SUPER, JobSpec(dtype="nvfp4"), Plan(dp=64, ep=64, global_batch=512), ("gb300-nvl72", 64))
    same = JobSpec(dtype="nvfp4", module_dtypes={g: "nvfp4" for g in MODULE_GROUPS})
    assert _step_s(SUPER, same, Plan(dp=64, ep=64, global_batch=512), ("gb300-nvl72", 64)) == pytest.approx(base, rel=1e-12)


@pytest.mark.parametrize("group", MODULE_GROUPS)
def test_each_module_group_of_nemotron_3_super_costs_more_in_a_wider_dtype(group):
    plan, system = Plan(dp=64, ep=64, global_batch=512), ("gb300-nvl72", 64)
    base = _step_s(SUPER, JobSpec(dtype="nvfp4"), plan, system)
    wider = _step_s(SUPER, JobSpec(dtype="nvfp4", module_dtypes={group: SUPER_RECIPE[group]}), plan, system)
    everything = _step_s(SUPER, JobSpec(dtype="bf16"), plan, system)
    assert base < wider < everything, group


def test_a_transformer_spelt_as_blocks_costs_its_attention_override_the_same():
    """The transformer path and the hybrid block path agree on an attention override."""
    blocks = ModelSpec.model_validate({**LLAMA.model_dump(), "name": "llama-as-blocks", "layers": 64,
                                       "hybrid_pattern": "*-" * 32})
    job = JobSpec(dtype="nvfp4", module_dtypes={"attention": "bf16"})
    assert _step_s(blocks, job) == pytest.approx(_step_s(LLAMA, job), rel=1e-9)
    assert _step_s(LLAMA, job) > _step_s(LLAMA, JobSpec(dtype="nvfp4"))


def test_a_module_the_model_lacks_is_not_charged():
    """Llama has no MTP, no latent projections, no Mamba mixer."""
    base = _step_s(LLAMA, JobSpec(dtype="mxfp8"))
    absent = JobSpec(dtype="mxfp8", module_dtypes={"mtp": "bf16", "latent_proj": "bf16", "mamba_out_proj": "bf16"})
    assert _step_s(LLAMA, absent) == pytest.approx(base, rel=1e-12)


def test_the_nemotron_3_super_nvfp4_recipe_knob_is_read_as_module_dtypes():
    knobs = recipe_knobs("bridge_26.08_Nemotron_3_Super_DGX-GB300_NVFP4_64gpu_gbs512", path=HELDOUT_KNOBS_FILE)
    update, notes = bridge_recipe_job_updates(knobs, "nvfp4")
    assert update["module_dtypes"] == SUPER_RECIPE and update["bf16_layers"] == (0, 14)
    assert any("te_quant.cfg" in n for n in notes)
    assert "module_dtypes" not in bridge_recipe_job_updates(knobs, "bf16")[0]


@pytest.mark.parametrize("args,message", [
    (["--dtype", "nvfp4", "--module-dtype", "attn=bf16"], "module-dtype: expected MODULE=DTYPE"),
    (["--dtype", "nvfp4", "--module-dtype", "attention=fp16"], "module-dtype: expected MODULE=DTYPE"),
    (["--dtype", "nvfp4", "--module-dtype", "attention=bf16", "--module-dtype", "attention=mxfp8"], "given twice"),
    (["--module-dtype", "attention=bf16"], "module_dtypes (--module-dtype) needs a current- or block-scaled"),
])
def test_malformed_module_dtype_is_a_one_line_error(args, message):
    r = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "b200", "-g", "8", "--tp", "1", "--pp", "1",
                            "-b", "64", *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_megatron_writes_the_te_precision_file_the_recipe_needs(tmp_path):
    """The launch passes --te-precision-config-file and the script writes the file beside it, in
    Megatron-Core's RecipeConfig layout; one line of flags cannot carry it (one-line refusal)."""
    import json

    import yaml

    from planner.megatron.script import parse_script
    path = tmp_path / "plan.yaml"
    model = tmp_path / "llama3-8b-mtp.yaml"  # Llama-3 8B with one MTP module, so that mtp= has a module
    model.write_text((Path(__file__).resolve().parents[1] / "planner" / "presets" / "llama3-8b.yaml").read_text()
                     .replace("name: llama3-8b", "name: llama3-8b-mtp") + "mtp_layers: 1\n")
    r = runner.invoke(app, ["plan", "-m", str(model), "-s", "b200", "-g", "8", "-b", "64", "--dtype", "nvfp4",
                            "--module-dtype", "attention=bf16", "--module-dtype", "mtp=mxfp8", "--top", "1",
                            "--save", str(path)])
    assert r.exit_code == 0, r.output
    base = ["megatron", "--plan", str(path), "-m", str(model), "-s", "b200", "-g", "8"]
    r = runner.invoke(app, base + ["--format", "json"])
    assert r.exit_code == 0, r.output
    launch = json.loads(r.output)
    argv = launch["argv"]
    assert argv[argv.index("--te-precision-config-file") + 1] == "te_precision.yaml"
    recipe = yaml.safe_load(launch["files"]["te_precision.yaml"])
    # megatron/core/extensions/transformer_engine.py: TEQuantizationParams with a training_recipe
    # of TEQuantizationRecipe fields (fp8 recipes tensorwise/blockwise/mxfp8, fp4 nvfp4; {} = bf16)
    assert recipe["configs"] == {
        "bf16": {"transformer_engine_config_type": "TEQuantizationParams", "training_recipe": {}},
        "mxfp8": {"transformer_engine_config_type": "TEQuantizationParams",
                  "training_recipe": {"fp8_quantization_recipe": "mxfp8", "fp8_format": "e4m3"}}}
    # quant_config.py: the first matching glob wins, so the MTP module's own attention is MTP's
    assert [(m["pattern"], m["config"]) for m in recipe["matchers"].values()] == [
        ("mtp.*", "mxfp8"), ("*self_attention.linear_*", "bf16")]
    assert all(m["type"] == "glob" and m["enabled"] for m in recipe["matchers"].values())
    r = runner.invoke(app, base)
    assert r.exit_code == 0, r.output
    # written beside its destination and renamed (atomic on one file system: no node reads half a file)
    assert 'mktemp ./.te_precision.yaml.' in r.output and 'mv -n "$planner_file" te_precision.yaml' in r.output
    assert "pattern: mtp.*" in r.output
    assert "--te-precision-config-file" in parse_script(r.output)[1]
    r = runner.invoke(app, base + ["--format", "args"])
    assert r.exit_code == 2 and "one line of flags cannot carry" in r.output and "Traceback" not in r.output


def test_the_plan_header_names_the_mixed_recipe():
    from planner.report import precision_text
    assert precision_text(JobSpec(dtype="bf16")) == "bf16"
    job = JobSpec(dtype="nvfp4", bf16_layers=(0, 14), module_dtypes={"attention": "bf16", "mamba_out_proj": "mxfp8"})
    assert precision_text(job) == "nvfp4 (last 14 layers bf16; attention bf16; mamba_out_proj mxfp8)"
    assert precision_text(JobSpec(dtype="mxfp8", bf16_layers=(1, 1))) == "mxfp8 (first 1 and last 1 layers bf16)"


def test_a_module_groups_saved_gemm_input_takes_its_own_format():
    """attention=bf16 under NVFP4: each layer keeps its QKV GEMM's normed input in 16 bits (2 B)
    instead of NVFP4's 0.5 + 1/16 B per element: s·b·h·(2 − 0.5625) more per layer (pp 1, one
    microbatch in flight, no recompute)."""
    plan = Plan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8)
    system = load_system("b200", 8)
    acts = [estimate(LLAMA, system, plan, JobSpec(dtype="nvfp4", module_dtypes=m)).memory_breakdown_bytes[
        "activations_bytes"] for m in ({}, {"attention": "bf16"})]
    sbh = 1 * LLAMA.seq_length * LLAMA.hidden
    assert acts[1] - acts[0] == pytest.approx(LLAMA.layers * sbh * (2.0 - (0.5 + 1 / 16)), rel=1e-9)


def test_json_output_carries_the_precision():
    import json
    args = ["-m", "llama3-8b", "-s", "b200", "-g", "8", "-b", "64", "--dtype", "nvfp4", "--bf16-layers", "0,4",
            "--module-dtype", "attention=bf16", "--json"]
    want = {"dtype": "nvfp4", "bf16_layers": [0, 4], "module_dtypes": {"attention": "bf16"}}
    for command in (["plan", "--top", "1"], ["estimate", "--tp", "1", "--pp", "1"]):
        r = runner.invoke(app, command + args)
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["precision"] == want, command


def test_launch_script_never_overwrites_a_users_file(tmp_path):
    """The script writes te_precision.yaml where it runs: kept when identical (a rerun, another node
    on a shared file system), a stop with the user's file untouched when it differs."""
    import subprocess
    r = runner.invoke(app, ["megatron", "-m", "llama3-8b", "-s", "b200", "-g", "8", "-b", "64", "--tp", "1",
                            "--pp", "1", "--dtype", "nvfp4", "--module-dtype", "attention=bf16"])
    assert r.exit_code == 0, r.output
    # the script up to the launch itself (torchrun needs GPUs and a rendezvous)
    head = r.output[:r.output.index("torchrun ")]
    env = {"PATH": "/usr/bin:/bin", "NODE_RANK": "0", "MASTER_ADDR": "localhost", "DATA_PATH": "/data/x"}
    (tmp_path / "pretrain_gpt.py").touch()  # run from a Megatron-LM checkout
    run = lambda: subprocess.run(["bash", "-c", head], cwd=tmp_path, capture_output=True, text=True, env=env)  # noqa: E731
    assert run().returncode == 0
    written = (tmp_path / "te_precision.yaml").read_text()
    assert "bf16" in written
    assert (tmp_path / "te_precision.yaml").stat().st_mode & 0o777 == 0o644  # every rank's user may read it
    assert not list(tmp_path.glob(".te_precision.yaml.*"))  # no temporary copy left behind
    assert run().returncode == 0 and (tmp_path / "te_precision.yaml").read_text() == written  # rerun: kept
    (tmp_path / "te_precision.yaml").write_text("mine\n")
    again = run()
    assert again.returncode == 1 and "exists with other contents" in again.stderr
    assert (tmp_path / "te_precision.yaml").read_text() == "mine\n"
