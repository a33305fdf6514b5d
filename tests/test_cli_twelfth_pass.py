"""A first-time user's walk through the CLI (audit, twelfth pass): the same flags give the same plan
in `estimate` and `megatron`, plan-file overrides say what clashes, an uneven layout is shown."""
from __future__ import annotations

import json

import pytest

from typer.testing import CliRunner

from planner.cli.app import app

runner = CliRunner()
LLAMA70 = ["-m", "llama3-70b", "-s", "h100-sxm", "-g", "64", "-b", "512", "--tp", "8", "--pp", "4"]


def test_megatron_fills_unset_knobs_as_estimate_does():
    """`megatron --tp 8 --pp 4` left sequence parallelism off where `estimate` turns it on: 81.8 GiB
    against 46.8, refused by one and fitting in the other. Both now cost and launch the same plan."""
    est = runner.invoke(app, ["estimate", *LLAMA70, "--json"])
    assert est.exit_code == 0, est.output
    plan = json.loads(est.stdout)["plan"]
    assert plan["sequence_parallel"] is True and plan["zero_stage"] == 1
    launch = runner.invoke(app, ["megatron", *LLAMA70, "--format", "json"])
    assert launch.exit_code == 0, launch.output
    argv = json.loads(launch.stdout)["argv"]
    assert "--sequence-parallel" in argv and "--use-distributed-optimizer" in argv and "--overlap-grad-reduce" in argv
    # only tp given: pp 1 in both (estimate had filled the default example's pp 8)
    tp_only = ["-m", "llama3-8b", *LLAMA70[2:8], "--tp", "2"]
    est_pp = json.loads(runner.invoke(app, ["estimate", *tp_only, "--json"]).stdout)["plan"]["pp"]
    argv = json.loads(runner.invoke(app, ["megatron", *tp_only, "--format", "json"]).stdout)["argv"]
    assert est_pp == 1 and argv[argv.index("--pipeline-model-parallel-size") + 1] == "1"
    off = runner.invoke(app, ["megatron", *LLAMA70, "--no-sequence-parallel", "--format", "json"])
    assert off.exit_code == 2 and "GiB" in off.output  # what the user asks for still decides


def test_estimate_does_not_default_to_a_recompute_that_saves_nothing():
    """With fused attention no s x s scores are kept, so recomputing the attention core (the old
    default, selective) cost time and freed no memory: the default is no recompute, and the
    selective plan is slower at the same HBM."""
    default = json.loads(runner.invoke(app, ["estimate", *LLAMA70, "--json"]).stdout)
    selective = json.loads(runner.invoke(app, ["estimate", *LLAMA70, "--recompute", "selective", "--json"]).stdout)
    assert default["plan"]["recompute"] == "none"
    assert selective["hbm_bytes"] == default["hbm_bytes"]
    assert selective["step_time_s"] > default["step_time_s"]


def test_the_launch_trains_the_named_models_rope_base_norms_and_mla_latent_norms(tmp_path):
    """The launch left Megatron's RoPE base (10000) and norm epsilon (1e-5) in place for every
    model, and MLA's latent norms out (Megatron builds them only with --qk-layernorm). Presets and
    config.json now carry rope_base / norm_epsilon; a model without them gets a note."""
    def argv(*args):
        r = runner.invoke(app, ["megatron", *args, "--format", "json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    llama = argv(*LLAMA70)["argv"]
    assert llama[llama.index("--rotary-base") + 1] == "500000" and llama[llama.index("--norm-epsilon") + 1] == "1e-05"
    qwen = argv("-m", "qwen3-30b-a3b", "-s", "h100-sxm", "-g", "16", "-b", "64", "--tp", "2", "--ep", "8")["argv"]
    assert qwen[qwen.index("--rotary-base") + 1] == "1000000" and qwen[qwen.index("--norm-epsilon") + 1] == "1e-06"
    ds = argv("-m", "deepseek-v3", "-s", "gb200-nvl72", "-g", "256", "-b", "1024", "--tp", "1", "--pp", "8",
              "--ep", "32", "--recompute", "full")["argv"]
    assert "--qk-layernorm" in ds and "--multi-latent-attention" in ds
    cfg = json.loads(open("tests/fixtures/hf/llama-3.2-1b/config.json").read())
    cfg.update(rope_theta=123456.7)
    cfg.pop("rms_norm_eps")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    custom = runner.invoke(app, ["megatron", "-m", str(tmp_path), "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1"])
    assert custom.exit_code == 0, custom.output
    assert "--rotary-base 123457" in custom.stdout and "launched as --rotary-base 123457" in custom.stderr
    assert "gives no norm-epsilon: Megatron's default (--norm-epsilon 1e-05) is launched" in " ".join(custom.stdout.split())


def test_a_plan_file_beside_other_flags_says_what_clashes_with_numbers(tmp_path):
    """-g beside a plan file blamed --gpus as if unset ("set --gpus"), and a model swapped under a
    plan file broke a layout rule without the numbers."""
    saved = tmp_path / "plan.yaml"
    assert runner.invoke(app, ["plan", *LLAMA70[:8], "--save", str(saved)]).exit_code == 0
    gpus = runner.invoke(app, ["estimate", "--plan", str(saved), "-g", "128"])
    assert gpus.exit_code == 2 and "not --gpus 128" in gpus.output and "give -g 64" in gpus.output, gpus.output
    launch = runner.invoke(app, ["megatron", "--plan", str(saved), "-g", "128"])
    assert launch.exit_code == 2 and "not --gpus 128" in launch.output, launch.output
    small = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "64", "-b", "512", "--tp", "1",
                                "--pp", "4", "--vpp", "10"])
    assert small.exit_code == 2 and "llama3-8b has 32 layers; pp·vpp = 4·10 = 40" in small.output, small.output


