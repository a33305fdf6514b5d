"""Plan -> Megatron-LM launch for `pretrain_gpt.py` (a hybrid Mamba stack: `pretrain_mamba.py`),
and the checks Megatron runs on it.

  launch.py       MegatronLaunch: flags, env, torchrun geometry
  expressible.py  not_expressible(plan, model, job), launch_problems(plan, system): plan-level rules
  emit.py         megatron_args(plan, model, job, system) -> MegatronLaunch
  hybrid.py       a hybrid stack's block pattern (cut at the plan's stages) and Mamba-2 shape
  rules.py        validate_megatron_args(args, world_size, env, arch): Megatron's own checks/messages
  script.py       render(launch, 'script'|'args'|'json'), parse_script(script)
"""
from planner.megatron.emit import megatron_args
from planner.megatron.expressible import launch_problems, launch_refusals, not_expressible
from planner.megatron.launch import ENTRYPOINT, NONEXISTENT_FLAGS, MegatronLaunch, gpu_arch_major
from planner.megatron.rules import (
    parse_megatron_args,
    validate_launch,
    validate_megatron_args,
)
from planner.megatron.script import parse_script, render

__all__ = ["ENTRYPOINT", "MegatronLaunch", "megatron_args", "not_expressible", "launch_problems", "launch_refusals",
           "validate_megatron_args", "validate_launch", "parse_megatron_args", "render",
           "parse_script", "gpu_arch_major", "NONEXISTENT_FLAGS"]
