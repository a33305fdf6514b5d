"""Options and loaders shared by every `planner` sub-command (one place, one wording)."""
from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from hardware import load_system
from hardware.errors import SpecError, refuse_dash, shortened
from hardware.spec import SystemSpec
from planner.analytical.precision import training_dtypes  # noqa: F401  (re-exported: cli modules use it)
from planner.model import MAX_SEQ_LENGTH, ModelSpec, load_model
from planner.plan import parse_recompute_modules

if TYPE_CHECKING:
    from planner.plan import JobSpec

DEFAULT_MODEL = "gpt3-175b"
DEFAULT_SYSTEM = "a100-80g"
DEFAULT_GPUS = 1024
DEFAULT_BATCH = 1536
DEFAULT_MAX_GLOBAL_BATCH = 3072  # the largest batch --free-batch picks unless told

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m", help="Model preset (see `planner presets`), a path to a model YAML file, or a Hugging Face "
                          "config.json (or the model directory holding it); a bare preset name always means "
                          "the preset (write ./NAME for a file of that name).")]
SystemOpt = Annotated[str, typer.Option(
    "--system", "-s", help="System preset (see `planner presets`) or a path to a system YAML file; a bare "
                           "preset name always means the preset.")]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", "-g", help="Number of GPUs (default: the system preset's count).")]
SeqOpt = Annotated[Optional[int], typer.Option(
    "--seq-length", help="Override the model's sequence length (tokens). A Hugging Face config.json "
    "defaults to 4096 (or its max_position_embeddings if smaller), not its full context.")]
BatchOpt = Annotated[Optional[int], typer.Option(
    "--global-batch", "-b", help="Global batch in sequences (fixed; default: the --plan file's, else 1536).")]
MaxBatchOpt = Annotated[Optional[int], typer.Option(
    "--max-global-batch", help="With --free-batch: the largest global batch the search may pick (default 3072).")]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="Compute precision: bf16, fp16, fp8 (delayed scaling), fp8-cs (current scaling), fp8-block (DeepSeek-V3 block scales), mxfp8 or nvfp4 (Blackwell only). Default: bf16, or fp16 on a GPU without bf16 (V100).")]
ReserveOpt = Annotated[float, typer.Option(
    "--hbm-reserve-gib", help="HBM per GPU kept free for CUDA context, NCCL and fragmentation (GiB).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
NoOffloadOpt = Annotated[bool, typer.Option("--no-offload", help="Never offload to the secondary memory tier.")]
FrameworkOpt = Annotated[str, typer.Option(
    "--framework", help="megatron (only plans Megatron-LM can run; default) or any (also weight offload).")]
IdleGpusOpt = Annotated[bool, typer.Option("--allow-idle-gpus", help="Allow tp·pp·dp·cp below the GPU count.")]
TpAcrossNodesOpt = Annotated[bool, typer.Option(
    "--tp-across-nodes", help="Let tensor parallelism leave the NVLink domain (costed on the inter-node network).")]


# Upper bounds on what a flag may ask for: far beyond any real job, small enough that the search's
# domains (one entry per batch, per GPU-count divisor) fit in memory and int64 (CP-SAT).
from hardware.spec import MAX_GPUS  # noqa: E402  a million GPUs: -g and a system file's num_gpus alike
from planner.plan import MAX_GLOBAL_BATCH  # noqa: E402  sequences per step: -b and a plan file alike
MAX_WORKERS = 256              # local worker processes (-j): each holds the model in memory


def check_int(flag: str, value: int | None, low: int = 1, high: int | None = None) -> None:
    """A flag's integer within [low, high], or one line naming the flag and the allowed range."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"an integer from {low:,} to {high:,}" if high is not None else f"an integer >= {low}"
        raise SpecError(f"{flag}: must be {allowed}, got {value}")


def check_float(flag: str, value: float | None, low: float = 0.0, high: float | None = None) -> None:
    """A flag's finite number within [low, high] (NaN and inf refused)."""
    import math
    if value is None:
        return
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        allowed = f"a number from {low:g} to {high:g}" if high is not None else f"a finite number >= {low:g}"
        raise SpecError(f"{flag}: must be {allowed}, got {value}")


def refuse_hidden_characters(flag: str, path, what: str) -> None:
    """A name the command will create: no control characters (a newline or tab pasted in with it),
    as `sweep --name` refuses them; such a file was written and its `wrote ...` line broke in two."""
    from hardware.errors import VISIBLE_LINE_PATTERN
    if str(path).strip() and not re.fullmatch(VISIBLE_LINE_PATTERN, str(path)):
        raise SpecError(f"{flag}: {shortened(path)!r} is not one line of visible text (a control character such "
                        f"as a newline or tab is in it); give the name of {what} without them")


def check_new_file(flag: str, path, example: str = "plan.yaml") -> None:
    """A path the command will create (never overwrite): said before any work, not after a search.
    `path` as the user wrote it (a str keeps a trailing slash, which pathlib drops)."""
    if path is None:
        return
    import os
    refuse_dash(path, flag, "give the name of a new file", "standard output")
    if str(path) in (".", ""):  # also what an empty argument becomes
        raise SpecError(f"{flag}: no file name given; give the name of a new file")
    refuse_hidden_characters(flag, path, "a new file")
    if str(path).endswith(("/", os.sep)) and not os.path.isdir(path):  # pathlib would write a file there
        raise SpecError(f"{flag}: {path} names a folder; give the name of a new file (e.g. {path}{example})")
    path = Path(path)
    try:
        if path.is_dir():
            raise SpecError(f"{flag}: {path} is a folder; give the name of a new file")
        if path.exists() or path.is_symlink():
            raise SpecError(f"{flag}: {path} already exists; refusing to overwrite it")
        if not path.parent.is_dir():
            why = "is a file, not a folder" if path.parent.exists() else "does not exist"
            raise SpecError(f"{flag}: folder {path.parent} {why}")
    except PermissionError as exc:  # a folder on the way this user may not enter
        raise SpecError(f"{flag}: {path}: cannot check ({exc.strerror})") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):  # found now, not after a search of minutes
        raise SpecError(f"{flag}: folder {path.parent} is not writable; give a file in a folder you may write")


def load_inputs(model: str, system: str, gpus: int | None, seq_length: int | None = None
                ) -> tuple[ModelSpec, SystemSpec]:
    check_int("seq-length", seq_length, 1, MAX_SEQ_LENGTH)
    check_int("gpus", gpus, 1, MAX_GPUS)
    spec = load_model(model, {"seq_length": seq_length})
    say_approximations(model, spec)
    return spec, load_system(system, gpus)


def say_approximations(ref: str, model: ModelSpec) -> None:
    """On stderr (JSON on stdout stays clean): what a Hugging Face config's cost approximates."""
    from planner import hf_config  # noqa: PLC0415 (only for configs)
    from planner.model import model_preset_names  # noqa: PLC0415
    path = hf_config.find_config_json(ref, model_preset_names())
    for note in hf_config.approximation_notes(path, model.seq_length) if path is not None else ():
        typer.echo(f"note: {path}: {note}", err=True)


SavedModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Model preset, YAML, or a Hugging Face config.json or model folder (default: the "
                          "one a --plan file names, else gpt3-175b).")]
