"""An eighth pass over malformed input (an audit of about 790 commands): values read silently into
wrong results (a network tier's `domain_gpus: true` as a 1-GPU domain, group-limited routing that
cannot reach top_k experts, two tiers of one size, YAML 1.1's base-60 and octal integers), a
Megatron launch argparse could not read (a hybrid pattern starting with "-"), impossible plans
reported as "does not fit", a sweep that failed half-way, and a hybrid stack whose per-stage
problem filled the machine's memory."""
from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from constraints.stages import BLOCK_PROBLEM_MAX_CELLS, stage_problem
from hardware import load_system
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec, Plan
from tests.conftest import one_line_error, reference_copy

runner = CliRunner()
ESTIMATE = ["-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1", "--pp", "1"]
MOE = {"name": "m", "layers": 4, "hidden": 1024, "heads": 16, "seq_length": 2048, "vocab": 32000,
       "moe": {"num_experts": 64, "top_k": 8, "expert_ffn": 1024}}
HYBRID = {"name": "hy", "layers": 8, "hidden": 1024, "heads": 16, "seq_length": 2048, "vocab": 32000,
          "position_embedding": "none", "hybrid_pattern": "M-M*M-M-",
          "mamba": {"num_heads": 32, "head_dim": 64, "state_dim": 128, "groups": 8}}
TIERS = [{"name": "nvl", "domain_gpus": 8, "bandwidth_gb_per_s": 450, "latency_us": 3},
         {"name": "ib", "domain_gpus": 1048576, "bandwidth_gb_per_s": 50, "latency_us": 8}]


def run(args: list[str]):
    return runner.invoke(app, args)


def _yaml(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def _system(tmp_path, tiers) -> str:
    return _yaml(tmp_path, "s.yaml", {"name": "s", "num_gpus": 64, "gpus_per_node": 8,
                                      "accelerator": "h100-sxm5-80gb", "network": tiers})


# ---- values that were read into wrong results ---------------------------------------------------

def test_a_boolean_inside_a_network_tier_is_refused(tmp_path):
    """`domain_gpus: true` was read as a 1-GPU NVLink domain: tp 8 then crossed the NICs (22.4 s
    instead of 5.2 s, exit 0)."""
    tiers = [{**TIERS[0], "domain_gpus": True}, TIERS[1]]
    one_line_error(run(["estimate", "-m", "llama3-8b", "-s", _system(tmp_path, tiers), "--tp", "8", "--pp", "1",
                        "-b", "64"]), "network.0", "domain_gpus", "expected a number")


def test_peaks_written_as_the_presets_write_them_still_read(tmp_path):
    """Inside a mapping a YAML 1.1 float string ("989.0e12", as the packaged accelerators write their
    peaks) is the number it spells; a boolean there is refused."""
    acc = json.loads(load_system("h100-sxm").accelerator.model_dump_json())
    acc["name"] = "my-h100"

    def system_with_bf16_peak(text: str) -> str:
        acc["peak_flops"]["bf16"] = "@@"
        path = tmp_path / "acc.yaml"
        path.write_text(yaml.safe_dump(acc).replace("'@@'", text))
        return _yaml(tmp_path, "s2.yaml", {"name": "s2", "num_gpus": 8, "gpus_per_node": 8,
                                            "accelerator": str(path), "network": TIERS})
    fits = ["-g", "8", "-b", "64", "--tp", "8", "--pp", "1", "--json"]
    ok = run(["estimate", "-m", "llama3-8b", "-s", system_with_bf16_peak("'989.0e12'"), *fits])
    assert ok.exit_code == 0, ok.output
    same = run(["estimate", "-m", "llama3-8b", "-s", system_with_bf16_peak("989.0e+12"), *fits])
    assert json.loads(ok.stdout)["step_time_s"] == json.loads(same.stdout)["step_time_s"]
    one_line_error(run(["estimate", "-m", "llama3-8b", "-s", system_with_bf16_peak("true"), *ESTIMATE[2:]]),
                   "peak_flops.bf16", "expected a number")


def test_booleans_in_a_plan_files_lists_are_refused(tmp_path):
    saved = tmp_path / "p.yaml"
    assert run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64", "--pp", "2", "--top", "1",
                "--save", str(saved)]).exit_code == 0
    data = yaml.safe_load(saved.read_text())
    layers = data["plan"]["stage_layers"]
    bad = {**data, "plan": {**data["plan"], "stage_layers": [True, *layers[1:]]}}
    one_line_error(run(["estimate", "--plan", _yaml(tmp_path, "a.yaml", bad)]), "stage_layers.0", "expected a number")
    bad = {**data, "job": {**data["job"], "bf16_layers": [True, False]}}
    one_line_error(run(["estimate", "--plan", _yaml(tmp_path, "b.yaml", bad)]), "bf16_layers.0", "expected a number")