def test_an_uneven_default_split_is_written_out():
    """80 layers over pp 4 · vpp 3 run Megatron's uneven default split: the header and the JSON
    show it (the JSON's plan keeps stage_layers null: the plan as given), as `megatron` launches it."""
    args = [*LLAMA70, "--vpp", "3"]
    text = " ".join(runner.invoke(app, ["estimate", *args]).output.split())
    assert "layers per virtual stage 6,7x8,6x3 (the default split)" in text
    layout = json.loads(runner.invoke(app, ["estimate", *args, "--json"]).stdout)["pipeline_layout"]
    assert layout == [6, *[7] * 8, 6, 6, 6] and sum(layout) == 80
    even = json.loads(runner.invoke(app, ["estimate", *LLAMA70, "--vpp", "5", "--json"]).stdout)
    assert even["pipeline_layout"] == [4] * 20
    assert "default split" not in runner.invoke(app, ["estimate", *LLAMA70, "--vpp", "5"]).output


def test_config_json_router_keys_are_read_or_refused_by_name(tmp_path):
    """scoring_func / topk_method / routed_scaling_factor make the launched router the checkpoint's
    (DeepSeek-V3: sigmoid, bias, 2.5, as its preset); a value that is no router is one line."""
    from planner.model import load_model
    from tests.conftest import one_line_error
    base = json.loads(open("tests/fixtures/hf/deepseek-v3/config.json").read())
    ds = load_model("tests/fixtures/hf/deepseek-v3").moe
    assert (ds.router_score, ds.router_expert_bias, ds.router_topk_scale) == ("sigmoid", True, 2.5)
    qwen = load_model("tests/fixtures/hf/qwen3-30b-a3b").moe
    assert (qwen.router_score, qwen.router_expert_bias, qwen.router_topk_scale) == ("softmax", False, None)
    for key, value, words in (("scoring_func", "tanh", "one of softmax, sigmoid"),
                              ("routed_scaling_factor", "2.5", "a number from 0.001 to 1000")):
        folder = tmp_path / key
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**base, key: value}))
        one_line_error(runner.invoke(app, ["count", "-m", str(folder), "-s", "h100-sxm", "-g", "8", "-b", "64"]),
                       key, words)