SavedSystemOpt = Annotated[Optional[str], typer.Option(
    "--system", "-s", help="System preset or YAML (default: the one a --plan file names, else a100-80g).")]


def check_utf8_text(flag: str, value, kept_in: str) -> None:
    """A name or path the planner writes into a file (`kept_in`) must be UTF-8 text: a file name
    with other bytes reaches Python as lone surrogates, which neither JSON nor YAML can store (the
    file would be written unreadable, or the write would fail half-way)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            import os
            shown = repr(os.fsencode(value))[2:-1]  # the bytes as the file system has them: \xff
            raise SpecError(f"{flag}: '{shown}' is not valid UTF-8 (a file name with other bytes) and cannot be "
                            f"kept in {kept_in}; rename the file") from None


def check_plan_file_names(model, system) -> None:
    """The model and system a plan file will name, as UTF-8 text (check_utf8_text): said before a
    search by the commands that --save, and again by write_plan_file, the guard of every writer."""
    for key, ref in (("model", model), ("system", system)):
        check_utf8_text(f"save: {key}", ref, "a plan file")


def write_plan_file(path: str, data: dict) -> None:
    """Write a plan file (planner.planfile.plan_file_data) as the format its name says, JSON or
    YAML (YAML reads both); never over an existing file."""
    import json

    import yaml
    check_plan_file_names(data.get("model"), data.get("system"))
    try:
        with open(path, "x") as handle:
            if str(path).lower().endswith(".json"):
                json.dump(data, handle, indent=2)
                handle.write("\n")
            else:
                yaml.safe_dump(data, handle, sort_keys=False)
    except FileExistsError:
        raise SpecError(f"save: {path} already exists; refusing to overwrite it") from None
    except OSError as exc:
        raise SpecError(f"save: cannot write {path} ({exc.strerror})") from None


def _saved_file_keys() -> tuple[str, ...]:
    """The keys a saved plan file has beside `plan:` that no layout has (global_batch is both)."""
    from planner.plan import PLAN_FILE_FIELDS, Plan
    return tuple(k for k in PLAN_FILE_FIELDS if k != "plan" and k not in Plan.model_fields)


def read_plan_mapping(plan_file: str, flag: str) -> dict:
    """A plan file's mapping, read for --`flag`: an empty name, '-', or a model, system or Hugging
    Face file given as the plan is refused in one line that says what it is."""
    from pathlib import Path

    from hardware.errors import other_kind_of_file, read_yaml_mapping
    if not str(plan_file).strip():  # Path("") is the current folder: say what is really wrong
        raise SpecError(f"{flag}: empty name; give the path of a plan file (from `planner plan --save`)")
    refuse_dash(plan_file, flag, "give the path of a plan file (./- for a file named '-')")
    saved = read_yaml_mapping(Path(plan_file), flag)
    if "plan" not in saved and not {"tp", "pp", "dp"} & set(saved):
        # a model, system or Hugging Face file passed as the plan: say what it is before any default note
        other = other_kind_of_file(saved, "plan")
        if other:
            raise SpecError(f"{flag} {plan_file}: {other}, not with --{flag} (a plan comes from "
                            "`planner plan --save`)")
    beside = sorted(set(saved) & set(_saved_file_keys())) if "plan" not in saved else []
    if beside:
        # a saved plan file whose `plan:` line was lost, or a bare layout given a model: it would be
        # read as a bare layout, with a note that it names no model and an "unknown field" error
        raise SpecError(f"{flag} {plan_file}: {', '.join(beside)} beside the layout's own fields: a plan file keeps "
                        "the layout (tp, pp, dp, ...) under plan: and model:, system:, gpus:, job: beside it, as "
                        "`planner plan --save` writes it; put the layout under plan:, or give only the layout")
    return saved


def check_plan_file_header(saved: dict, plan_file: str, check_gpus: bool = True, check_seq: bool = True) -> None:
    """A saved plan file's fields beside its layout (model, system, gpus, seq_length) of the right
    kind, its numbers in range, checked as the file's (not as flags the user never gave): the
    same for every command that reads a plan file."""
    for key, kind in (("model", str), ("system", str), ("gpus", int), ("seq_length", int)):
        if key in saved and (not isinstance(saved[key], kind) or isinstance(saved[key], bool)):
            raise SpecError(f"plan {plan_file}: {key}: expected {kind.__name__}, got {saved[key]!r}")
    check_int(f"plan {plan_file}: gpus", saved.get("gpus") if check_gpus else None, 1, MAX_GPUS)
    check_int(f"plan {plan_file}: seq_length", saved.get("seq_length") if check_seq else None, 1, MAX_SEQ_LENGTH)


def load_inputs_for_plan(model: str | None, system: str | None, gpus: int | None, seq_length: int | None,
                         plan_file) -> tuple[ModelSpec, SystemSpec]:
    """load_inputs, where a file saved by `planner plan --save` supplies what the user did not give."""
    saved: dict = {}
    if plan_file is not None:  # --plan "" is a mistake, not "no plan"
        saved = read_plan_mapping(plan_file, "plan")
        from planner.plan import plan_layout_mapping
        plan_layout_mapping(saved, plan_file)  # a file that is no plan: one line, no note on defaults
        saved = saved if "plan" in saved else {}
        check_plan_file_header(saved, plan_file, check_gpus=gpus is None, check_seq=seq_length is None)

    def given(flag, key):  # a flag the user gave (0 included: it is refused, never replaced)
        if flag is None and key in ("model", "system") and isinstance(saved.get(key), str):
            # a file's relative path names a file beside the plan, wherever the command runs
            from planner.planfile import saved_reference
            return saved_reference(saved[key], key, plan_file)
        return flag if flag is not None else saved.get(key)
    # an empty -m/-s is refused by the loader, never replaced by the default
    model_ref, system_ref = given(model, "model"), given(system, "system")
    if plan_file is not None:  # `plan --save` writes both: a file without them may be a bad edit, so say it
        defaults = {"model": DEFAULT_MODEL, "system": DEFAULT_SYSTEM}
        unnamed = [key for key, ref in (("model", model_ref), ("system", system_ref)) if ref is None]
        if unnamed:
            typer.echo(f"note: plan {plan_file} names no {' and no '.join(unnamed)}; using "
                       + ", ".join(f"{defaults[k]} ({'-m' if k == 'model' else '-s'} to choose another)"
                                   for k in unnamed), err=True)
        if "job" not in saved and {"seq_length", "global_batch"} <= saved.keys():
            # a saved file (`plan --save` writes seq_length and global_batch beside the layout, then
            # job) cut short: what it ran (precision, kernels) is gone; a hand-written layout is not noted
            typer.echo(f"note: plan {plan_file} looks cut short: it has no job: block, which `plan --save` writes "
                       "last; costing it with this command's settings (--dtype and the other job flags, else their "
                       "defaults)", err=True)
    try:
        return load_inputs(DEFAULT_MODEL if model_ref is None else model_ref,
                           DEFAULT_SYSTEM if system_ref is None else system_ref,
                           given(gpus, "gpus"), given(seq_length, "seq_length"))
    except SpecError as err:  # a reference the plan file gave: say so
        from_file = [key for key, flag in (("model", model), ("system", system)) if flag is None and key in saved]
        if any(str(err).startswith(f"{key}:") for key in from_file):
            raise SpecError(f"plan {plan_file}: {err}") from None
        raise


def gpu_job_defaults(system: SystemSpec) -> dict:
    """What a job on this GPU runs unless told otherwise: bf16 where the GPU has it, else fp16
    (Volta: Megatron's --fp16 with loss scaling); fused attention from Ampere on, the unfused
    score path on Volta, where neither Transformer Engine's fused kernels nor FlashAttention-2
    run (both need compute capability 8.0)."""
    from planner.megatron import gpu_arch_major
    return {"dtype": "bf16" if "bf16" in system.accelerator.peak_flops else "fp16",
            "flash_attention": gpu_arch_major(system) >= 8}


def check_dtype_on_system(dtype: str, system: SystemSpec) -> None:
    """A training dtype the system's GPU runs, or a one-line error listing those it does (the same
    words for a --dtype flag and a plan file's job.dtype)."""
    allowed = training_dtypes(system)
    if dtype in training_dtypes() and dtype not in allowed:
        from planner.megatron.expressible import PRECISION_MIN_ARCH
        from planner.megatron.launch import arch_text, compute_capability
        arch, need = compute_capability(system), PRECISION_MIN_ARCH[dtype]
        why = f" ({dtype} needs compute capability {need:.1f} or newer; it is {arch_text(system)})" if arch < need else ""
        raise SpecError(f"dtype: {system.accelerator.name} has no {dtype} GEMM peak{why}; allowed on it: "
                        f"{', '.join(allowed)}")


def check_module_dtypes_on_system(module_dtypes: dict | None, system: SystemSpec, where: str = "module-dtype") -> None:
    """Each per-module dtype one the GPU runs, named as given (GROUP=DTYPE): the flag, or a plan
    file's job setting (`where`)."""
    for group, module_dtype in (module_dtypes or {}).items():
        try:
            check_dtype_on_system(module_dtype, system)
        except SpecError as err:
            raise SpecError(f"{where}: {group}={module_dtype}: {str(err).removeprefix('dtype: ')}") from None


def make_job(global_batch: int | None = None, max_global_batch: int = DEFAULT_MAX_GLOBAL_BATCH, dtype: str | None = None,
             hbm_reserve_gib: float = 2.0, system: SystemSpec | None = None, **extra) -> JobSpec:
    """The job the CLI's flags describe; a precision or attention path not given (None) is the GPU's
    default (`gpu_job_defaults`) where `system` is given, else bf16 and fused attention."""
    from pydantic import ValidationError

    from hardware.errors import one_line
    from planner.plan import JobSpec  # here, not at the top: `planner presets` needs no job
    check_int("global-batch", global_batch, 1, MAX_GLOBAL_BATCH)
    check_int("max-global-batch", max_global_batch, 1, MAX_GLOBAL_BATCH)
    from planner.plan import HBM_RESERVE_MAX_GIB
    check_float("hbm-reserve-gib", hbm_reserve_gib, 0.0, HBM_RESERVE_MAX_GIB)
    defaults = gpu_job_defaults(system) if system is not None else {"dtype": "bf16", "flash_attention": True}
    if dtype is not None and not dtype.strip():
        raise SpecError(f"dtype: empty; allowed: {', '.join(training_dtypes(system))}")
    dtype = (dtype or defaults["dtype"]).strip().lower()  # BF16, MXFP8 as NVIDIA's tables print them
    if dtype not in training_dtypes():
        raise SpecError(f"dtype: unknown {shortened(dtype)!r}; allowed: {', '.join(training_dtypes(system))}")
    if system is not None:
        check_dtype_on_system(dtype, system)
        check_module_dtypes_on_system(extra.get("module_dtypes"), system)
    if isinstance(extra.get("framework"), str):
        extra["framework"] = extra["framework"].strip().lower()
        frameworks = typing.get_args(JobSpec.model_fields["framework"].annotation)
        if extra["framework"] not in frameworks:
            raise SpecError(f"framework: unknown {shortened(extra['framework'])!r}; allowed: {', '.join(frameworks)}")
    if extra.get("flash_attention") is None:
        extra["flash_attention"] = defaults["flash_attention"]
    try:
        return JobSpec(global_batch=global_batch, max_global_batch=max_global_batch, dtype=dtype,
                       hbm_reserve_gib=hbm_reserve_gib, **extra)
    except ValidationError as err:
        # named as the user wrote it: the flag (bf16-layers), not the job's field (job: bf16_layers)
        text = str(one_line(err, "job")).removeprefix("job: ")
        field = text.split(":")[0].split(" ")[0]
        if field in JobSpec.model_fields and not text[len(field):].startswith(" (--"):  # (--flag) named already
            text = field.replace("_", "-") + text[len(field):]
        raise SpecError(text) from None


# ---- plan knobs: the same flags, wording and checks for plan/check (pins), estimate and megatron
TpOpt = Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel size.")]
PpOpt = Annotated[Optional[int], typer.Option("--pp", help="Pipeline-parallel size.")]
DpOpt = Annotated[Optional[int], typer.Option("--dp", help="Data-parallel size (default: GPUs/(tp·pp·cp)).")]
CpOpt = Annotated[Optional[int], typer.Option("--cp", help="Context-parallel size.")]
EpOpt = Annotated[Optional[int], typer.Option("--ep", help="Expert-parallel size (MoE).")]
MicroBatchOpt = Annotated[Optional[int], typer.Option("--micro-batch", help="Micro-batch size (sequences).")]
VppOpt = Annotated[Optional[int], typer.Option("--vpp", help="Virtual pipeline stages per rank (interleaving).")]
SpOpt = Annotated[Optional[bool], typer.Option(
    "--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism (needs tp > 1).")]
RecomputeOpt = Annotated[Optional[str], typer.Option(
    "--recompute", help="Activation recompute: none, selective or full (whole layers: a search picks the fewest "
                        "that fit, estimate and megatron take --recompute-num-layers, default all).")]
RecomputeModulesOpt = Annotated[Optional[str], typer.Option(
    "--recompute-modules", help="Selective recompute: the modules, e.g. 'layernorm,moe_act' (core_attn, moe_act, "
                                "layernorm, mla_up_proj, mlp, moe, shared_experts; default core_attn).")]
RecomputeLayersOpt = Annotated[Optional[int], typer.Option(
    "--recompute-num-layers", help="Full recompute: layers per pipeline stage (default all).")]
PipelineLayoutOpt = Annotated[Optional[str], typer.Option(
    "--pipeline-layout", metavar="LAYERS",
    help="Transformer layers per virtual pipeline stage, in Megatron's stage order (stage = chunk·pp + "
         "rank): counts with NxK for K stages of N, as plans print them ('3,4x30,3'), or Megatron's "
         "--pipeline-model-parallel-layout string ('Et*3|(tttt|)*30tttL'). As many stages as pp·vpp "
         "(vpp follows from the count when not given), the model's layers in all. Default: "
         "Megatron's even split.")]
StageRecomputeOpt = Annotated[Optional[str], typer.Option(
    "--stage-recompute-layers", metavar="LAYERS",
    help="Full recompute per virtual stage with --pipeline-layout: the layers each stage recomputes "
         "(its first ones), same notation ('1,2x30,1'); implies --recompute full. Megatron launches "
         "one count for every stage, min(k, its layers) ('3,4x30,3' with k 2: '2x32').")]
ZeroOpt = Annotated[Optional[int], typer.Option(
    "--zero-stage", help="0 plain DP, 1 distributed optimizer, 2 +grads, 3 +params (FSDP).")]
OffloadWeightsOpt = Annotated[Optional[float], typer.Option(
    "--offload-weights", help="Fraction of weights+grads in the offload tier (not expressible in Megatron).")]
OffloadActivationsOpt = Annotated[Optional[float], typer.Option(
    "--offload-activations", help="Fraction of activations in the offload tier (Megatron offloads whole "
                                  "layers: rounded up to them, 0.5 of 27 layers is 14).")]
OffloadOptimizerOpt = Annotated[Optional[float], typer.Option(
    "--offload-optimizer", help="Fraction of optimizer state in the offload tier.")]


def with_moe_imbalance(job, moe_imbalance: float | None):
    """`job` at the routing skew --moe-imbalance gives (None: as it is); a plan file saved before
    the skew was recorded says none, and takes the flag's."""
    if moe_imbalance is None or moe_imbalance == job.moe_load_imbalance:
        return job
    return make_job(**{**job.model_dump(), "moe_load_imbalance": moe_imbalance})


def switch(name: str, text: str):
    """An on/off plan flag (--NAME/--no-NAME), None when not given."""
    return Annotated[Optional[bool], typer.Option(f"--{name}/--no-{name}", help=text)]


TpOverlapOpt = switch("tp-comm-overlap", "Overlap TP communication with GEMMs (needs SP).")
DpOverlapOpt = switch("dp-comm-overlap", "Overlap DP gradient reduce / parameter gather.")
# Plan fields no search varies (a recipe's settings), taken as flags by `estimate` and `megatron`
PERF_KNOBS = ("cross_entropy_fusion", "grad_reduce_in_bf16", "fp8_param_gather")
CrossEntropyFusionOpt = switch("cross-entropy-fusion", "Fused cross-entropy kernels (costed).")
GradReduceBf16Opt = switch("grad-reduce-in-bf16", "16-bit gradient buffers and DP reduce (costed).")
Fp8ParamGatherOpt = switch("fp8-param-gather", "FP8 weights, gathered in FP8 (costed; FP8 dtypes).")

EtpOpt = Annotated[Optional[int], typer.Option(
    "--etp", help="Expert tensor-parallel size (MoE; default tp). Needs GPUs % (etp·ep·pp) == 0.")]
DpImplOpt = Annotated[Optional[str], typer.Option(
    "--dp-impl", help="Sharded data parallel implementation: megatron, torch-fsdp2 or deepspeed.")]
MoeDispatcherOpt = Annotated[Optional[str], typer.Option(
    "--moe-dispatcher",
    help="MoE token dispatcher: alltoall (Megatron's default) or deepep (DeepEP through Megatron's flex "
         "dispatcher: a token crosses the network once per destination node, then NVLink; needs the DeepEP "
         "library). `plan`/`check` cost every plan with it; default alltoall.")]
MoeA2aOverlapOpt = Annotated[Optional[bool], typer.Option(
    "--moe-a2a-overlap/--no-moe-a2a-overlap",
    help="Hide the expert all-to-all behind another microbatch's compute (Megatron "
         "--overlap-moe-expert-parallel-comm; needs ep > 1, vpp > 1 when pp > 1, no full recompute). "
         "With the alltoall dispatcher and the ep group inside one NVLink domain it hides nothing "
         "(NCCL's in-domain copy kernels; measured slower with it): use --moe-dispatcher deepep.")]
# Kernel-level settings of NVIDIA's tuned recipes (planner.plan.JobSpec): costed by `plan` and
# `estimate`; `planner megatron` emits the CUDA graphs (--cuda-graph) but not the other two
# (planner.cli.megatron.UNEMITTED_KERNELS says why).
CudaGraphOpt = Annotated[str, typer.Option(
    "--cuda-graph", help="CUDA graphs the run uses: none; layers (Transformer Engine graphs of each "
    "layer's static modules: attention, dense MLP, MoE router and preprocess; no per-layer launch "
    "overhead, the routed experts stay eager; launched as --cuda-graph-impl transformer_engine "
    "--cuda-graph-modules ...); or full-iteration (Megatron-Core cuda_graph_impl full_iteration: no "
    "per-layer launch or host time; `planner megatron` emits it for dense models and refuses it for MoE).")]
Fp8AttentionOpt = Annotated[bool, typer.Option(
    "--fp8-attention/--no-fp8-attention", help="Attention core in FP8 (--fp8-dot-product-attention; "
    "needs an FP8/FP4 dtype). Costed, not emitted by `planner megatron`.")]
FusedGroupedMlpOpt = Annotated[bool, typer.Option(
    "--fused-grouped-mlp/--no-fused-grouped-mlp", help="MoE: Transformer Engine's op fuser fuses the experts' "
    "activation and casts into the grouped GEMMs (Bridge's CuTeDSL grouped MLP). Costed, not emitted by "
    "`planner megatron`.")]
CUDA_GRAPHS = ("none", "layers", "full-iteration")
# --cuda-graph layers: every static module of the model's layers (megatron-core enums.CudaGraphModule:
# mlp is a dense layer's; a MoE layer's router and its preprocess, the routed experts staying eager)
LAYER_GRAPH_MODULES = {False: ("attn", "mlp"), True: ("attn", "moe_router", "moe_preprocess")}


def kernel_settings(cuda_graph: str = "none", fp8_attention: bool = False, fused_grouped_mlp: bool = False,
                    moe: bool = False, mamba: bool = False) -> dict:
    """JobSpec fields of the kernel flags (one-line error for an unknown --cuda-graph); `moe`: the
    model has experts, `mamba`: Mamba blocks (which modules --cuda-graph layers captures)."""
    given, cuda_graph = cuda_graph, str(cuda_graph).strip().lower()
    if cuda_graph not in CUDA_GRAPHS:
        raise SpecError(f"cuda-graph: must be one of {', '.join(CUDA_GRAPHS)}, got {shortened(given)!r}")
    return {"full_iteration_cuda_graph": cuda_graph == "full-iteration",
            "cuda_graph_modules": (LAYER_GRAPH_MODULES[moe] + (("mamba",) if mamba else ()))
            if cuda_graph == "layers" else (),
            "fp8_attention": fp8_attention, "fused_grouped_mlp": fused_grouped_mlp}


_ADAM_MOMENTS_HELP = (
    "Dtype of Adam's two moments: fp32 (Megatron's default, 8 B/param) or bf16 (4 B/param; Megatron's "
    "precision-aware optimizer, --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, "
    "as DeepSeek-V3 and NVIDIA's DeepSeek/Qwen3 recipes train; needs the distributed optimizer, ZeRO-1). "
    "Default: fp32")
# estimate and megatron, which read a --plan file
AdamMomentsOpt = Annotated[Optional[str], typer.Option(
    "--adam-moments", help=_ADAM_MOMENTS_HELP + " (with --plan: the plan file's).")]
# plan, check and checkpoint, which read none
AdamMomentsNoPlanOpt = Annotated[Optional[str], typer.Option("--adam-moments", help=_ADAM_MOMENTS_HELP + ".")]
ADAM_MOMENT_DTYPES = ("fp32", "bf16")


def adam_moments_setting(value: str | None) -> dict:
    """The JobSpec field of --adam-moments ({} when not given), one-line error for another dtype."""
    if value is None:
        return {}
    value = value.strip().lower()  # BF16 as NVIDIA writes it
    if value not in ADAM_MOMENT_DTYPES:
        raise SpecError(f"adam-moments: must be one of {', '.join(ADAM_MOMENT_DTYPES)}, got {shortened(value)!r}")
    return {"adam_moments": value}


Bf16LayersOpt = Annotated[Optional[str], typer.Option(
    "--bf16-layers", metavar="FIRST,LAST",
    help="Under a low-precision --dtype, keep the first FIRST and last LAST transformer layers in bf16 "
         "(Megatron --first-last-layers-bf16 --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16), "
         "as NVIDIA's NVFP4 recipes do: 0,14 for Nemotron 3 Super, 0,4 for GPT-OSS 20B. Costed and emitted. "
         "Default: none (the plan file's with --plan).")]


def bf16_layers_setting(value: str | None, model) -> dict:
    """The JobSpec field of --bf16-layers ({} when not given); one-line errors for a malformed
    value or more layers than the model has."""
    if value is None:
        return {}
    parts = str(value).replace(" ", "").split(",")
    # ASCII digits only, as -g takes them (str.isdigit also holds for '٢' and '²')
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise SpecError(f"bf16-layers: expected FIRST,LAST (two non-negative integers, e.g. 0,14), "
                        f"got {shortened(value)!r}")
    bf16_layers = (int(parts[0]), int(parts[1]))
    check_bf16_layers_fit(bf16_layers, model)
    return {"bf16_layers": bf16_layers}


ModuleDtypeOpt = Annotated[Optional[list[str]], typer.Option(
    "--module-dtype", metavar="MODULE=DTYPE",
    help="A per-module quantization recipe (repeatable): run MODULE's GEMMs in DTYPE instead of --dtype. "
         "MODULE: attention (QKV and output projections), latent_proj (LatentMoE's projections), "
         "mamba_out_proj, mtp (the whole MTP module); DTYPE: bf16, fp8-cs, fp8-block, mxfp8, nvfp4. "
         "Nemotron 3 Super's NVFP4 recipe: attention=bf16 latent_proj=bf16 mtp=bf16 mamba_out_proj=mxfp8. "
         "Costed, and launched by `planner megatron` as a Transformer Engine precision file "
         "(--te-precision-config-file, written by its script). Default: none.")]


def module_dtypes_setting(values: list[str] | None, model: ModelSpec) -> dict:
    """The JobSpec field of --module-dtype ({} when not given); one-line errors naming the
    allowed modules and dtypes, and a module the model does not have."""
    from planner.plan import MODULE_DTYPES, MODULE_GROUPS
    if not values:
        return {}
    out = {}
    for value in values:
        group, _, dtype = str(value).replace(" ", "").lower().partition("=")  # BF16 as --dtype reads it
        if group not in MODULE_GROUPS or dtype not in MODULE_DTYPES:
            raise SpecError(f"module-dtype: expected MODULE=DTYPE with MODULE one of {', '.join(MODULE_GROUPS)} and "
                            f"DTYPE one of {', '.join(MODULE_DTYPES)}, got {shortened(value)!r}")
        if group in out and out[group] != dtype:
            raise SpecError(f"module-dtype: {group} given twice ({out[group]}, {dtype})")
        has = {"attention": True, "latent_proj": bool(model.moe and model.moe.latent_size),
               "mamba_out_proj": model.mamba is not None, "mtp": bool(model.mtp_layers)}
        if not has.get(group, True):
            present = [g for g in MODULE_GROUPS if has.get(g, True)]
            raise SpecError(f"module-dtype: {model.name} has no {group} module; its modules: {', '.join(present)}")
        out[group] = dtype
    return {"module_dtypes": out}


def check_bf16_layers_fit(bf16_layers: tuple[int, int], model) -> None:
    """The (first, last) layers kept in bf16, from the flag or a plan file, must fit the model."""
    first, last = bf16_layers
    if first + last > model.layers:
        raise SpecError(f"bf16-layers: the job keeps {first} + {last} layers in bf16, which exceed "
                        f"{model.name}'s {model.layers}")
    if first + last == model.layers:  # as --bf16-layers under bf16: the low-precision dtype would act on nothing
        raise SpecError(f"bf16-layers: {first} + {last} keeps all {model.layers} layers of {model.name} in bf16, "
                        "so the low-precision --dtype would run no layer; use --dtype bf16")


def check_layout_fits_model(plan, model, plan_file: str | None = None) -> None:
    """A plan's explicit stage layout must hold the model's layers (a plan file saved for another
    model, run with -m, would otherwise be costed with phantom or missing layers)."""
    if plan.stage_layers is not None and sum(plan.stage_layers) != model.layers:
        where = f"plan {plan_file}" if plan_file else "pipeline-layout"
        raise SpecError(f"{where}: its stage_layers hold {sum(plan.stage_layers)} layers, but {model.name} has "
                        f"{model.layers}; a layout is one model's (plan this model anew, or give the layout's model)")


def check_recompute_layers(plan, model) -> None:
    """Full recompute of k layers per pipeline stage: k beyond the layers a stage holds would be
    cut to them without a word (Megatron's --recompute-num-layers is per virtual chunk)."""
    from planner.pipeline_layout import fullest_rank_layers
    if plan.recompute != "full" or plan.recompute_num_layers is None:
        return
    per_stage = fullest_rank_layers(plan, model.layers)
    if plan.recompute_num_layers > per_stage:
        raise SpecError(f"recompute-num-layers: {plan.recompute_num_layers} exceeds the {per_stage} layers a "
                        f"pipeline stage holds; give at most {per_stage} (or omit it: all of them)")


def refuse_moe_flags_on_dense(model, moe_imbalance: float | None, fused_grouped_mlp: bool | None,
                              moe_dispatcher: str | None = None, ep: int | None = None,
                              etp: int | None = None) -> None:
    """A MoE-only setting given for a model without experts is a mistake, not a no-op: an expert
    layout (ep above 1, any expert TP) included."""
    from planner.plan import MOE_IMBALANCE_RANGE
    check_float("moe-imbalance", moe_imbalance, *MOE_IMBALANCE_RANGE)
    if model.moe is not None:
        return
    for flag, value in (("ep", None if ep == 1 else ep), ("etp", etp)):
        if value is not None:
            raise SpecError(f"{flag}: expert parallelism needs a MoE model; {model.name} has no experts "
                            f"(got --{flag} {value})")
    # the default (what a saved dense plan records) names no MoE setting: only another dispatcher does
    if moe_dispatcher is not None and moe_dispatcher != "alltoall":
        raise SpecError(f"moe-dispatcher: applies to MoE models only; {model.name} has no experts")
    if moe_imbalance is not None and moe_imbalance != 1.0:
        raise SpecError(f"moe-imbalance: applies to MoE models only; {model.name} has no experts")
    if fused_grouped_mlp:
        raise SpecError(f"fused-grouped-mlp: applies to MoE models only; {model.name} has no experts")


MOE_IMBALANCE_HELP = ("MoE routing skew: tokens of the busiest expert rank over the mean. 1.0 = balanced, as "
                      "NVIDIA's benchmarks force (--moe-router-force-load-balancing); about 1.6 fits learned "
                      "dropless routing (Qwen3-235B, Megatron MoE ModelZoo). No effect at ep 1, where every rank "
                      "holds every expert.")
MoeImbalanceOpt = Annotated[Optional[float], typer.Option("--moe-imbalance", help=MOE_IMBALANCE_HELP)]
# estimate's: a plan file carries the skew it was costed with
MoeImbalancePlanOpt = Annotated[Optional[float], typer.Option(
    "--moe-imbalance", help=MOE_IMBALANCE_HELP + " Default: the --plan file's, else 1.0.")]

# The flags that make plan flags a layout (the rest of it then tp=pp=cp=1, dp filling the GPUs)
LAYOUT_FLAGS = ("tp", "pp", "dp", "cp")
# Knobs a plan given by flags takes where the user sets none: what NVIDIA's Megatron recipes set
# (sequence parallelism with tp, the distributed optimizer, overlapped DP communication), shared by
# `planner estimate` and `planner megatron` so that the same flags cost and launch the same plan.
RECIPE_KNOB_DEFAULTS = dict(sequence_parallel=True, zero_stage=1, dp_comm_overlap=True)
PLAN_KNOB_FLAGS = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "vpp", "sequence_parallel", "recompute",
                   "recompute_modules", "recompute_num_layers", "zero_stage", "offload_weights", "offload_activations",
                   "offload_optimizer", "tp_comm_overlap", "dp_comm_overlap", "etp", "dp_impl", "moe_dispatcher",
                   "moe_a2a_overlap")
