"""Every plan the search picks on the preset systems must be a Megatron launch Megatron accepts,
and the emitted script must parse back to the same GPU count and batch arithmetic."""
import pytest

from hardware import load_system, system_preset_names
from hardware.errors import SpecError
from planner import megatron as mg
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan

MODELS = ("gpt3-175b", "llama3-70b", "mixtral-8x7b")


@pytest.mark.parametrize("system_name", system_preset_names())
@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_searched_plans_emit_valid_megatron(system_name, model_name, dtype):
    model, system = load_model(model_name), load_system(system_name, 256)
    job = JobSpec(global_batch=None, max_global_batch=1024, dtype=dtype)
    if dtype == "fp8" and "fp8" not in system.accelerator.peak_flops:
        with pytest.raises(SpecError, match="fp8"):
            plan(model, system, job, top_k=1)
        return
    result = plan(model, system, job, top_k=3)
    assert result.ranked, f"no plan for {model_name} on {system_name}"
    for ranked in result.ranked:
        p = ranked.plan
        assert mg.not_expressible(p, model, job) == []
        launch = mg.megatron_args(p, model, job, system)
        assert mg.validate_launch(launch, mg.gpu_arch_major(system)) == []
        env, argv, torchrun = mg.parse_script(mg.render(launch, "script"))
        args = mg.parse_megatron_args(argv)
        tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
        cp = args.context_parallel_size
        world = int(torchrun["--nnodes"]) * int(torchrun["--nproc-per-node"])
        assert world == 256 and world % (tp * pp * cp) == 0
        dp = world // (tp * pp * cp)
        assert (tp, pp, cp, dp) == (p.tp, p.pp, p.cp, p.dp)
        assert args.global_batch_size % (args.micro_batch_size * dp) == 0