def test_llama3_rope_scaling_is_launched_as_the_checkpoint_has_it(tmp_path):
    """Llama 3.1/3.2 checkpoints carry rope_scaling llama3 (factor 8 / 32); Megatron runs it with
    --use-rope-scaling. A config whose frequency bands differ from Megatron's fixed ones (1, 4,
    8192) is told so."""
    def argv(*args):
        r = runner.invoke(app, ["megatron", *args, "--format", "json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["argv"]
    l31 = argv("-m", "llama3.1-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "2")
    assert "--use-rope-scaling" in l31 and l31[l31.index("--rope-scaling-factor") + 1] == "8"
    l32 = argv("-m", "llama3.2-1b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1")
    assert l32[l32.index("--rope-scaling-factor") + 1] == "32"
    assert "--use-rope-scaling" not in argv("-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "2")
    cfg = json.loads(open("tests/fixtures/hf/llama-3.2-1b/config.json").read())
    cfg["rope_scaling"] = {**cfg["rope_scaling"], "high_freq_factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = runner.invoke(app, ["count", "-m", str(tmp_path), "-s", "h100-sxm", "-g", "8", "-b", "64"])
    assert r.exit_code == 0 and "high_freq_factor 2: Megatron's --use-rope-scaling fixes" in r.stderr, r.output


def test_a_sweep_table_reads_in_80_columns(tmp_path):
    """At 80 columns the grid values read 'lla…' and each infeasible point's reason ran 40 lines
    of 4-character fragments: the values are whole, the reasons follow the table one per line.
    (Llama 3.1 70B fits no plan on 8 GPUs at 40 or 80 GiB; one worker: the pool is not the point.)"""
    r = runner.invoke(app, ["sweep", "-s", "h100-sxm", "-g", "8", "-b", "64", "--vary", "model=llama3.2-1b,llama3.1-70b",
                            "--vary", "hbm_gib=40,80", "-o", str(tmp_path / "sw"), "-j", "1"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert sum("llama3.1-70b" in line for line in lines) >= 4  # 2 table rows + 2 reasons
    reasons = lines[lines.index("No plan fits at:") + 1:]
    assert reasons[0].startswith("  model=llama3.1-70b, hbm_gib=40: memory:")
    assert len(lines) < 40
    # a CSV row's plan_json is the whole plan: it reproduces the row's step time
    import csv

    from hardware import load_system
    from planner import JobSpec, Plan, estimate
    from planner.model import load_model
    from planner.sweep import apply_params
    row = next(r for r in csv.DictReader(open(tmp_path / "sw" / "sweep.csv")) if r["feasible"] == "True")
    model, system, job = apply_params(load_model(row["model"]), load_system("h100-sxm", 8), JobSpec(),
                                      {"hbm_gib": float(row["hbm_gib"])})[:3]
    again = estimate(model, system, Plan.model_validate_json(row["plan_json"]))
    assert float(row["step_time_s"]) == again.step_time_s  # every digit (the CSV had kept 6)


def test_sliding_windows_and_sinks_are_launched_as_the_checkpoint_has_them(tmp_path):
    """GPT-OSS's 128-token window on every other layer and its learnable sinks, Mistral's 4096 window,
    Gemma's alternation (2) and pattern (6) are read and launched (--window-size W,0,
    --window-attn-skip-freq N, --softmax-type learnable; GPT-OSS's RMSNorm beside its biases);
    costed as full causal attention, which the launch notes say. A layer pattern Megatron's integer
    frequency cannot say is neither launched nor silently dropped."""
    from planner.model import load_model
    for fixture, window, every, sinks in (("gpt-oss-120b", 128, 2, True), ("mistral-7b-v0.1", 4096, None, False),
                                          ("gemma-2-9b", 4096, 2, False), ("gemma-3-12b", 1024, 6, False)):
        m = load_model(f"tests/fixtures/hf/{fixture}")
        assert (m.attention_window, m.window_full_every, m.attention_sinks) == (window, every, sinks), fixture
    r = runner.invoke(app, ["megatron", "-m", "gpt-oss-120b", "-s", "b200", "-g", "64", "-b", "512", "--tp", "1",
                            "--ep", "8", "--format", "json"])
    assert r.exit_code == 0, r.output
    launch = json.loads(r.stdout)
    argv = launch["argv"]
    assert argv[argv.index("--window-size") + 1] == "128,0" and argv[argv.index("--window-attn-skip-freq") + 1] == "2"
    assert argv[argv.index("--softmax-type") + 1] == "learnable"
    assert argv[argv.index("--normalization") + 1] == "RMSNorm" and "--disable-bias-linear" not in argv
    assert any("costed as full causal attention" in n for n in launch["notes"])
    cfg = json.loads(open("tests/fixtures/hf/gpt-oss-20b/config.json").read())
    cfg["layer_types"] = ["full_attention", *cfg["layer_types"][1:]]  # layer 1 full: no integer frequency
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    odd = load_model(str(tmp_path))
    assert odd.attention_window is None and odd.attention_sinks
    r = runner.invoke(app, ["count", "-m", str(tmp_path), "-s", "h100-sxm", "-g", "8", "-b", "64"])
    assert "the Megatron launch sets no window" in " ".join(r.stderr.split()), r.output


def test_a_custom_gpus_compute_capability_is_its_field_not_its_first_letter(tmp_path):
    """The compute capability came from the name's first letter: a GPU named VGPU-X was costed as a
    Volta without fused attention (6.8 -> 202 GiB), AMD-MI300X as an Ampere refused FP8. Now: the
    accelerator's compute_capability, else an NVIDIA product name read as a word, else 9.0
    assumed, which the launch says."""
    import yaml

    from hardware import load_system
    from planner.megatron.launch import arch_is_assumed, gpu_arch_major
    base = yaml.safe_load(open("hardware/presets/h100-sxm.yaml"))
    acc = yaml.safe_load(open("hardware/presets/accelerators/h100-sxm5-80gb.yaml"))
    acc.pop("compute_capability")
    steps = {}
    for name, cc in (("VGPU-X", None), ("AMD-MI300X", None), ("H100-SXM5-80GB", None), ("VGPU-X", 7.0)):
        path = tmp_path / f"{name}-{cc}.yaml"
        path.write_text(yaml.safe_dump({**base, "name": "custom", "num_gpus": 16,
                                        "accelerator": {**acc, "name": name,
                                                        **({"compute_capability": cc} if cc else {})}}))
        system = load_system(str(path))
        r = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", str(path), "-b", "128", "--tp", "2", "--pp", "1",
                                "--json"])
        steps[(name, cc)] = (gpu_arch_major(system), arch_is_assumed(system), json.loads(r.stdout)["hbm_bytes"])
    assert steps[("VGPU-X", None)][:2] == (9, True) and steps[("AMD-MI300X", None)][:2] == (9, True)
    assert steps[("H100-SXM5-80GB", None)][:2] == (9, False)
    assert steps[("VGPU-X", None)][2] == steps[("H100-SXM5-80GB", None)][2]  # fused attention either way
    assert steps[("VGPU-X", 7.0)][:2] == (7, False) and steps[("VGPU-X", 7.0)][2] > 2 * steps[("VGPU-X", None)][2]
    launch = runner.invoke(app, ["megatron", "-m", "llama3-8b", "-s", str(tmp_path / "AMD-MI300X-None.yaml"), "-b",
                                 "128", "--tp", "2", "--pp", "1", "--dtype", "fp8", "--format", "json"])
    assert launch.exit_code == 0, launch.output
    assert any("9.0 was assumed (set accelerator.compute_capability)" in n for n in json.loads(launch.stdout)["notes"])
    from tests.conftest import one_line_error
    odd = tmp_path / "odd.yaml"
    odd.write_text(yaml.safe_dump({**base, "name": "custom", "num_gpus": 16,
                                   "accelerator": {**acc, "compute_capability": 8.95}}))
    one_line_error(runner.invoke(app, ["count", "-m", "llama3-8b", "-s", str(odd), "-b", "64"]),
                   "accelerator.compute_capability: must be major.minor with one minor digit", "8.95")


def test_the_default_dispatcher_is_no_moe_setting_on_a_dense_model():
    """A script turning a saved dense plan into flags passes --moe-dispatcher alltoall (the default
    the file records): accepted; another dispatcher is still a MoE setting on a dense model."""
    from tests.conftest import one_line_error
    args = ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "2"]
    assert runner.invoke(app, [*args, "--moe-dispatcher", "alltoall"]).exit_code == 0
    one_line_error(runner.invoke(app, [*args, "--moe-dispatcher", "deepep"]), "applies to MoE models only")


def test_the_python_api_refuses_names_and_mismatched_batches_in_one_line():
    """estimate('llama3-70b', ...) raised AttributeError deep inside; estimate ignored a job batch
    other than the plan's (7.018 s for 64, 512 and 1024 alike); plan(top_k=5000) ran."""
    import pytest

    from hardware.errors import SpecError
    from planner import JobSpec, Plan, check, count, estimate, load_model, load_system, plan
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 64)
    mine = Plan(tp=2, dp=32, micro_batch=2, global_batch=512)
    for call, words in ((lambda: estimate("llama3-70b", system, mine), "model: expected a ModelSpec"),
                        (lambda: plan(model, "h100-sxm", JobSpec(global_batch=512)), "system: expected a SystemSpec"),
                        (lambda: check(model, system, {"global_batch": 512}), "job: expected a JobSpec"),
                        (lambda: count(model, system, JobSpec(global_batch=512)) and estimate(model, system, {}),
                         "plan: expected a Plan"),
                        (lambda: plan(model, system, JobSpec(global_batch=512), top_k=5000), "from 1 to 1,000"),
                        (lambda: estimate(model, system, mine, JobSpec(global_batch=1024)),
                         "the job's (1024) differs from the plan's (512)")):
        with pytest.raises(SpecError, match=words.replace("(", r"\(").replace(")", r"\)")):
            call()
    assert estimate(model, system, mine, JobSpec(global_batch=512)) == estimate(model, system, mine)


def test_checkpoint_says_when_failures_outrun_recovery():
    """1,024 GPUs at 50 h MTBF fail every 2.9 min and recover in 13.2: goodput printed 0.00 % with
    no word that the first-order formula no longer holds."""
    r = runner.invoke(app, ["checkpoint", "-m", "llama3-70b", "-s", "h100-sxm", "-g", "1024", "--gpu-mtbf-hours", "50",
                            "--json"])
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["notes"]
    assert any("recovery (13.2 min) is longer than the job MTBF (2.9 min)" in n for n in notes), notes
    calm = json.loads(runner.invoke(app, ["checkpoint", "-m", "llama3-70b", "-s", "h100-sxm", "-g", "1024",
                                          "--json"]).stdout)["notes"]
    assert not any("longer than the job MTBF" in n for n in calm)


def test_estimate_takes_the_recipe_settings_megatron_and_plan_files_do():
    """cross_entropy_fusion, grad_reduce_in_bf16 and fp8_param_gather: written by `plan --save`,
    taken by `megatron` as flags, but `estimate` had no flag for them."""
    args = ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "2", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    tuned = json.loads(runner.invoke(app, [*args, "--grad-reduce-in-bf16", "--cross-entropy-fusion"]).stdout)
    assert (tuned["plan"]["grad_reduce_in_bf16"], tuned["plan"]["cross_entropy_fusion"]) == (True, True)
    assert tuned["step_time_s"] < plain["step_time_s"]
    assert tuned["memory_breakdown_bytes"]["grads_bytes"] == plain["memory_breakdown_bytes"]["grads_bytes"] / 2


def test_a_users_reference_rows_are_not_reported_as_fitted(tmp_path):
    """`validate --reference mine.yaml` showed fitted 1 for the user's own rows, which no fit reads;
    a byte-for-byte copy of a packaged file is still the fitted data."""
    import shutil

    import yaml

    from planner.reference import DEFAULT_REFERENCES, load_reference
    packaged = min(DEFAULT_REFERENCES, key=lambda p: p.stat().st_size)
    copy = tmp_path / "copy.yaml"
    shutil.copy(packaged, copy)
    data = yaml.safe_load(packaged.read_text())
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(data))  # the same records, not the same bytes
    fitted = lambda path: sum(c.fit for c in load_reference(path)[0])  # noqa: E731
    assert fitted(packaged) == fitted(copy) > 0
    assert fitted(mine) == 0


def test_review_findings_on_routers_windows_and_rope_bands(tmp_path):
    """DeepSeek-V2 routes by a softmax over all experts, not renormalised (norm_topk_prob false):
    launched with --moe-router-pre-softmax beside its 16x scaling. A Gemma-3 config that leaves
    sliding_window_pattern to its class's default (6) is not windowed on every layer, and its
    windowed layers' own RoPE base is said. Llama 3.x scaling names Megatron's fixed bands. --cp
    alone is a layout to `megatron` as to `estimate`."""
    from planner.hf_config import approximation_notes
    from planner.model import load_model
    from pathlib import Path
    r = runner.invoke(app, ["megatron", "-m", "deepseek-v2", "-s", "h100-sxm", "-g", "128", "-b", "256", "--tp", "2",
                            "--pp", "4", "--ep", "16", "--etp", "1", "--recompute", "full", "--format", "json"])
    assert r.exit_code == 0, r.output
    argv = json.loads(r.stdout)["argv"]
    assert "--moe-router-pre-softmax" in argv and argv[argv.index("--moe-router-topk-scaling-factor") + 1] == "16"
    cfg = json.loads(open("tests/fixtures/hf/gemma-3-12b/config.json").read())
    (cfg.get("text_config") or cfg).pop("sliding_window_pattern")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    gemma = load_model(str(tmp_path))
    assert (gemma.attention_window, gemma.window_full_every) == (1024, 6)
    notes = approximation_notes(Path(tmp_path / "config.json"), 4096)
    assert any("rope_local_base_freq 10000" in n and "one --rotary-base" in n for n in notes), notes
    scout = runner.invoke(app, ["megatron", "-m", "llama4-scout", "-s", "h100-sxm", "-g", "64", "-b", "64", "--tp", "4",
                                "--ep", "16", "--recompute", "full", "--format", "json"])
    assert any("fixed frequency bands" in n for n in json.loads(scout.stdout)["notes"])
    cp = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--cp", "2"]
    est = json.loads(runner.invoke(app, ["estimate", *cp, "--json"]).stdout)["plan"]
    launch = runner.invoke(app, ["megatron", *cp, "--format", "json"])
    assert launch.exit_code == 0, launch.output
    argv = json.loads(launch.stdout)["argv"]
    assert argv[argv.index("--context-parallel-size") + 1] == "2"
    assert (est["tp"], est["pp"], est["cp"], est["dp"]) == (1, 1, 2, 4)


@pytest.mark.parametrize("change, words", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32, "low_freq_factor": "1"}},
     ("rope_scaling.low_freq_factor", "a number > 0")),  # was an internal error
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32, "original_max_position_embeddings": 8192.5}},
     ("original_max_position_embeddings", "an integer >= 1")),
    ({"rope_scaling": {"rope_type": "Llama3", "factor": 32}}, ("did you mean 'llama3'",)),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 0.5}}, ("rope_scaling.factor", "from 1 to 10000")),
    ({"sliding_window": 1024, "sliding_window_pattern": 0}, ("sliding_window_pattern", "an integer >= 1")),
    ({"rms_norm_eps": 1e-5, "layer_norm_epsilon": 1e-6}, ("epsilon is given twice",)),
    ({"rms_norm_eps": 1e-300}, ("rms_norm_eps", "from 1e-12 to 0.1")),
    ({"sliding_window": 10**12}, ("sliding_window",)),
])
def test_config_json_launch_fields_are_refused_by_their_own_key(tmp_path, change, words):
    """The fifth probe of the new launch fields: each bad value is one line naming the config key."""
    from tests.conftest import one_line_error
    cfg = {**json.loads(open("tests/fixtures/hf/llama-3.2-1b/config.json").read()), **change}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    one_line_error(runner.invoke(app, ["count", "-m", str(tmp_path), "-s", "h100-sxm", "-g", "8", "-b", "64"]), *words)