RECOMPUTE_CHOICES = ("none", "selective", "full")
NAMED_CHOICES = {"recompute": RECOMPUTE_CHOICES, "moe_dispatcher": ("alltoall", "deepep"),
                 "dp_impl": ("megatron", "torch-fsdp2", "deepspeed")}
POSITIVE_KNOBS = ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch", "vpp", "recompute_num_layers")


def given_knobs(options: dict) -> dict:
    """The plan-knob flags the user gave (not None), checked: sizes >= 1, fractions in [0, 1],
    zero stage 0-3, known recompute."""
    knobs = {}
    for knob in PLAN_KNOB_FLAGS:
        value = options.get(knob)
        if value is None:
            continue
        flag = knob.replace("_", "-")
        if knob in POSITIVE_KNOBS:
            check_int(flag, value, 1, MAX_GPUS if knob != "micro_batch" else MAX_GLOBAL_BATCH)
        elif knob == "zero_stage":
            check_int(flag, value, 0, 3)
        elif knob.startswith("offload_"):
            check_float(flag, value, 0.0, 1.0)
        if knob in NAMED_CHOICES:
            value = str(value).strip().lower()
            if value not in NAMED_CHOICES[knob]:
                raise SpecError(f"{flag}: unknown {shortened(options[knob])!r}; allowed: "
                                f"{', '.join(NAMED_CHOICES[knob])}")
        if knob == "recompute_modules":
            try:  # the plan's own check, here for the flag's name
                parse_recompute_modules(str(value))
            except ValueError as exc:
                raise SpecError(f"plan: recompute_modules: {exc}") from None
        knobs[knob] = value
    return knobs


