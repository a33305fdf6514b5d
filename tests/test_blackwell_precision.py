"""New systems and precisions: datasheet peaks per dtype, NVL72 domains, Hopper refusing block-scaled
formats, the quantisation-pass cost term against hand arithmetic, and where TP goes on NVL72."""
import pytest
from typer.testing import CliRunner

from hardware import load_system
from hardware.errors import SpecError
from planner.analytical import PlanArrays, estimate
from planner.analytical.precision import QUANTISE_BYTES_PER_ELEMENT
from planner.analytical.time import layer_compute_fwd_s
from planner.cli import app
from planner.fit import BOUNDS, FIT_GROUPS, fit_groups
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.search import plan as search_plan
from tests.conftest import one_line_error

runner = CliRunner()


@pytest.mark.parametrize("preset,dtype,flops", [
    # GB200 NVL72 page: per 72 GPUs BF16 360 PF, FP8 720 PF, FP4 1,440 PF, with sparsity (dense = half)
    ("gb200-nvl72", "bf16", 360e15 / 72 / 2), ("gb200-nvl72", "fp8", 720e15 / 72 / 2),
    ("gb200-nvl72", "mxfp8", 720e15 / 72 / 2), ("gb200-nvl72", "nvfp4", 1440e15 / 72 / 2),
    # GB300 NVL72 page: FP4 1,080 PF dense per 72 GPUs; FP8 720 PF and BF16 360 PF with sparsity
    ("gb300-nvl72", "nvfp4", 1080e15 / 72), ("gb300-nvl72", "fp8", 720e15 / 72 / 2),
    # DGX B300: 72 PF FP8 (sparse) per 8 GPUs; HGX B300 FP4 108 PF dense per 8 GPUs
    ("b300", "fp8", 72e15 / 8 / 2), ("b300", "nvfp4", 108e15 / 8), ("b300", "bf16", 72e15 / 8 / 4),
])
def test_datasheet_peaks(preset, dtype, flops):
    assert load_system(preset).accelerator.peak(dtype) == pytest.approx(flops)


def test_nvl72_domain_and_bandwidth():
    for preset, hbm_gib in (("gb200-nvl72", 184.0), ("gb300-nvl72", 277.5)):
        s = load_system(preset)
        assert s.nvlink_domain_gpus == 72
        assert s.network[0].bandwidth_gb_per_s == 1800 / 2      # 1.8 TB/s per GPU, both directions
        assert s.accelerator.hbm_bandwidth_gb_per_s == pytest.approx(576e3 / 72)  # 576 TB/s per rack
        assert s.accelerator.hbm_capacity_gib == hbm_gib
    assert load_system("b300").nvlink_domain_gpus == 8


@pytest.mark.parametrize("dtype", ["mxfp8", "nvfp4"])
def test_hopper_has_no_block_scaled_formats(dtype):
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    with pytest.raises(SpecError, match=f"dtype: H100-SXM5-80GB has no {dtype} GEMM peak; allowed on it: bf16, fp16, fp8"):
        estimate(model, system, Plan(dp=8, global_batch=8), JobSpec(dtype=dtype))
    result = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--tp", "1", "--pp", "1",
                                 "-b", "8", "--dtype", dtype])
    one_line_error(result, dtype)