def test_window_patterns_read_as_transformers_reads_them(tmp_path):
    """sliding_window_pattern 6.0 is 6; 1 keeps every layer full (no window, no note); one beyond
    the layers windows every layer; a contradictory DeepSeek router is refused; estimate says what
    of the attention is not costed, as the launch does."""
    from planner.model import load_model
    from tests.conftest import one_line_error
    base = json.loads(open("tests/fixtures/hf/llama-3.2-1b/config.json").read())  # 16 layers
    for pattern, window, every in ((6.0, 1024, 6), (1, None, None), (64, 1024, None)):
        folder = tmp_path / f"p{pattern}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**base, "sliding_window": 1024,
                                                        "sliding_window_pattern": pattern}))
        m = load_model(str(folder))
        assert (m.attention_window, m.window_full_every) == (window, every), pattern
    r = runner.invoke(app, ["count", "-m", str(tmp_path / "p1"), "-s", "h100-sxm", "-g", "8", "-b", "64"])
    assert r.exit_code == 0 and "sliding-window" not in r.stderr, r.output
    ds = json.loads(open("tests/fixtures/hf/deepseek-v3/config.json").read())
    (tmp_path / "config.json").write_text(json.dumps({**ds, "scoring_func": "softmax"}))
    one_line_error(runner.invoke(app, ["count", "-m", str(tmp_path), "-s", "h100-sxm", "-g", "8", "-b", "64"]),
                   "noaux_tc balances sigmoid scores")
    est = runner.invoke(app, ["estimate", "-m", "gpt-oss-20b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1",
                              "--ep", "8"])
    assert "Attention: the 128-token sliding window" in est.output and "sinks are launched" in " ".join(est.output.split())