def test_group_limited_routing_must_reach_top_k_experts(tmp_path):
    """8 groups of 8 experts, 1 group per token: 8 experts reachable, not top_k 32."""
    model = {**MOE, "moe": {**MOE["moe"], "top_k": 32, "router_groups": 8, "router_group_topk": 1}}
    one_line_error(run(["estimate", "-m", _yaml(tmp_path, "m.yaml", model), *ESTIMATE]),
                   "top_k (32)", "router_group_topk (1)", "= 8")
    ok = {**MOE, "moe": {**MOE["moe"], "top_k": 8, "router_groups": 8, "router_group_topk": 1}}
    assert run(["estimate", "-m", _yaml(tmp_path, "ok.yaml", ok), *ESTIMATE]).exit_code == 0


def test_two_network_tiers_of_one_domain_size_are_refused(tmp_path):
    """A second 8-GPU tier changed the step (8.78 s) and a second outer one was ignored."""
    tiers = [TIERS[0], {**TIERS[0], "name": "nvl-slow", "bandwidth_gb_per_s": 1}, TIERS[1]]
    one_line_error(run(["estimate", "-m", "llama3-8b", "-s", _system(tmp_path, tiers), *ESTIMATE[2:]]),
                   "network", "8, 8, 1048576")


def test_yaml_base_60_and_octal_integers_are_refused(tmp_path):
    """YAML 1.1 read `vocab: 1:30` as 90 and `layers: 010` as 8."""
    text = yaml.safe_dump(MOE)
    one_line_error(run(["estimate", "-m", _yaml(tmp_path, "a.yaml", text.replace("vocab: 32000", "vocab: 1:30")),
                        *ESTIMATE]), "1:30", "base-60")
    one_line_error(run(["estimate", "-m", _yaml(tmp_path, "b.yaml", text.replace("layers: 4", "layers: 04")),
                        *ESTIMATE]), "04", "octal")


def test_fields_that_describe_nothing_are_refused(tmp_path):
    no_mixer = {**HYBRID, "hybrid_pattern": "--------"}
    no_mixer.pop("mamba")
    one_line_error(run(["estimate", "-m", _yaml(tmp_path, "h.yaml", no_mixer), *ESTIMATE]),
                   "hybrid_pattern", "sequence mixer")
    wide = {**MOE, "moe": {**MOE["moe"], "latent_size": 4096}}
    one_line_error(run(["estimate", "-m", _yaml(tmp_path, "l.yaml", wide), *ESTIMATE]),
                   "latent_size (4096)", "hidden (1024)")


def test_an_unknown_hidden_act_in_a_config_json_is_refused(tmp_path):
    config = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 4,
              "intermediate_size": 4096, "vocab_size": 32000, "hidden_act": "banana"}
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    one_line_error(run(["estimate", "-m", str(folder / "config.json"), *ESTIMATE]), "hidden_act", "banana", "silu")


def test_a_typo_of_a_required_key_is_named_with_the_key_it_resembles(tmp_path):
    model = {k: v for k, v in MOE.items() if k != "seq_length"} | {"seq_len": 2048}
    one_line_error(run(["estimate", "-m", _yaml(tmp_path, "t.yaml", model), *ESTIMATE]),
                   "seq_len: unknown field (did you mean seq_length?)")


# ---- the same mistake, the same answer ------------------------------------------------------------

