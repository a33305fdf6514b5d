"""What a Megatron-LM launch is: ordered `pretrain_gpt.py` flags, environment, torchrun geometry.

Flags that do NOT exist in Megatron-LM and are never emitted (shared/reference/megatron_args.md,
"MA" below, section 0): --virtual-pipeline-model-parallel-size, --fp8, --cpu-offloading,
--overlap-p2p-communication.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hardware import arch
from hardware.spec import SystemSpec

ENTRYPOINT = "pretrain_gpt.py"
MASTER_PORT = 6000

# Flags that Megatron-LM does not accept (MA 0); a test checks none is ever emitted.
NONEXISTENT_FLAGS = ("--virtual-pipeline-model-parallel-size", "--fp8", "--cpu-offloading",
                     "--overlap-p2p-communication")

Arg = tuple[str, str | None]
# Flags that take several values (argparse nargs): the Arg value holds them space-separated and
# they become separate words on the command line.
MULTI_VALUE_FLAGS = ("--recompute-modules", "--cuda-graph-modules")


def value_words(flag: str, value: str | None) -> list[str]:
    """The command-line words of one flag's value."""
    if value is None:
        return []
    return value.split() if flag in MULTI_VALUE_FLAGS else [value]


def flag_words(flag: str, value: str | None) -> list[str]:
    """The command-line words of one flag with its value. A single value that starts with '-' (a
    hybrid pattern "-M-M*") is joined to its flag with '=': argparse would read it as an option."""
    if value is not None and flag not in MULTI_VALUE_FLAGS and value.startswith("-"):
        return [f"{flag}={value}"]
    return [flag, *value_words(flag, value)]


@dataclass
class MegatronLaunch:
    """Ordered `pretrain_gpt.py` flags (value None = store_true flag), env and torchrun geometry."""

    args: list[Arg]
    env: dict[str, str] = field(default_factory=dict)
    unset_env: list[str] = field(default_factory=list)   # variables the launch must NOT inherit
    nnodes: int = 1
    gpus_per_node: int = 1          # torchrun --nproc-per-node
    world_size: int = 1
    entrypoint: str = ENTRYPOINT
    notes: list[str] = field(default_factory=list)
    # files the launch reads, written beside it (name -> text): the TE per-module precision file
    files: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        out: list[str] = []
        for flag, value in self.args:
            out.extend(flag_words(flag, value))
        return out

    def flags(self) -> list[str]:
        return [flag for flag, _ in self.args]

    def value(self, flag: str) -> str | None:
        for f, v in self.args:
            if f == flag:
                return v
        raise KeyError(flag)


def compute_capability(system: SystemSpec) -> float:
    """The accelerator's compute capability (hardware.arch.compute_capability: its own, else read
    from an NVIDIA product name, else hardware.arch.ASSUMED_ARCH; `arch_is_assumed` says
    when)."""
    return arch.compute_capability(system.accelerator)


def gpu_arch_major(system: SystemSpec) -> int:
    """The compute capability's major version (7 Volta, 8 Ampere, 9 Hopper, 10 Blackwell)."""
    return int(compute_capability(system))


def arch_is_assumed(system: SystemSpec) -> bool:
    """No compute_capability and no NVIDIA product name: ASSUMED_ARCH was taken."""
    acc = system.accelerator
    return acc.compute_capability is None and arch.arch_from_name(acc.name) is None


def arch_text(system: SystemSpec) -> str:
    """The compute capability as an error message says it: "9.0", or that it was assumed."""
    cc = compute_capability(system)
    return f"{cc:.1f}, assumed: set accelerator.compute_capability" if arch_is_assumed(system) else f"{cc:.1f}"