def test_a_yes_no_where_a_name_goes_lists_the_names(tmp_path):
    """rope_scaling: no (YAML 1.1's false) said only 'expected text (a name)': the names are listed,
    with the YAML 1.1 reason."""
    from tests.conftest import one_line_error
    text = open("planner/presets/llama3.1-8b.yaml").read().replace("rope_scaling: llama3", "rope_scaling: no")
    (tmp_path / "m.yaml").write_text(text)
    one_line_error(runner.invoke(app, ["count", "-m", str(tmp_path / "m.yaml"), "-s", "h100-sxm", "-g", "8", "-b", "64"]),
                   "rope_scaling: expected one of none, yarn, llama3, linear, got false", "quote the name")


# ---- a saved plan file cut short (fuzz audit 2026-11-28) -----------------------------------------

@pytest.mark.parametrize("lines_kept", [34, 40, 49])
def test_a_saved_plan_file_cut_short_is_refused_not_filled_with_defaults(tmp_path, lines_kept):
    """`head -n N plan.yaml` of an MXFP8 plan with bf16 Adam moments and bf16 edge layers had
    launched in bf16 without them (exit 0); a file with `job:` must carry every setting."""
    import yaml as _yaml

    from tests.conftest import one_line_error
    run = lambda args: runner.invoke(app, args)  # noqa: E731
    saved = tmp_path / "full.yaml"
    r = run(["plan", "-m", "llama3.1-8b", "-s", "b200", "-g", "64", "-b", "512", "--dtype", "mxfp8",
             "--adam-moments", "bf16", "--bf16-layers", "1,1", "--save", str(saved)])
    assert r.exit_code == 0, r.output
    lines = saved.read_text().splitlines(keepends=True)
    assert lines[33].startswith("job:") and len(lines) > 49
    cut = tmp_path / "cut.yaml"
    cut.write_text("".join(lines[:lines_kept]))
    kept = _yaml.safe_load(cut.read_text()).get("job") or {}
    assert any(f not in kept for f in ("dtype", "adam_moments", "bf16_layers"))
    for command in (["megatron", "--plan", str(cut), "--format", "args"], ["estimate", "--plan", str(cut)]):
        line = one_line_error(run(command))
        assert "missing job." in line and "cut short" in line, line
    assert run(["megatron", "--plan", str(saved), "--format", "args"]).exit_code == 0