def test_an_impossible_plan_from_flags_is_an_input_error_as_from_a_file():
    """ep 3 of 8 experts printed the cost tables and exited 1 ("does not fit"); the same plan in a
    file was an input error."""
    one_line_error(run(["estimate", "-m", "mixtral-8x7b", "-s", "h100-sxm", "-g", "64", "--tp", "1", "--pp", "1",
                        "--ep", "3", "-b", "256"]), "experts_ep")


def test_offloading_with_no_offload_tier_is_an_input_error():
    one_line_error(run(["estimate", "-m", "llama3-8b", *ESTIMATE, "--offload-optimizer", "0.5"]),
                   "offload", "h100-sxm has no offload tier")


def test_a_plan_files_dtype_error_lists_the_dtypes_the_gpu_runs(tmp_path):
    saved = tmp_path / "p.yaml"
    assert run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1",
                "--save", str(saved)]).exit_code == 0
    data = yaml.safe_load(saved.read_text())
    data["job"]["dtype"] = "mxfp8"
    path = _yaml(tmp_path, "mx.yaml", data)
    for command in ("estimate", "megatron"):
        line = one_line_error(run([command, "--plan", path]), "mxfp8", "allowed on it: bf16, fp16, fp8, fp8-cs")
        assert "fp32" not in line and "tf32" not in line


def test_pinned_options_megatron_cannot_combine_are_an_input_error():
    """bf16 Adam moments need the distributed optimizer: with --zero-stage 0 it said "no plan fits"."""
    one_line_error(run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64", "--adam-moments", "bf16",
                        "--zero-stage", "0"]), "pins", "zero_stage 0 is pinned")


def test_a_sweep_refuses_an_hbm_value_the_reserve_fills_before_any_work(tmp_path):
    out = tmp_path / "o"
    one_line_error(run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "64", "-o", str(out),
                        "--vary", "hbm_gib=80,40,2", "--no-explain"]), "hbm_gib=2", "reserve")
    assert not out.exists()


def test_a_sweep_grid_of_a_million_points_is_refused(tmp_path):
    one_line_error(run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "64", "-o", str(tmp_path / "o"),
                        "--vary", "hbm_gib=10:1000:1", "--vary", "offload_gib=1:1000:1"]),
                   "points", "at most 10,000")


# ---- what Megatron could not read, and a search that filled the memory ------------------------------

def test_a_hybrid_pattern_starting_with_an_mlp_block_is_joined_to_its_flag(tmp_path):
    """argparse read "-M-M*M-M" as an option ("expected one argument")."""
    model = {**HYBRID, "hybrid_pattern": "-M-M*M-M"}
    result = run(["megatron", "-m", _yaml(tmp_path, "h.yaml", model), "-s", "h100-sxm", "-g", "16", "--tp", "1",
                  "--pp", "1", "-b", "64", "--format", "args"])
    assert result.exit_code == 0, result.output
    assert "--hybrid-layer-pattern=-M-M*M-M" in result.output


def test_a_very_deep_hybrid_stack_is_priced_at_its_mean_block_per_stage():
    """10,000 blocks over hundreds of virtual stages: the per-block stage problem's tables filled
    24 GB; above BLOCK_PROBLEM_MAX_CELLS (blocks x virtual stages) the split is priced at the mean
    block (the exact model still re-scores it), below it per block as before."""
    base = load_model("nemotron-h-56b")
    pattern = base.hybrid_pattern * 20  # 2,360 blocks
    deep = base.model_copy(update={"layers": len(pattern), "hybrid_pattern": pattern})
    system, job = load_system("h100-sxm", 1024), JobSpec(dtype="bf16")
    plans = {vpp: Plan(tp=8, pp=2, dp=64, vpp=vpp, micro_batch=1, global_batch=128, sequence_parallel=True)
             for vpp in (1, 50)}
    assert deep.layers * 2 * 1 <= BLOCK_PROBLEM_MAX_CELLS < deep.layers * 2 * 50
    assert stage_problem(deep, system, job, plans[1]).pattern == pattern  # per block
    assert stage_problem(deep, system, job, plans[50]).pattern == ""  # the mean block


# ---- a reference file's misspelled keys ---------------------------------------------------------------

def _reference(tmp_path, edit) -> str:
    from planner.reference import REFERENCE_DIR
    data = reference_copy(REFERENCE_DIR / "measured_runs.yaml")
    record = data["records"][0]
    edit(record)
    return _yaml(tmp_path, "ref.yaml", {**data, "records": [record]})


