"""What the commands print is what they cost (an audit of ~190 runs): a plan string a user copies
gives the same plan, the same time and the same fit; a follow-up command does what it says."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from hardware import load_system
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.search import check

runner = CliRunner()


def test_check_prints_the_selective_modules_of_the_plan_it_names():
    """rich took `[mlp]` for a style tag and dropped it: as printed, the plan did not fit."""
    args = ["check", "-m", "llama3-70b", "-s", "a100-40g", "-g", "8", "-b", "64"]
    text = runner.invoke(app, args).output
    named = [r for r in json.loads(runner.invoke(app, [*args, "--json"]).output)["reasons"] if "[" in r]
    assert named, "the JSON names no plan with a module list"
    for reason in named:
        plan = reason[reason.index("(t") + 1:reason.index(")", reason.index("(t"))]
        assert plan.split()[0] in " ".join(text.split()), (plan, text)
    assert "rc-selective[" in " ".join(text.split()), text


def test_a_plan_string_names_tp_comm_overlap():
    base = dict(tp=4, dp=2, global_batch=8, sequence_parallel=True)
    assert "tp-overlap" in Plan(**base, tp_comm_overlap=True).short()
    assert "tp-overlap" not in Plan(**base).short()
    out = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "4",
                              "--pp", "1", "--sequence-parallel", "--tp-comm-overlap"]).output
    assert "TP comm overlap" in " ".join(out.split()), out


def test_usable_hbm_is_printed_to_the_totals_digits():
    """'17.70 of 17.7 usable' then 'Not feasible' read as a contradiction."""
    out = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "8",
                              "--pp", "1", "--dp", "1", "--micro-batch", "1", "--sequence-parallel", "--recompute", "full",
                              "--zero-stage", "0", "--hbm-reserve-gib", "61.91"]).output
    assert "of 17.69 usable" in out and "Not feasible" in out, out


def test_check_outside_the_cli_gives_no_command_that_plans_another_job():
    """A sweep's point has no command line: `planner plan -g 40` would plan the default example."""
    res = check(load_model("llama3-70b"), load_system("a100-40g", 8), JobSpec(global_batch=64))
    gpus = next(r for r in res.reasons if r.startswith("GPUs:"))
    assert "planning this job on" in gpus and "`planner plan -g" not in gpus, gpus


def test_checkpoint_takes_a_layout_that_fits_with_sp_and_recompute_as_fitting():
    """`planner plan` runs llama3-70b on 512 H100 as tp4 pp1 ZeRO-2 with SP and full recompute
    (77.3 of 77.6 GiB); checkpoint had costed the layout without them (107.8 GiB) and said it did
    not fit."""
    out = runner.invoke(app, ["checkpoint", "-m", "llama3-70b", "-s", "h100-sxm", "-g", "512", "--tp", "4", "--pp", "1",
                              "--zero-stage", "2", "--json"])
    assert out.exit_code == 0, out.output
    assert not any("does not fit" in n for n in json.loads(out.output)["notes"]), out.output


def test_dp_overlap_off_is_named_wherever_gradients_are_reduced():
    """dp 1 with cp 2 still reduces gradients over cp (1.48 s overlapped, 1.55 s not): the string
    must say which."""
    plan = Plan(tp=8, cp=2, dp=1, global_batch=8, sequence_parallel=True, dp_comm_overlap=False)
    assert "no-dp-overlap" in plan.short()
    assert "no-dp-overlap" not in Plan(tp=8, dp=1, global_batch=8, dp_comm_overlap=False).short()


def test_a_recompute_count_covering_the_fullest_rank_launches_every_layer():
    """k 17 over stages (3, 14, 14, 1) at vpp 2 is every layer of both ranks (17 and 15), as the
    model costs it; k // vpp = 8 a chunk would have launched 3 + 8 and 8 + 1. A count below that
    which vpp does not divide has no launch; one it divides runs k/vpp of every chunk."""
    from planner.analytical import PlanArrays
    from planner.megatron.emit import recompute_layers_per_chunk
    from planner.megatron.expressible import not_expressible
    model = load_model("llama3-8b")
    base = Plan(tp=2, pp=2, vpp=2, dp=4, global_batch=64, sequence_parallel=True, recompute="full",
                stage_layers=(3, 14, 14, 1))
    job = JobSpec(global_batch=64)
    every = base.model_copy(update={"recompute_num_layers": 17})
    assert recompute_layers_per_chunk(every, model) == 14
    P = PlanArrays.from_plans([every], model.layers, 0)
    assert sorted(P.rank_recompute[0][:2]) == [15, 17]
    assert not any("recompute_num_layers" in r for r in not_expressible(every, model, job))
    odd = base.model_copy(update={"recompute_num_layers": 5})
    assert any("recompute_num_layers" in r for r in not_expressible(odd, model, job))
    even = base.model_copy(update={"recompute_num_layers": 16})
    assert recompute_layers_per_chunk(even, model) == 8
    P = PlanArrays.from_plans([even], model.layers, 0)
    assert sorted(P.rank_recompute[0][:2]) == [9, 11]  # 3 + 8 and 8 + 1, as Megatron runs it


def test_a_printed_offload_fraction_gives_the_plan_back():
    """The search offloads whole layers (3 of Llama-3 8B's 32: 0.09375); the plan line printed
    `off-act0.094`, which `planner estimate --offload-activations 0.094` costs as 4 layers (HBM
    and the Megatron launch differ)."""
    from planner.analytical import estimate
    model, system, job = load_model("llama3-8b"), load_system("gb300-nvl72", 8), JobSpec(global_batch=64)
    plan = Plan(dp=8, micro_batch=8, global_batch=64, zero_stage=2, offload_activations=3 / 32)
    printed = next(t for t in plan.short().split() if t.startswith("off-act")).removeprefix("off-act")
    again = plan.model_copy(update={"offload_activations": float(printed)})
    assert estimate(model, system, again, job).hbm_bytes == estimate(model, system, plan, job).hbm_bytes, printed


def test_a_printed_per_stage_recompute_gives_the_plan_back():
    """The per-stage search sets the recompute count of each virtual stage (DeepSeek-V3 on 128
    B200: 1,2x6,1,2,...); the plan line printed their largest as `rc-k2`, which estimate reads as
    --recompute-num-layers 2, two layers per pipeline rank: another plan (it did not fit)."""
    from planner.analytical import estimate
    plan = Plan(tp=1, pp=2, dp=4, vpp=2, micro_batch=1, global_batch=64, recompute="full",
                stage_layers=(9, 7, 8, 8), stage_recompute_layers=(2, 1, 2, 2))
    flags = []
    for token in plan.short().split():
        if token.startswith("layers["):
            flags += ["--pipeline-layout", token[7:-1]]
        elif token.startswith("rc-k["):
            flags += ["--stage-recompute-layers", token[5:-1]]
        elif token.startswith("rc-k"):
            flags += ["--recompute-num-layers", token[4:]]
    out = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1",
                              "--pp", "2", "--micro-batch", "1", "--recompute", "full", *flags, "--json"])
    assert out.exit_code in (0, 1), out.output
    got = json.loads(out.stdout)
    assert got["plan"]["stage_recompute_layers"] == [2, 1, 2, 2], plan.short()
    want = estimate(load_model("llama3-8b"), load_system("h100-sxm", 8), plan, JobSpec(global_batch=64))
    assert got["step_time_s"] == want.step_time_s