def test_a_saved_bytes_per_param_block_cut_short_is_refused(tmp_path):
    """A saved file's bytes_per_param without `weights` had been filled with the default 2 bytes
    (input audit); the block is written whole, so a gap is a cut or an edit."""
    import yaml as _yaml

    from tests.conftest import one_line_error
    saved = tmp_path / "full.yaml"
    assert runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1",
                               "--save", str(saved)]).exit_code == 0
    data = _yaml.safe_load(saved.read_text())
    del data["job"]["bytes_per_param"]["weights"]
    cut = tmp_path / "cut.yaml"
    cut.write_text(_yaml.safe_dump(data))
    line = one_line_error(runner.invoke(app, ["estimate", "--plan", str(cut)]))
    assert "missing job.bytes_per_param.weights" in line and "cut short" in line, line


@pytest.mark.parametrize("pins, words", [
    (["--tp", "8", "--pp", "16"], "your pins need tp·pp = 128 GPUs; the system has 64"),
    (["--tp", "8", "--pp", "8", "--dp", "8"], "tp·pp·dp = 512 GPUs"),
    (["--micro-batch", "3"], "not a multiple of micro_batch·dp"),
])
@pytest.mark.parametrize("command", ["plan", "check"])
def test_pins_that_contradict_each_other_are_an_input_error(command, pins, words):
    """Each pin passed its own check; together they leave no layout of the job. That is a mistake
    in the input (exit 2, one line, as `estimate` says it), not a box where nothing fits (exit 1)."""
    from tests.conftest import one_line_error
    line = one_line_error(runner.invoke(app, [command, "-m", "llama3-8b", "-s", "h100-sxm", "-g", "64", "-b", "512",
                                              *pins]))
    assert line.startswith("error: pins: your pins (") and words in line, line