def test_a_reference_records_misspelled_key_is_refused_with_the_key_it_resembles(tmp_path):
    """`fnn:` left ffn at 4 x hidden (6.69 s -> 7.21 s predicted, exit 0); `measure:` said only that
    there was no step time."""
    def typo(block, old, new):
        def edit(record):
            record[block][new] = record[block].pop(old)
        return edit
    one_line_error(run(["validate", "--reference", _reference(tmp_path, typo("model", "ffn", "fnn"))]),
                   "model.fnn", "did you mean ffn?")
    one_line_error(run(["validate", "--reference", _reference(tmp_path, typo("system", "gpus", "gpu_count"))]),
                   "system.gpu_count", "unknown field")

    def measure(record):
        record["measure"] = record.pop("measured")
    one_line_error(run(["validate", "--reference", _reference(tmp_path, measure)]), "measure", "did you mean measured?")


def test_a_reference_id_must_be_one_line(tmp_path):
    def newline(record):
        record["id"] = "a\nb"
    one_line_error(run(["validate", "--reference", _reference(tmp_path, newline)]), "id", "one line")


def test_an_output_path_ending_in_a_slash_names_a_folder_not_a_file(tmp_path):
    """`--save newdir/` wrote a plain file named newdir (pathlib drops the slash)."""
    for args, flag in ((["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1", "--save"],
                        "save"),
                       (["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "-o"], "output")):
        target = tmp_path / f"new-{flag}"
        one_line_error(run([*args, f"{target}/"]), flag, "names a folder")
        assert not target.exists()


def test_a_step_time_and_a_throughput_that_disagree_are_refused(tmp_path):
    """tokens/s per GPU of 7000 beside a 100 s step: the 100 s was used (a 93 % "error")."""
    def both(record):
        record["measured"]["tokens_per_sec_per_gpu"] = 7000
        record["measured"]["iteration_time_s"] = 100
    one_line_error(run(["validate", "--reference", _reference(tmp_path, both)]),
                   "iteration_time_s (100 s)", "tokens_per_sec_per_gpu (7000", "disagree")


def test_a_routing_skew_at_ep_1_is_said_to_slow_no_rank():
    """At ep 1 the skew changes nothing (time.moe_load_imbalance); the note had said the busiest rank
    gets 1.5x the mean tokens."""
    args = ["estimate", "-m", "mixtral-8x7b", "-s", "h100-sxm", "-g", "64", "--tp", "1", "--pp", "1", "--ep", "1",
            "-b", "256"]
    skewed, balanced = run([*args, "--moe-imbalance", "1.5"]), run([*args, "--json"])
    assert "routing skew (--moe-imbalance 1.5) slows no rank" in " ".join(skewed.output.split())
    assert "busiest expert rank" not in skewed.output
    step = json.loads(balanced.stdout)["step_time_s"]
    assert json.loads(run([*args, "--moe-imbalance", "1.5", "--json"]).stdout)["step_time_s"] == step


# ---- from the review of this pass -----------------------------------------------------------------

def test_every_activation_name_of_transformers_reads(tmp_path):
    """Apertus's config.json says hidden_act xielu: a plain (non-gated) MLP, as before the check."""
    config = {"model_type": "apertus", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
              "intermediate_size": 21504, "vocab_size": 131072, "num_key_value_heads": 8, "hidden_act": "xielu"}
    folder = tmp_path / "apertus"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    result = run(["estimate", "-m", str(folder), *ESTIMATE, "--json"])
    assert result.exit_code in (0, 1), result.output
    assert json.loads(result.stdout)["model"] == "apertus"


def test_a_sweep_may_widen_the_nvlink_domain_over_the_outer_tier(tmp_path):
    """nvlink_domain=1048576 (the sweep's own ceiling) equals the outer tier's domain: the NVLink
    tier takes its place instead of breaking the strictly-nested rule."""
    from planner.sweep import apply_params
    system = load_system("h100-sxm", 16)
    _, wide, _ = apply_params(load_model("llama3-8b"), system, JobSpec(global_batch=64),
                              {"nvlink_domain": 1048576}, None)
    assert [t.domain_gpus for t in wide.network] == [1048576]
    _, mid, _ = apply_params(load_model("llama3-8b"), system, JobSpec(global_batch=64), {"nvlink_domain": 16}, None)
    assert [t.domain_gpus for t in mid.network] == [16, 1048576]


def test_the_megatron_validator_joins_a_dash_value_in_every_argument_form(tmp_path):
    from planner import megatron as mg
    model = {**HYBRID, "hybrid_pattern": "-M-M*M-M"}
    result = run(["megatron", "-m", _yaml(tmp_path, "h.yaml", model), "-s", "h100-sxm", "-g", "16", "--tp", "1",
                  "--pp", "1", "-b", "64", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert mg.validate_megatron_args(data["args"], 16, data["env"]) == []


def test_quoted_integers_inside_a_plan_list_and_base_60_floats_are_refused(tmp_path):
    from hardware.errors import SpecError, refuse_loose_types
    try:
        refuse_loose_types({"stage_layers": ["4", "28"]}, Plan, "plan")
        raise AssertionError("quoted integers were accepted")
    except SpecError as err:
        assert "stage_layers.0" in str(err)
    acc = json.loads(load_system("h100-sxm").accelerator.model_dump_json())
    acc["name"] = "my-h100"
    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump(acc).replace("hbm_efficiency: 0.6", "hbm_efficiency: 0:0.6"))
    system = _yaml(tmp_path, "s3.yaml", {"name": "s3", "num_gpus": 8, "gpus_per_node": 8, "accelerator": str(path),
                                         "network": TIERS})
    one_line_error(run(["estimate", "-m", "llama3-8b", "-s", system, *ESTIMATE[2:]]), "base-60")


# ---- a ninth audit (about 730 probes) --------------------------------------------------------------

def _config_folder(tmp_path, name: str, config: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


LING = {"model_type": "bailing_moe", "hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 8,
        "num_key_value_heads": 4, "intermediate_size": 5120, "vocab_size": 32000, "num_experts": 64,
        "num_experts_per_tok": 8, "moe_intermediate_size": 512}


def test_ling_configs_keep_their_shared_experts(tmp_path):
    """Bailing-MoE (Ling) writes num_shared_experts: it was dropped without a word (active compute
    ~6 % low for Ling's shape)."""
    from planner.model import load_model as load
    counts = {n: load(_config_folder(tmp_path, f"ling{n}", {**LING, "num_shared_experts": n})).moe.shared_experts
              for n in (1, 2)}
    assert counts == {1: 1, 2: 2}
    both = {**LING, "num_shared_experts": 2, "n_shared_experts": 1}
    one_line_error(run(["estimate", "-m", _config_folder(tmp_path, "both", both), *ESTIMATE]),
                   "shared-expert count is given twice")


def test_any_mamba_key_marks_a_stack_the_reader_refuses(tmp_path):
    """A Falcon-H1 config without mamba_d_state / mamba_d_ssm loaded as a pure-attention model."""
    falcon = {"model_type": "falcon_h1", "hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 8,
              "num_key_value_heads": 4, "intermediate_size": 5120, "vocab_size": 32000, "mamba_n_heads": 32,
              "mamba_d_head": 64, "mamba_d_conv": 4, "mamba_expand": 2}
    one_line_error(run(["estimate", "-m", _config_folder(tmp_path, "falcon", falcon), *ESTIMATE]),
                   "mamba_", "Mamba")


def test_a_measurement_above_the_gpus_peak_is_refused(tmp_path):
    """1370 TFLOP/s per A100 (a digit too many) was read as a 0.35 s step: a +985 % "error", exit 0."""
    from planner.reference import REFERENCE_DIR
    data = reference_copy(REFERENCE_DIR / "measured_runs.yaml")
    record = next(r for r in data["records"] if r["id"] == "narayanan2021_t1_1.7B")
    record["measured"]["tflops_per_gpu"] = record["measured"]["tflops_per_gpu"] * 10
    path = _yaml(tmp_path, "ref.yaml", {**data, "records": [record]})
    one_line_error(run(["validate", "--reference", path]), "narayanan2021_t1_1.7B", "above the A100", "peak")
