"""What a Megatron-LM launch is: ordered `pretrain_gpt.py` flags, environment, torchrun geometry.

Flags that do NOT exist in Megatron-LM and are never emitted (shared/reference/megatron_args.md,
"MA" below, section 0): --virtual-pipeline-model-parallel-size, --fp8, --cpu-offloading,
--overlap-p2p-communication.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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



def gpu_arch_major(system: SystemSpec) -> int:
    """Compute-capability major of the accelerator, from its name (V100 7, A100 8, H100/H200/GH200 9,
    B200/GB200 10)."""
    name = system.accelerator.name.upper()
    if name.startswith(("B", "GB")):
        return 10
    if name.startswith("V"):
        return 7
    if name.startswith("A"):
        return 8
    return 9