# The ZeRO stages each non-Megatron sharded DP is costed for (planner.analytical.data_parallel):
# PyTorch FSDP2 reshards parameters after forward (3) or keeps them (2, reshard_after_forward=False);
# DeepSpeed's only measured runs are ZeRO-3 (Narayanan et al. 2021, Table 2).
SHARDED_DP_STAGES = {"torch-fsdp2": (3, 2), "deepspeed": (3,)}


def refuse_plan_file_contradictions(plan, model, job, plan_file: str) -> None:
    """What the flags refuse (refuse_contradictions, refuse_moe_flags_on_dense, the layout's
    every-rank rule), refused in a plan file too: a hand-edited file must not cost what the same
    plan given as flags cannot."""
    where = f"plan {plan_file}"
    stages = SHARDED_DP_STAGES.get(plan.dp_impl)
    if stages is not None and plan.zero_stage not in stages:
        raise SpecError(f"{where}: dp_impl {plan.dp_impl} runs zero_stage {' or '.join(map(str, stages))} "
                        f"(the file says zero_stage {plan.zero_stage}); change one of the two")
    if plan.stage_layers is not None and any(sum(plan.stage_layers[r::plan.pp]) == 0 for r in range(plan.pp)):
        raise SpecError(f"{where}: stage_layers: every pipeline rank needs a layer (a rank's stages are "
                        f"r, r + pp, ...)")
    if model.moe is None:
        dense = [name for name, on in (("ep", plan.ep > 1), ("etp", plan.etp is not None),
                                       ("moe_dispatcher", plan.moe_dispatcher != "alltoall"),
                                       ("moe_a2a_overlap", bool(plan.moe_a2a_overlap)),
                                       ("fused_grouped_mlp", job is not None and job.fused_grouped_mlp),
                                       ("moe_load_imbalance", job is not None and job.moe_load_imbalance != 1.0))
                 if on]
        if dense:
            raise SpecError(f"{where}: {dense[0]}: applies to MoE models only; {model.name} has no experts")