def test_fp8_current_scaling_costs_one_more_read_pass():
    """fp8-cs minus fp8 = one 2-byte read of every quantised element (hand count for Llama-3 8B)."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    P = PlanArrays.from_plans([Plan(tp=2, dp=4, global_batch=4, sequence_parallel=True)], model.layers)
    ew = {d: float(layer_compute_fwd_s(model, system, JobSpec(dtype=d), P)["elementwise"][0]) for d in ("fp8", "fp8-cs", "bf16")}
    h, kv, ffn = 4096, 1024, 14336
    qkv_w, mlp_w = h + 2 * kv, 2 * ffn
    elements = (h + h) + (qkv_w + h) + (h + ffn) + (mlp_w + h)    # forward inputs + backward output grads
    tokens_per_gpu_shard = model.seq_length / 2                   # micro-batch 1, tp 2
    hbm = system.accelerator.hbm_bandwidth_bytes_per_s * system.accelerator.efficiency.hbm_efficiency
    per_pass_s = tokens_per_gpu_shard * elements / 3 / hbm        # a third is charged to the forward
    assert ew["fp8-cs"] - ew["fp8"] == pytest.approx(2.0 * per_pass_s, rel=1e-9)
    assert ew["fp8"] - ew["bf16"] == pytest.approx(QUANTISE_BYTES_PER_ELEMENT["fp8"] * per_pass_s, rel=1e-9)


@pytest.mark.parametrize("preset", ["gb200-nvl72", "b200", "b300", "gb300-nvl72"])
def test_per_tensor_fp8_on_blackwell_writes_no_transposed_copy(preset):
    """On Blackwell (FP8 GEMMs in any layout) Transformer Engine's per-tensor casts write one 8-bit
    copy, not a row-wise one and its transpose (quantizer.cpp: no transpose where
    is_non_tn_fp8_gemm_supported): fp8 delayed 2 + 1 B, fp8-cs 2 + 2 + 1 B per quantised element,
    against mxfp8's 2 + 1 + 1 + 2/32 B (its scales run along one direction: both copies stay).
    Hand count for Llama-3 8B, tp 2, micro-batch 1."""
    model, system = load_model("llama3-8b"), load_system(preset, 8)
    P = PlanArrays.from_plans([Plan(tp=2, dp=4, global_batch=4, sequence_parallel=True)], model.layers)
    ew = {d: float(layer_compute_fwd_s(model, system, JobSpec(dtype=d), P)["elementwise"][0])
          for d in ("bf16", "fp8", "fp8-cs", "mxfp8")}
    h, kv, ffn = 4096, 1024, 14336
    elements = (h + h) + (h + 2 * kv + h) + (h + ffn) + (2 * ffn + h)
    hbm = system.accelerator.hbm_bandwidth_bytes_per_s * system.accelerator.efficiency.hbm_efficiency
    per_byte_s = model.seq_length / 2 * elements / 3 / hbm
    assert ew["fp8"] - ew["bf16"] == pytest.approx((2 + 1) * per_byte_s, rel=1e-9)
    assert ew["fp8-cs"] - ew["bf16"] == pytest.approx((2 + 2 + 1) * per_byte_s, rel=1e-9)
    assert ew["mxfp8"] - ew["bf16"] == pytest.approx((2 + 1 + 1 + 2 / 32) * per_byte_s, rel=1e-9)


def test_which_gpus_take_fp8_gemms_in_any_layout():
    """Transformer Engine's is_non_tn_fp8_gemm_supported: compute capability 10.x-11.x or 13.0 up;
    Hopper and Ampere are TN-only, and so is a GPU the name does not tell (assumed Hopper)."""
    from hardware.arch import non_tn_fp8_gemm
    acc = load_system("h100-sxm").accelerator
    assert not non_tn_fp8_gemm(acc)
    assert [non_tn_fp8_gemm(load_system(p).accelerator) for p in ("b200", "gb200-nvl72", "b300", "gb300-nvl72")] \
        == [True] * 4
    assert not non_tn_fp8_gemm(load_system("a100-80g").accelerator)
    for cc, takes_any in ((10.0, True), (10.3, True), (11.0, True), (12.0, False), (12.1, False), (13.0, True)):
        assert non_tn_fp8_gemm(acc.model_copy(update={"compute_capability": cc})) is takes_any
    named = acc.model_copy(update={"compute_capability": None})
    assert non_tn_fp8_gemm(named.model_copy(update={"name": "B200-custom"}))
    assert not non_tn_fp8_gemm(named.model_copy(update={"name": "my-accelerator"}))


def test_fp8_block_scaling_costs_its_tile_scales():
    """fp8-block (DeepSeek-V3 1x128 tiles) minus fp8 delayed = a 4-byte fp32 scale per 128 elements,
    row- and column-wise: 8/128 B per quantised element, hand count for Llama-3 8B on Hopper; its
    GEMMs run at the FP8 peak like the per-tensor recipes (the forward GEMM time equals fp8's)."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    P = PlanArrays.from_plans([Plan(tp=2, dp=4, global_batch=4, sequence_parallel=True)], model.layers)
    fwd = {d: layer_compute_fwd_s(model, system, JobSpec(dtype=d), P) for d in ("fp8", "fp8-block")}
    h, kv, ffn = 4096, 1024, 14336
    elements = (h + h) + (h + 2 * kv + h) + (h + ffn) + (2 * ffn + h)
    hbm = system.accelerator.hbm_bandwidth_bytes_per_s * system.accelerator.efficiency.hbm_efficiency
    per_byte_s = model.seq_length / 2 * elements / 3 / hbm
    extra = float(fwd["fp8-block"]["elementwise"][0] - fwd["fp8"]["elementwise"][0])
    assert extra == pytest.approx(2 * 4.0 / 128 * per_byte_s, rel=1e-9)
    assert float(fwd["fp8-block"]["gemm"][0]) == float(fwd["fp8"]["gemm"][0])


def test_nvfp4_gemms_twice_as_fast_as_mxfp8_on_gb200():
    model, system = load_model("llama3-70b"), load_system("gb200-nvl72", 8)
    P = PlanArrays.from_plans([Plan(tp=8, global_batch=1, sequence_parallel=True)], model.layers)
    g = {d: float(layer_compute_fwd_s(model, system, JobSpec(dtype=d), P)["gemm"][0]) for d in ("mxfp8", "nvfp4", "fp8")}
    assert g["mxfp8"] / g["nvfp4"] == pytest.approx(2.0)            # 10 PF vs 5 PF, same GEMM curve
    assert g["mxfp8"] == pytest.approx(g["fp8"])                    # block-scaled MMA at the FP8 rate


def test_llama3_70b_on_two_nvl72_racks_keeps_tp_inside_the_domain():
    model, system = load_model("llama3-70b"), load_system("gb200-nvl72", 144)
    best = search_plan(model, system, JobSpec(global_batch=288), top_k=3).best
    assert best is not None and best.plan.tp <= 72 and best.plan.gpus == 144
    # tp 16 is allowed on NVL72 (inside the 72-GPU domain) and not on an 8-GPU DGX B200
    pinned = JobSpec(global_batch=288, pins={"tp": 16})
    assert search_plan(model, system, pinned, top_k=1).best is not None
    with pytest.raises(SpecError, match="8-GPU NVLink domain"):
        search_plan(model, load_system("b200", 144), pinned, top_k=1)


@pytest.fixture(scope="module")
def fitted(prepared_reference):
    return fit_groups(prepared_reference)


def test_calibrate_reproduces_the_presets(fitted, prepared_reference):
    """bench/calibrate.py's fit (planner/fit.py) gives the parameters written in the presets, the
    hardware fit and the torch-stack fit on top of it (check_torch_stack_presets)."""
    for group, (params, _, rows) in fitted.items():
        assert rows > 0, group
        for member in FIT_GROUPS[group]:
            preset = {"A100-SXM4-80GB": "a100-80g", "H100-SXM5-80GB": "h100-sxm", "B200-180GB": "b200",
                      "GB200-186GB": "gb200-nvl72", "A100-SXM4-40GB": "a100-40g", "H200-SXM-141GB": "h200",
                      "GH200-96GB": "gh200", "H100-GT-96GB": "h100-grand-teton", "B300-288GB": "b300",
                      "GB300-288GB": "gb300-nvl72", "H800-SXM5-80GB": "h800", "A800-SXM4-80GB": "a800-80g",
                      "V100-SXM3-32GB": "dgx2-v100"}[member]
            eff = load_system(preset).accelerator.efficiency
            for name, value in params.items():
                assert getattr(eff, name) == pytest.approx(value, rel=0.01, abs=1.0 if "dim" in name or "us" in name else 0.002), (member, name)
                lo, hi = BOUNDS[name]
                assert lo <= value <= hi
                if name in ("matmul_max", "matmul_max_fp8", "attention_max", "hbm_efficiency"):
                    assert 0 < value <= 1
    check_torch_stack_presets(fitted, prepared_reference)


def test_presets_lists_the_new_systems_with_sources():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0, result.output
    for name, url in (("gb200-nvl72", "nvidia.com/en-us/data-center/gb200-nvl72"),
                      ("gb300-nvl72", "nvidia.com/en-us/data-center/gb300-nvl72"),
                      ("b300", "nvidia.com/en-us/data-center/dgx-b300"), ("h100-grand-teton", "2410.06511")):
        line = next(ln for ln in result.output.splitlines() if ln.startswith(f"{name}:"))
        assert url in line
    assert "nvfp4" in next(ln for ln in result.output.splitlines() if ln.startswith("gb300-nvl72:"))


def check_torch_stack_presets(fitted, prepared_reference):
    """bench/calibrate.py's torch-stack fit (planner/fit.py fit_torch_stack, on top of the hardware
    fit) gives the per-accelerator fields written in the presets, the A100's torch-era GEMM ceiling
    among them: above the Megatron rows' ceiling, below 1. Run by the hardware-fit test on the same
    fit: two tests on two workers had each refitted it."""
    from hardware.load import load_accelerator
    from planner.fit import fit_torch_stack
    stack = fit_torch_stack(prepared_reference, {g: v[0] for g, v in fitted.items()})
    for stem, name in (("a100-sxm4-80gb", "A100-SXM4-80GB"), ("h100-sxm5-80gb", "H100-SXM5-80GB")):
        eff = load_accelerator(stem).efficiency
        for field in ("attention_max_fa2", "attention_max_triton", "matmul_max_torch"):
            assert getattr(eff, field) == pytest.approx(stack[name].get(field), abs=0.002), (name, field)
    a100 = load_accelerator("a100-sxm4-80gb").efficiency
    assert a100.matmul_max < a100.matmul_max_torch < 1.0


def test_dtype_error_lists_what_this_gpu_trains_in():
    """The allowed list is the training precisions this GPU has the peaks for (not its peak table's
    keys: fp32/tf32 are no job dtype, fp8-cs/fp8-block run at the fp8 peak); NVIDIA's upper case is read."""
    result = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--dtype", "mxfp8"])
    one_line_error(result, "dtype", "allowed on it: bf16, fp16, fp8, fp8-cs, fp8-block")
    upper = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "b200", "-g", "8", "--tp", "1", "--pp", "1",
                                "-b", "8", "--dtype", "MXFP8", "--json"])
    assert upper.exit_code == 0, upper.output
    assert '"mxfp8"' in upper.stdout