def _hf_copy(tmp_path, edit):
    from pathlib import Path as _Path
    src = _Path(__file__).resolve().parent / "fixtures" / "hf" / "llama-3.1-70b" / "config.json"
    cfg = json.loads(src.read_text())
    edit(cfg)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


@pytest.mark.parametrize("edit, words", [
    (lambda c: (c.pop("model_type"), c.update(architectures=["BertForMaskedLM"])), "is an encoder model"),
])
def test_configs_the_planner_would_misread_are_refused(tmp_path, edit, words):
    """Fuzz audit: a BERT config without its model_type was costed as a decoder (exit 0)."""
    from tests.conftest import one_line_error
    one_line_error(runner.invoke(app, ["estimate", "-m", _hf_copy(tmp_path, edit), "-s", "h100-sxm", "-g", "8",
                                       "-b", "8", "--tp", "1", "--pp", "1"]), words)


def test_more_mtp_modules_than_layers_and_every_layer_in_bf16_are_refused(tmp_path):
    from tests.conftest import one_line_error
    spec = tmp_path / "m.yaml"
    spec.write_text("name: x\nlayers: 4\nhidden: 512\nheads: 8\nffn: 2048\nseq_length: 1024\nvocab: 32000\n"
                    "mtp_layers: 10\nmoe: {num_experts: 8, top_k: 2}\n")
    one_line_error(runner.invoke(app, ["estimate", "-m", str(spec), "-s", "h100-sxm", "-g", "8", "-b", "8"]),
                   "mtp_layers (10) exceeds the 4 layers")
    one_line_error(runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "b200", "-g", "8", "-b", "64", "--dtype",
                                       "fp8-cs", "--bf16-layers", "32,0"]), "keeps all 32 layers", "--dtype bf16")


def test_a_file_given_to_the_wrong_flag_says_which_flag_reads_it(tmp_path):
    """A plan file given to -m had read "plan: unknown field (and 11 more problems)"."""
    from pathlib import Path as _Path

    from tests.conftest import one_line_error
    root = _Path(__file__).resolve().parents[1]
    saved = tmp_path / "p.yaml"
    assert runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--save",
                               str(saved)]).exit_code == 0
    hf = tmp_path / "llama_config.yaml"
    hf.write_text((root / "tests/fixtures/hf/llama-3.1-70b/config.json").read_text())
    for model, system, words in ((saved, "h100-sxm", "a plan file (plan:); pass it with --plan"),
                                 ("llama3-8b", saved, "a plan file"),
                                 (root / "hardware/presets/h100-sxm.yaml", "h100-sxm", "a system file"),
                                 ("llama3-8b", root / "planner/presets/llama3-8b.yaml", "a model file (layers:, hidden:)"),
                                 (hf, "h100-sxm", "named config.json")):
        one_line_error(runner.invoke(app, ["plan", "-m", str(model), "-s", str(system), "-g", "8", "-b", "8"]), words)
    # and a Hugging Face config given as the plan (it had printed a default-model note, then 'missing tp')
    one_line_error(runner.invoke(app, ["estimate", "--plan", str(hf)]), "a Hugging Face config", "not with --plan")


def test_an_unknown_rope_type_is_read_and_said(tmp_path):
    """transformers adds RoPE types; one the planner does not know is read (its cost does not
    depend on the frequencies) and the notes say it was launched without it (it was silent)."""
    model = _hf_copy(tmp_path, lambda c: c.update(rope_scaling={"rope_type": "bogus", "factor": 2.0}))
    result = runner.invoke(app, ["count", "-m", model, "-s", "h100-sxm", "-g", "8", "-b", "8"])
    assert result.exit_code == 0, result.output
    assert 'rope_type "bogus" is not one the planner knows' in " ".join(result.output.split())