def refuse_contradictions(knobs: dict, framework: str = "megatron") -> None:
    """Pins that no plan can satisfy, said as the rule they break (constraints/space.py encodes the
    same rules; answering here gives one line instead of an empty search)."""
    tp, pp = knobs.get("tp"), knobs.get("pp")
    if knobs.get("sequence_parallel") and tp == 1:
        raise SpecError("sequence-parallel: needs tp > 1 (got --tp 1); drop one of the two")
    if knobs.get("tp_comm_overlap"):
        if knobs.get("sequence_parallel") is False:
            raise SpecError("tp-comm-overlap: needs sequence parallelism (got --no-sequence-parallel)")
        if tp == 1:
            raise SpecError("tp-comm-overlap: needs tp > 1 with sequence parallelism (got --tp 1)")
    if (knobs.get("vpp") or 1) > 1 and pp == 1:
        raise SpecError(f"vpp: interleaving (vpp {knobs['vpp']}) needs pp > 1 (got --pp 1)")
    if knobs.get("moe_a2a_overlap"):  # the rules of expressible.a2a_overlap_refusals that pins alone break
        if knobs.get("ep") == 1:
            raise SpecError("moe-a2a-overlap: overlaps the expert all-to-all, which needs ep > 1 (got --ep 1)")
        if knobs.get("recompute") == "full":
            raise SpecError("moe-a2a-overlap: Megatron refuses full recompute with the all-to-all overlap "
                            "(got --recompute full)")
        modules = knobs.get("recompute_modules") or ()
        if "moe" in (modules.replace(" ", "").split(",") if isinstance(modules, str) else modules):
            raise SpecError("moe-a2a-overlap: the moe module cannot be recomputed with the all-to-all overlap "
                            "(got --recompute-modules with moe)")
    if knobs.get("recompute_num_layers") is not None and knobs.get("recompute") in ("none", "selective"):
        raise SpecError(f"recompute-num-layers: counts the layers of full recompute (got --recompute "
                        f"{knobs['recompute']}); use --recompute full or drop it")
    impl, zero = knobs.get("dp_impl"), knobs.get("zero_stage")
    if impl in SHARDED_DP_STAGES and zero is not None and zero not in SHARDED_DP_STAGES[impl]:
        raise SpecError(f"dp-impl: {impl} runs zero-stage {' or '.join(map(str, SHARDED_DP_STAGES[impl]))} "
                        f"(got --zero-stage {zero}); drop one of the two")
    if framework == "megatron" and (knobs.get("offload_activations") or 0) > 0 and (pp or 1) > 1:
        raise SpecError(f"offload-activations: Megatron-LM offloads activations only without pipeline "
                        f"parallelism (got --pp {pp}); use --pp 1 or --framework any")
    if framework == "megatron" and (knobs.get("offload_weights") or 0) > 0:
        raise SpecError("offload-weights: not expressible in Megatron-LM; use --framework any")