def test_nvfp4_reads_its_input_three_times_amax_rotated_amax_and_cast():
    """nvfp4 minus mxfp8, per quantised element (hand count for Llama-3 8B on GB200): nvfp4 reads
    the 16-bit input for its per-tensor amax, again for the amax of the Hadamard-rotated wgrad copy
    (arXiv:2509.25149 §4) and once to cast, and writes two 4-bit copies with an E4M3 scale per 16
    each (2+2+2 + 0.5+0.5 + 2/16 B); mxfp8 reads once and writes two 8-bit copies with an E8M0 scale
    per 32 (2 + 1+1 + 2/32 B)."""
    model, system = load_model("llama3-8b"), load_system("gb200-nvl72", 8)
    P = PlanArrays.from_plans([Plan(tp=2, dp=4, global_batch=4, sequence_parallel=True)], model.layers)
    ew = {d: float(layer_compute_fwd_s(model, system, JobSpec(dtype=d), P)["elementwise"][0]) for d in ("mxfp8", "nvfp4")}
    h, kv, ffn = 4096, 1024, 14336
    elements = (h + h) + (h + 2 * kv + h) + (h + ffn) + (2 * ffn + h)
    hbm = system.accelerator.hbm_bandwidth_bytes_per_s * system.accelerator.efficiency.hbm_efficiency
    per_byte_s = model.seq_length / 2 * elements / 3 / hbm
    nvfp4, mxfp8 = 2 + 2 + 2 + 0.5 + 0.5 + 2 / 16, 2 + 1 + 1 + 2 / 32
    assert ew["nvfp4"] - ew["mxfp8"] == pytest.approx((nvfp4 - mxfp8) * per_byte_s, rel=1e-9)
