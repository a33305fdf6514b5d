"""A system file (hardware/spec.py SystemSpec) is checked when it is loaded: every number finite,
the network tiers consistent with the nodes and the GPU count, a 16-bit peak to train at. A bad
one is ONE line naming the field and what is allowed, exit 2, no traceback, no numpy warning."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hardware.errors import SpecError
from hardware.load import ACCELERATOR_DIR, PRESET_DIR, load_accelerator, load_system, system_preset_names
from planner.cli.app import app
from tests.conftest import one_line_error

ROOT = Path(__file__).resolve().parents[1]
CUSTOM = ROOT / "examples" / "custom_system.yaml"
INF = float("inf")
runner = CliRunner()


def _system(tmp_path: Path, edit, inline_accelerator: bool = False) -> Path:
    """examples/custom_system.yaml (256 H100, 8 per node, NVLink 8 + IB) with `edit` applied."""
    data = yaml.safe_load(CUSTOM.read_text())
    if inline_accelerator:
        data["accelerator"] = yaml.safe_load((ACCELERATOR_DIR / f"{data['accelerator']}.yaml").read_text())
    edit(data)
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def edit(data):
        node = data
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return edit


def _plan(path: Path, *extra: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a numpy overflow/invalid warning fails the test
        return runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", str(path), "-b", "64", *extra])



# --- 1. every number finite --------------------------------------------------------------------

INFINITE = [  # (edit, inline accelerator, the field the line must name)
    (_set("accelerator", "efficiency", "matmul_half_dim", INF), True, "accelerator.efficiency.matmul_half_dim"),
    (_set("accelerator", "efficiency", "layer_overhead_us", INF), True, "accelerator.efficiency.layer_overhead_us"),
    (_set("accelerator", "efficiency", "attention_half_seq", INF), True, "accelerator.efficiency.attention_half_seq"),
    (_set("accelerator", "efficiency", "attention_half_seq_fa2", INF), True,
     "accelerator.efficiency.attention_half_seq_fa2"),
    (_set("accelerator", "efficiency", "matmul_half_dim_fp8", INF), True, "accelerator.efficiency.matmul_half_dim_fp8"),
    (_set("accelerator", "peak_flops", "bf16", INF), True, "accelerator.peak_flops.bf16"),
    (_set("accelerator", "peak_flops", "fp8", INF), True, "accelerator.peak_flops.fp8"),
    (_set("accelerator", "hbm_capacity_gib", INF), True, "accelerator.hbm_capacity_gib"),
    (_set("accelerator", "hbm_bandwidth_gb_per_s", INF), True, "accelerator.hbm_bandwidth_gb_per_s"),
    (_set("network", 0, "bandwidth_gb_per_s", INF), False, "network.0.bandwidth_gb_per_s"),
    (_set("network", 1, "bandwidth_gb_per_s", INF), False, "network.1.bandwidth_gb_per_s"),
    (_set("network", 1, "latency_us", INF), False, "network.1.latency_us"),
    (_set("offload", "bandwidth_gb_per_s", INF), False, "offload.bandwidth_gb_per_s"),
    (_set("offload", "capacity_gib", INF), False, "offload.capacity_gib"),
]


@pytest.mark.parametrize("edit,inline,field", INFINITE, ids=[f for _, _, f in INFINITE])
def test_infinite_numbers_are_refused(tmp_path, edit, inline, field):
    line = one_line_error(_plan(_system(tmp_path, edit, inline), "-g", "8"))
    assert f": {field}: " in line and "finite" in line, line


@pytest.mark.parametrize("field", ["matmul_half_dim", "layer_overhead_us"])
def test_infinite_numbers_in_an_accelerator_file(tmp_path, field):
    """`accelerator: path.yaml` goes through load_accelerator: the same rule."""
    data = yaml.safe_load((ACCELERATOR_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["efficiency"][field] = INF
    acc = tmp_path / "acc.yaml"
    acc.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=rf"^accelerator \({acc}\): efficiency\.{field}: .*finite"):
        load_accelerator(str(acc))
    line = one_line_error(_plan(_system(tmp_path, _set("accelerator", str(acc))), "-g", "8"))
    assert f"efficiency.{field}" in line


def test_nan_stays_refused(tmp_path):
    """(Refused before too, by the range checks; a guard that the finite rule keeps it so.)"""
    line = one_line_error(_plan(_system(tmp_path, _set("network", 0, "bandwidth_gb_per_s", float("nan"))), "-g", "8"))
    assert "network.0.bandwidth_gb_per_s" in line


# --- 1b. every number within a physical range ------------------------------------------------------
# Finite is not enough: 1e308 or 1e-300 overflowed the cost model (numpy RuntimeWarnings at exit 0,
# exit 1, or "internal error: cannot convert float NaN to integer"). Each number has a generous
# range (hardware/spec.py); the line names the field and the range.

# (path in the system mapping, low, high, the range as the line writes it)
RANGES = [
    (("accelerator", "peak_flops", "bf16"), 1e9, 1e18, "from 1e+09 to 1e+18"),
    (("accelerator", "peak_flops", "fp8"), 1e9, 1e18, "from 1e+09 to 1e+18"),
    (("accelerator", "hbm_capacity_gib"), 1e-3, 1e6, "from 0.001 to 1e+06"),
    (("accelerator", "hbm_bandwidth_gb_per_s"), 1.0, 1e6, "from 1 to 1e+06"),
    (("accelerator", "efficiency", "matmul_half_dim"), 0.0, 1e6, "from 0 to 1e+06"),
    (("accelerator", "efficiency", "matmul_half_dim_fp8"), 0.0, 1e6, "from 0 to 1e+06"),
    (("accelerator", "efficiency", "attention_half_seq"), 0.0, 1e6, "from 0 to 1e+06"),
    (("accelerator", "efficiency", "attention_half_seq_fa2"), 0.0, 1e6, "from 0 to 1e+06"),
    (("accelerator", "efficiency", "layer_overhead_us"), 0.0, 1e6, "from 0 to 1e+06"),
    (("network", 0, "bandwidth_gb_per_s"), 0.01, 1e6, "from 0.01 to 1e+06"),
    (("network", 1, "bandwidth_gb_per_s"), 0.01, 1e6, "from 0.01 to 1e+06"),
    (("network", 0, "latency_us"), 0.0, 1e6, "from 0 to 1e+06"),
    (("network", 1, "latency_us"), 0.0, 1e6, "from 0 to 1e+06"),
    (("offload", "capacity_gib"), 1e-3, 1e9, "from 0.001 to 1e+09"),
    (("offload", "bandwidth_gb_per_s"), 0.01, 1e6, "from 0.01 to 1e+06"),
]
EXTREMES = [(keys, value, text) for keys, low, high, text in RANGES
            for value in ([1e308, 1e-300] if low > 0 else [1e308])]


@pytest.mark.parametrize("keys,value,text", EXTREMES,
                         ids=[f"{'.'.join(map(str, k))}={v:g}" for k, v, _ in EXTREMES])
def test_extreme_finite_numbers_are_refused(tmp_path, keys, value, text):
    line = one_line_error(_plan(_system(tmp_path, _set(*keys, value), inline_accelerator=True), "-g", "8"))
    field = ".".join(map(str, keys))
    assert f": {field}: must be a number {text}, got {value:g}" in line, line


def test_extreme_number_in_an_accelerator_file(tmp_path):
    data = yaml.safe_load((ACCELERATOR_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["hbm_capacity_gib"] = 1e308  # was "internal error: cannot convert float NaN to integer"
    acc = tmp_path / "acc.yaml"
    acc.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=r"hbm_capacity_gib: must be a number from 0\.001 to 1e\+06, got 1e\+308"):
        load_accelerator(str(acc))
    line = one_line_error(_plan(_system(tmp_path, _set("accelerator", str(acc))), "-g", "8"))
    assert "hbm_capacity_gib" in line and "1e+06" in line, line


def _at(edit_values: dict):
    def edit(data):
        for keys, value in edit_values.items():
            _set(*keys, value)(data)
    return edit


_SLOW = ("latency_us", "half_dim", "half_seq", "half_dim_fp8", "half_seq_fa2", "overhead_us")  # larger is slower


def _corner(slow: bool, roomy: bool) -> dict:
    """Every number at one end of its range: the slow or the fast end of each rate, latency and
    efficiency parameter, with the largest or the smallest memories."""
    picks = {}
    for keys, low, high, _ in RANGES:
        if "capacity" in keys[-1]:
            picks[keys] = high if roomy else low
        elif keys[-1].endswith(_SLOW):
            picks[keys] = high if slow else low
        else:
            picks[keys] = low if slow else high
    return picks


CORNERS = {"all-low": {k: lo for k, lo, _, _ in RANGES}, "all-high": {k: hi for k, _, hi, _ in RANGES},
           **{f"{'slow' if slow else 'fast'}-{'roomy' if roomy else 'tiny'}": _corner(slow, roomy)
              for slow in (True, False) for roomy in (True, False)}}


@pytest.mark.parametrize("corner", list(CORNERS))
def test_numbers_at_the_ends_of_their_ranges_are_priced_without_warnings(tmp_path, corner):
    """The bounds are tight enough: a machine at any corner of the ranges is costed (a plan or a
    clean "nothing fits"), no numpy overflow, no internal error."""
    path = _system(tmp_path, _at(CORNERS[corner]), inline_accelerator=True)
    runs = [["plan", "-m", "llama3-8b", "-s", str(path), "-g", "8", "-b", "64", "--hbm-reserve-gib", "0"],
            ["estimate", "-m", "llama3-8b", "-s", str(path), "-g", "16", "--tp", "2", "--pp", "2", "-b", "64",
             "--offload-optimizer", "1", "--offload-activations", "0.5", "--hbm-reserve-gib", "0"]]
    if CORNERS[corner][("accelerator", "hbm_capacity_gib")] > 1:  # with 1 MiB of HBM only the diagnosis runs
        runs.append(["plan", "-m", "llama3-70b", "-s", str(path), "-g", "64", "-b", "256", "--dtype", "fp8",
                     "--hbm-reserve-gib", "0"])
    for args in runs:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any numpy RuntimeWarning fails the run
            result = runner.invoke(app, args)
        assert result.exit_code in (0, 1), (args, result.exit_code, result.output, result.exception)
        assert "Warning" not in result.output and "internal error" not in result.output, result.output


def test_ranges_admit_what_a_sweep_asks_for():
    """`planner sweep` varies HBM and offload up to its MAX_VALUE and models offload_gb_per_s=inf as
    INFINITE_GB_PER_S: every such point must still be a valid system."""
    from planner.sweep import INFINITE_GB_PER_S, MAX_VALUE

    system = load_system("h100-offload-1tib", 8)
    acc = {**system.accelerator.model_dump(), "hbm_capacity_gib": MAX_VALUE["hbm_gib"]}
    tier = {**system.offload.model_dump(), "capacity_gib": MAX_VALUE["offload_gib"],
            "bandwidth_gb_per_s": INFINITE_GB_PER_S}
    grown = system.with_changes(accelerator=acc, offload=tier)
    assert grown.offload.bandwidth_gb_per_s == MAX_VALUE["offload_gb_per_s"] == INFINITE_GB_PER_S
    assert grown.accelerator.hbm_capacity_gib == MAX_VALUE["hbm_gib"]


def test_sweep_to_infinite_offload_bandwidth_and_huge_memory_runs(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = runner.invoke(app, ["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64",
                                     "--vary", "offload_gb_per_s=inf", "--vary", "hbm_gib=1e6", "-j", "1",
                                     "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


def test_presets_sit_inside_the_ranges():
    """Guard: the shipped presets are far inside every range (none at a bound)."""
    for name in system_preset_names():
        data = load_system(name).model_dump()
        for keys, low, high, _ in RANGES:
            node = data
            try:
                for k in keys:
                    node = node[k]
            except (KeyError, IndexError, TypeError):
                continue
            if node is not None:
                assert low <= node <= high, (name, keys, node)


# --- 2. consistency of nodes, network tiers and GPU count ----------------------------------------

def test_nvlink_domain_must_be_whole_nodes_or_divide_a_node(tmp_path):
    line = one_line_error(_plan(_system(tmp_path, _set("gpus_per_node", 3)), "-g", "8"))
    assert "network.0.domain_gpus 8" in line and "gpus_per_node 3" in line and "multiple of 3" in line, line
    line = one_line_error(_plan(_system(tmp_path, _set("network", 0, "domain_gpus", 3)), "-g", "8"))
    assert "network.0.domain_gpus 3" in line and "gpus_per_node 8" in line and "divisor of 8" in line, line
    with pytest.raises(SpecError, match=r"network\.0\.domain_gpus 12 .*gpus_per_node 8"):
        load_system(str(_system(tmp_path, _set("network", 0, "domain_gpus", 12))))


def test_domains_that_fit_nodes_load(tmp_path):
    """NVL72-style (a domain of many 4-GPU trays), a domain of two 8-GPU nodes, NVLink pairs in a
    PCIe box: all fine."""
    assert load_system(str(_system(tmp_path, _set("gpus_per_node", 4)))).nvlink_domain_gpus == 8
    assert load_system(str(_system(tmp_path, _set("network", 0, "domain_gpus", 16)))).nvlink_domain_gpus == 16
    pairs = _system(tmp_path, lambda d: d["network"].insert(
        0, {"name": "nvlink-bridge", "domain_gpus": 2, "bandwidth_gb_per_s": 300, "latency_us": 3}))
    assert [t.domain_gpus for t in load_system(str(pairs)).network] == [2, 8, 1048576]
    # the outermost tier spans everything: its domain_gpus need not fit the nodes
    odd = load_system(str(_system(tmp_path, lambda d: (d.update(gpus_per_node=6),
                                                       d["network"][0].update(domain_gpus=6)))))
    assert odd.network[-1].domain_gpus == 1048576


def test_outermost_tier_must_span_the_system(tmp_path):
    path = _system(tmp_path, _set("network", 1, "domain_gpus", 16))
    line = one_line_error(_plan(path))
    assert "network.1.domain_gpus" in line and "256" in line and ">= 256" in line, line
    with pytest.raises(SpecError, match=r"network\.1\.domain_gpus: .*spans 16 GPUs .* has 256"):
        load_system(str(path))
    # the final system counts: -g 16 makes it a 16-GPU system the tier does span; -g 32 does not
    assert load_system(str(path), 16).num_gpus == 16
    line = one_line_error(_plan(path, "-g", "32"))
    assert "network.1.domain_gpus" in line and ">= 32" in line, line


def test_growing_a_loaded_system_stays_possible():
    """The infeasibility diagnosis prices the model on 2x..64x the GPUs (search.py with_changes),
    past the outermost domain and into partial nodes: the validator must not refuse that."""
    system = load_system("h100-sxm", 1048576)
    assert system.with_changes(num_gpus=64 * 1048576).num_gpus == 64 * 1048576
    assert load_system("h100-sxm", 6).with_changes(num_gpus=12).num_gpus == 12


def test_partial_and_sub_node_systems_are_allowed(tmp_path):
    """num_gpus is the job's GPUs: fewer than a node (published runs use 1-4 GPUs of an 8-GPU
    node) or a partial last node (12 of 8-GPU nodes) is modelled; torchrun cannot launch the
    latter, which `planner megatron` says (megatron/expressible.py launch_problems)."""
    assert load_system(str(_system(tmp_path, _set("gpus_per_node", 512)))).gpus_per_node == 512
    twelve = _system(tmp_path, _set("num_gpus", 12))
    assert load_system(str(twelve)).num_gpus == 12
    result = runner.invoke(app, ["megatron", "-m", "llama3-8b", "-s", str(twelve), "-b", "64"])
    assert result.exit_code != 0 and "not a whole number of 8-GPU nodes" in result.output, result.output


def test_sweep_of_an_impossible_nvlink_domain_is_one_line(tmp_path):
    result = runner.invoke(app, ["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--vary",
                                 "nvlink_domain=12", "-j", "1", "--out", str(tmp_path / "out")])
    line = one_line_error(result)
    assert "nvlink_domain=12" in line and "domain_gpus 12" in line and "gpus_per_node 8" in line, line


# --- 3. a 16-bit peak to train at ---------------------------------------------------------------

@pytest.mark.parametrize("peaks", [{}, {"fp32": 60e12, "fp8": 1e15}])
def test_peak_flops_needs_a_16_bit_peak(tmp_path, peaks):
    line = one_line_error(_plan(_system(tmp_path, _set("accelerator", "peak_flops", peaks), True), "-g", "8"))
    assert "accelerator.peak_flops:" in line and "bf16 or fp16" in line, line
    assert "dtype" not in line, line


def test_fp16_only_accelerator_loads():
    assert set(load_system("dgx2-v100").accelerator.peak_flops) == {"fp32", "fp16"}


# --- every built-in preset still loads ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(p.stem for p in ACCELERATOR_DIR.glob("*.yaml")))
def test_every_accelerator_preset_loads(name):
    assert load_accelerator(name).peak_flops


@pytest.mark.parametrize("name", system_preset_names())
def test_every_system_preset_loads(name):
    system = load_system(name)
    assert system.network[-1].domain_gpus >= system.num_gpus
    assert load_system(name, 8).num_gpus == 8
    assert name in {p.stem for p in PRESET_DIR.glob("*.yaml")}


def test_example_system_loads():
    assert load_system(str(CUSTOM)).num_gpus == 256



@pytest.mark.parametrize("key,words", [("null", "key null: YAML reads it as null"), ("3", "key 3: YAML reads it as a number"),
                                       ("moe:\n  true", "key moe.true: YAML reads it as a boolean")])
def test_a_key_yaml_does_not_read_as_a_name_is_named_as_written(tmp_path, key, words):
    """`null: 2` had said 'None: Keys should be strings' (input audit): the key as the user wrote it."""
    path = tmp_path / "m.yaml"
    path.write_text(f"name: x\nlayers: 2\nhidden: 256\nheads: 4\nseq_length: 512\nvocab: 1000\n{key}: 2\n")
    one_line_error(CliRunner().invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"]), words, "quote it")


def test_malformed_yaml_says_what_the_parser_found(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("? [a, b]\n: 1\n")
    one_line_error(CliRunner().invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"]),
                   "malformed YAML at line 1: found unhashable key")