MAX_LAYOUT_TEXT = 10_000  # characters: a layout of MAX_LAYERS stages, written out


def stage_counts(flag: str, text: str) -> tuple[int, ...]:
    """Per-stage counts from 'N,NxK,...' (K stages of N) or a Megatron layout string."""
    from planner.model import MAX_LAYERS
    from planner.pipeline_layout import layout_from_string
    text = text.strip()
    if len(text) > MAX_LAYOUT_TEXT:
        raise SpecError(f"{flag}: too long ({len(text):,} characters; at most {MAX_LAYOUT_TEXT:,}): write repeated "
                        "stages as NxK ('3,4x30,3') or (..)*n ('Et|(tt|)*30L')")
    if not text or not text.isascii():  # counts in ASCII digits, as -g takes them (not '٨' or '８')
        raise SpecError(f"{flag}: expected layers per stage such as '3,4x30,3' or a Megatron layout string "
                        f"such as 'Et|(tt|)*30L' in ASCII characters (got {shortened(text)!r})")
    if re.search(r"[tEmL|]", text):
        try:
            counts = layout_from_string(text)
        except SpecError as err:  # its message names the layout already
            raise SpecError(f"{flag}: {str(err).removeprefix('pipeline layout ')}") from None
    else:
        counts = []
        for part in text.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:[x*]\s*(\d+)\s*)?", part)
            if not m:
                raise SpecError(f"{flag}: {shortened(part.strip())!r} is not a count; allowed: N (one stage of N "
                                f"layers) or NxK (K stages of N), comma-separated, e.g. '3,4x30,3'")
            repeat = int(m.group(2) or 1)
            if repeat < 1 or len(counts) + repeat > MAX_LAYERS:
                raise SpecError(f"{flag}: {shortened(part.strip())!r}: a run repeats 1 to {MAX_LAYERS} times in all")
            counts += [int(m.group(1))] * repeat
    if any(c > MAX_LAYERS for c in counts):
        raise SpecError(f"{flag}: a stage holds at most {MAX_LAYERS} layers")
    return tuple(counts)


