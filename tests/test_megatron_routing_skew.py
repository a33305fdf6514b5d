"""`planner megatron` without a plan launches `planner plan`'s best plan; the routing skew changes
which plan that is (at 1.6 the busiest expert rank is 60 % over the mean, so fewer expert ranks
win), so `megatron` takes --moe-imbalance as `plan` and `estimate` do. Before, it had no such flag
and launched the balanced-routing plan for every MoE job.

The job: Mixtral 8x7B on 40 H100 (5 nodes), batch 160, where balanced routing picks ep 8 and the
skew ep 4 (on 64 GPUs, batch 256, ep 8 and ep 2; the same 4 sequences per GPU, in half the time)."""
import json

from typer.testing import CliRunner

from hardware import load_system
from planner.cli import app
from planner.model import load_model
from planner.plan import JobSpec
from planner.recommend import recommended_plan

runner = CliRunner()
JOB = ["-m", "mixtral-8x7b", "-s", "h100-sxm", "-g", "40", "-b", "160", "--format", "json"]


def launched_sizes(*extra: str) -> tuple[int, int, int]:
    result = runner.invoke(app, ["megatron", *JOB, *extra])
    assert result.exit_code == 0, result.output
    args = json.loads(result.stdout)["args"]
    return tuple(int(args[f"--{name}-model-parallel-size"]) for name in ("tensor", "pipeline", "expert"))


def test_the_launch_is_the_search_best_at_the_given_skew():
    model, system = load_model("mixtral-8x7b"), load_system("h100-sxm", 40)
    best = recommended_plan(model, system, JobSpec(global_batch=160, moe_load_imbalance=1.6))
    skewed = launched_sizes("--moe-imbalance", "1.6")
    assert skewed == (best.tp, best.pp, best.ep)
    assert launched_sizes() != skewed  # the skew decides this job's layout (ep 8 balanced, 4 skewed)


def test_a_skew_for_a_dense_model_is_refused():
    result = runner.invoke(app, ["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--moe-imbalance", "1.6"])
    assert result.exit_code == 2
    assert "moe-imbalance: applies to MoE models only" in result.output