def test_a_reference_records_model_errors_name_the_field_without_pydantic_words(tmp_path):
    from tests.conftest import one_line_error
    ref = tmp_path / "r.yaml"
    body = ("records:\n- id: x\n  model: {{name: X, layers: 4, hidden: 2304, heads: {heads}, vocab: 32000, seq: {seq}}}\n"
            "  system: {{gpu: H100-SXM5-80GB, gpus: 8}}\n  parallel: {{tp: 1, pp: 1, microbatch: 1, global_batch: 8}}\n"
            "  precision: bf16\n  measured: {{iteration_time_s: 1.0}}\n")
    ref.write_text(body.format(heads=7, seq=1024))
    line = one_line_error(runner.invoke(app, ["validate", "--reference", str(ref)]), "must be divisible by heads (7)")
    assert "Value error" not in line, line
    ref.write_text(body.format(heads=8, seq=99999999))
    one_line_error(runner.invoke(app, ["validate", "--reference", str(ref)]), "model: seq_length: must be an integer")


def test_more_stages_than_layers_by_two_names_the_recipes_layout():
    """Llama 3.1 405B at pp 16 x vpp 8 (128 stages, 126 layers) is NVIDIA's recipe with the
    embedding and the loss on stages of their own; the refusal says how to write it."""
    from tests.conftest import one_line_error
    args = ["megatron", "-m", "llama3.1-405b", "-s", "gb200-nvl72", "-g", "256", "-b", "1536", "--dtype", "fp8-cs",
            "--tp", "4", "--pp", "16", "--vpp", "8", "--format", "args"]
    one_line_error(runner.invoke(app, args), "--pipeline-layout 0,1x126,0")
    assert runner.invoke(app, args + ["--pipeline-layout", "0,1x126,0"]).exit_code == 0


def test_an_mla_checkpoints_yarn_is_launched_and_what_megatron_fixes_is_said(tmp_path):
    """DeepSeek-V3's config.json YaRN (factor 40, mscale 1, mscale_all_dim 1) is launched as
    Megatron-Bridge's recipe sets it (Megatron's defaults run plain RoPE); a beta Megatron's MLA
    fixes (Kimi K2 writes beta_fast 1) is said in a note."""
    from pathlib import Path as _Path
    src = _Path(__file__).resolve().parent / "fixtures" / "hf" / "deepseek-v3" / "config.json"
    args = ["-s", "h100-sxm", "-g", "1024", "-b", "1024", "--tp", "2", "--pp", "16", "--ep", "64", "--etp", "1",
            "--format", "args"]
    out = runner.invoke(app, ["megatron", "-m", str(src.parent), *args])
    assert out.exit_code == 0, out.output
    argv = out.stdout.split()
    assert [argv[argv.index(f) + 1] for f in ("--rotary-scaling-factor", "--mscale", "--mscale-all-dim")] == \
        ["40", "1", "1"]
    cfg = json.loads(src.read_text())
    cfg["rope_scaling"]["beta_fast"] = 1
    folder = tmp_path / "kimi-like"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    out = runner.invoke(app, ["megatron", "-m", str(folder), *args])
    assert out.exit_code == 0 and "rope_scaling yarn with beta_fast 1: Megatron's MLA fixes" in " ".join(
        out.output.split()), out.output


def test_a_scalar_where_a_mapping_goes_says_so_without_pydantic_class_names(tmp_path):
    from tests.conftest import one_line_error
    spec = tmp_path / "m.yaml"
    spec.write_text("name: x\nlayers: 4\nhidden: 512\nheads: 8\nffn: 2048\nseq_length: 1024\nvocab: 32000\nmoe: 8\n")
    line = one_line_error(runner.invoke(app, ["estimate", "-m", str(spec), "-s", "h100-sxm", "-g", "8", "-b", "8"]),
                          "moe: expected a mapping of its fields")
    assert "MoESpec" not in line, line


def test_a_reference_field_in_the_wrong_block_is_told_where_it_goes(tmp_path):
    """`gpus:` at a record's top level had been met with 'did you mean tags?'."""
    from tests.conftest import one_line_error
    ref = tmp_path / "r.yaml"
    ref.write_text("records:\n- id: x\n  gpus: 8\n  model: {name: X, layers: 4, hidden: 2304, heads: 8, vocab: 32000,"
                   " seq: 1024}\n  system: {gpu: H100-SXM5-80GB, gpus: 8}\n  parallel: {tp: 1, pp: 1, microbatch: 1,"
                   " global_batch: 8}\n  precision: bf16\n  measured: {iteration_time_s: 1.0}\n")
    one_line_error(runner.invoke(app, ["validate", "--reference", str(ref)]), "gpus: unknown field; it belongs under system:")


def test_a_json_word_that_is_an_options_value_asks_for_no_json():
    """`count -m --json` took --json as the model and answered its error in JSON (input audit)."""
    result = runner.invoke(app, ["count", "-m", "--json"])
    assert result.exit_code == 2 and "unknown preset '--json'" in result.output
    assert not result.stdout.lstrip().startswith("{")
    as_json = runner.invoke(app, ["count", "-m", "nope", "--json"])
    assert as_json.exit_code == 2 and json.loads(as_json.stdout)["error"].startswith("model: unknown preset 'nope'")