def refuse_plan_flags_beside_plan_file(plan_file, flags: dict) -> None:
    """`--plan` costs or launches the file's plan: a plan flag given beside it (a value in `flags`,
    flag name -> value, None where not given) is refused, naming the first."""
    given = next((name for name, value in flags.items() if value is not None), None)
    if plan_file is not None and given is not None:
        raise SpecError(f"plan: give either --plan or plan flags (got --plan and --{given.replace('_', '-')})")


def layout_knobs(pipeline_layout: str | None, stage_recompute: str | None, knobs: dict, model) -> dict:
    """--pipeline-layout / --stage-recompute-layers as plan fields (stage_layers, the vpp they
    imply, stage_recompute_layers with full recompute), checked against the pp, vpp and
    recompute flags and the model's layers."""
    if pipeline_layout is None:
        if stage_recompute is not None:
            raise SpecError("stage-recompute-layers: needs --pipeline-layout (the stages it counts)")
        return {}
    from planner.pipeline_layout import layout_string_problems
    layout = stage_counts("pipeline-layout", pipeline_layout)
    if re.search(r"[tEmL|]", pipeline_layout):
        # as stage_counts reads it: a pasted trailing newline was "'L' must come last" beside a
        # layout that, shown stripped, looked right
        problems = layout_string_problems(pipeline_layout.strip(), model.mtp_layers)
        if problems:
            raise SpecError(f"pipeline-layout: as Megatron checks a layout string, {'; '.join(problems)} "
                            f"(got {shortened(pipeline_layout.strip())!r})")
    pp, vpp = knobs.get("pp"), knobs.get("vpp")
    if pp is None:
        raise SpecError("pipeline-layout: give --pp too (the layout's stages are pp·vpp)")
    if pp == 1 and len(layout) > 1:
        raise SpecError(f"pipeline-layout: {len(layout)} stages need pipeline parallelism (got --pp 1)")
    if vpp is None:
        if len(layout) % pp:
            raise SpecError(f"pipeline-layout: {len(layout)} stages is not a multiple of --pp {pp}; give pp·vpp stages")
        vpp = len(layout) // pp
    if len(layout) != pp * vpp:
        raise SpecError(f"pipeline-layout: {len(layout)} stages, but pp·vpp = {pp}·{vpp} = {pp * vpp}")
    if sum(layout) != model.layers:
        raise SpecError(f"pipeline-layout: the stages hold {sum(layout)} layers in all; {model.name} has "
                        f"{model.layers}")
    if any(sum(layout[r::pp]) == 0 for r in range(pp)):
        raise SpecError("pipeline-layout: every pipeline rank needs a layer (a rank's stages are r, r + pp, ...)")
    out = {"stage_layers": layout, "vpp": vpp}
    if stage_recompute is not None:
        recompute = stage_counts("stage-recompute-layers", stage_recompute)
        if len(recompute) != len(layout):
            raise SpecError(f"stage-recompute-layers: {len(recompute)} stages, but --pipeline-layout has {len(layout)}")
        over = next((s for s, (k, n) in enumerate(zip(recompute, layout)) if k > n), None)
        if over is not None:
            raise SpecError(f"stage-recompute-layers: stage {over} recomputes {recompute[over]} of its "
                            f"{layout[over]} layers; at most {layout[over]}")
        if knobs.get("recompute") not in (None, "full"):
            raise SpecError(f"stage-recompute-layers: needs --recompute full (got --recompute {knobs['recompute']})")
        if not any(recompute):
            raise SpecError("stage-recompute-layers: every stage recomputes 0 layers, i.e. no full recompute; "
                            "drop it (or give --recompute none)")
        if knobs.get("recompute_num_layers") is not None:
            raise SpecError("stage-recompute-layers: give it or --recompute-num-layers, not both")
        out.update(stage_recompute_layers=recompute, recompute="full")
    return out


def plan_from_knobs(knobs: dict, gpus: int, global_batch: int, defaults: dict | None = None,
                    seq_length: int | None = None, expert_biases: bool = False, layers: int | None = None):
    """A Plan from given knobs over `defaults`; dp fills the GPUs left by tp·pp·cp. A default
    sequence parallelism stays off where `seq_length` does not split over tp·cp (a rule of the
    model, estimate.RULES sp_seq); one the user asked for is kept, and the rule says why not.
    `expert_biases` (a MoE model with linear biases, GPT-OSS): expert TP defaults to 1, the only
    one Megatron runs such experts at, not to tp; one the user gave is kept and refused later."""
    from planner.plan import make_plan
    refuse_contradictions(knobs, framework="any")
    fields = {**(defaults or {}), **knobs}
    if knobs.get("dp_impl") in SHARDED_DP_STAGES and "zero_stage" not in knobs:
        fields["zero_stage"] = SHARDED_DP_STAGES[knobs["dp_impl"]][0]  # --dp-impl torch-fsdp2 alone: ZeRO-3
    if knobs.get("recompute_modules") is not None and "recompute" not in knobs:
        fields["recompute"] = "selective"  # --recompute-modules alone means selective recompute
    if knobs.get("recompute_num_layers") is not None and "recompute" not in knobs:
        fields["recompute"] = "full"  # and --recompute-num-layers alone full recompute of that many layers
    tp, pp, cp = fields.get("tp", 1), fields.get("pp", 1), fields.get("cp", 1)
    if fields.get("dp") is None:
        if gpus % (tp * pp * cp):
            defaulted = [f"{k} {fields[k]}" for k in ("tp", "pp", "cp") if k not in knobs and k in fields]
            note = f"; {', '.join(defaulted)} by default" if defaulted else ""
            knobs_to_set = [f"--{k}" for k in ("tp", "pp", "cp") if k not in knobs and k in fields] or ["--tp", "--pp",
                                                                                                   "--cp"]
            raise SpecError(f"tp·pp·cp ({tp}·{pp}·{cp}{note}) must divide the GPU count ({gpus}); set "
                            f"{' or '.join(knobs_to_set)} so that it does, or change --gpus")
        fields["dp"] = gpus // (tp * pp * cp)
    if layers and layers > 1 and (fields.get("offload_activations") or 0) > 0:
        # Megatron offloads activations by whole layers: cost the layers it launches, as the search
        # does (0.5 of 27 layers runs 14, 0.519; the plan line shows it)
        from planner.megatron.expressible import megatron_offload_fraction
        fields["offload_activations"] = megatron_offload_fraction(fields["offload_activations"], layers)
    if expert_biases and tp > 1 and "etp" not in knobs:
        fields["etp"] = 1
    if fields.get("sequence_parallel") and tp == 1:
        fields["sequence_parallel"] = False  # Megatron drops SP at tp = 1; so do we
    if fields.get("sequence_parallel") and "sequence_parallel" not in knobs and seq_length \
            and seq_length % (tp * cp):
        fields["sequence_parallel"] = False
    used = tp * pp * cp * fields["dp"]
    if used != gpus:  # before the plan's own checks, which would blame the batch for a wrong dp
        raise SpecError(f"plan: tp·pp·dp·cp = {used} but the system has {gpus} GPUs "
                        "(set --gpus or change the plan)")
    return make_plan(global_batch=global_batch, **fields)


def gpu_count_mismatch(plan, system: SystemSpec, plan_file: str | None, gpus_flag: int | None) -> str:
    """Why a plan's tp·pp·dp·cp is not the system's GPU count, blaming what set each: the plan
    file's own numbers, --gpus beside a plan file (whose dp fixes the count), or the flags."""
    if plan_file and gpus_flag is None:  # the file's own numbers disagree: no flag to blame
        from hardware.errors import read_yaml_mapping
        saved = read_yaml_mapping(Path(plan_file), "plan")
        if "gpus" in saved:
            return (f"plan {plan_file}: tp·pp·dp·cp = {plan.gpus} but the file says gpus: {system.num_gpus}; "
                    "change one of them")
        # (a bare layout has no gpus: field; a saved plan file, with its layout under plan:, has)
        where = f"add gpus: {plan.gpus} to the file or pass" if "plan" in saved else "pass"
        return (f"plan {plan_file}: tp·pp·dp·cp = {plan.gpus}, and the file gives no gpus: the system "
                f"({system.name}) has {system.num_gpus} by default; {where} --gpus {plan.gpus}")
    if plan_file:
        return (f"gpus: the plan {plan_file} runs on tp·pp·dp·cp = {plan.gpus} GPUs, not --gpus {system.num_gpus} "
                f"(a plan file fixes its layout, dp included); give -g {plan.gpus}, or plan for "
                f"{system.num_gpus} with `planner plan -g {system.num_gpus}`")
    return f"plan: tp·pp·dp·cp = {plan.gpus} but the system has {system.num_gpus} GPUs (set --gpus or change the plan)"


def check_job_reserve(job, system: SystemSpec, plan_file, reserve_flag: float | None) -> None:
    """The job's HBM reserve leaves some HBM (constraints.space.check_hbm_reserve), named where the
    user wrote it: the --hbm-reserve-gib flag, else the plan file's job setting."""
    from constraints.space import check_hbm_reserve  # the search layer, only here
    check_hbm_reserve(job, system, f"plan ({plan_file}): job: hbm_reserve_gib"
                      if plan_file and reserve_flag is None else "hbm-reserve-gib")


def given_flags(ctx: typer.Context, drop: tuple[str, ...] = ()) -> list[str]:
    """The options the user gave on the command line (not defaults), in their long form, for a
    command we suggest that repeats them; `drop`: parameter names left out."""
    out: list[str] = []
    for param in ctx.command.params:
        if param.name in drop or not getattr(param, "opts", None):
            continue
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        value, long = ctx.params[param.name], max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            if value:
                out.append(long)
            elif param.secondary_opts:
                out.append(max(param.secondary_opts, key=len))
            continue
        for v in (value if getattr(param, "multiple", False) else [value]):
            out += [long, str(getattr(v, "value", v))]
    return out
