"""Knob domains: NVLink cap on tensor parallelism, HBM reserve sanity."""
import pytest

from constraints.space import build_space
from hardware import load_system
from hardware.errors import SpecError
from planner.model import load_model
from planner.plan import JobSpec


def test_tp_stays_inside_the_nvlink_domain_unless_allowed():
    model, system = load_model("gpt3-175b"), load_system("h100-sxm", 256)
    assert max(build_space(model, system, JobSpec()).domains["tp"]) == 8
    wide = build_space(model, system, JobSpec(tp_within_nvlink=False)).domains["tp"]
    assert 16 in wide and 32 in wide
    nvl32 = build_space(model, load_system("gh200", 256), JobSpec()).domains["tp"]
    assert max(nvl32) == 32


def test_tp_pin_beyond_nvlink_says_how_to_allow_it():
    model, system = load_model("gpt3-175b"), load_system("h100-sxm", 256)
    with pytest.raises(SpecError, match="--tp-across-nodes"):
        build_space(model, system, JobSpec(pins={"tp": 16}))


def test_reserve_larger_than_hbm_is_an_input_error():
    with pytest.raises(SpecError, match="hbm-reserve-gib"):
        build_space(load_model("llama3-8b"), load_system("h100-sxm", 8), JobSpec(hbm_reserve_gib=80))


def test_long_sequences_search_context_parallel_beyond_eight():
    """cp > 8 only where each CP rank keeps >= 8K tokens (Llama 3 405B: cp 16 at 128K)."""
    system = load_system("h100-sxm", 16384)
    short = build_space(load_model("llama3-405b"), system, JobSpec(global_batch=2048)).domains["cp"]
    assert short == (1, 2, 4, 8)
    long_cp = build_space(load_model("llama3-405b", {"seq_length": 131072}), system,
                          JobSpec(global_batch=128)).domains["cp"]
    assert long_cp == (1, 2, 4, 8, 16)
    million = build_space(load_model("llama3-8b", {"seq_length": 1048576}), load_system("h100-sxm", 1024),
                          JobSpec(global_batch=4)).domains["cp"]
    assert max(million) == 128 and 32 in million


def test_any_legal_context_split_may_be_pinned():
    model = load_model("llama3-8b")  # seq 8192: 16 is legal (8192 % 32 == 0), not searched
    space = build_space(model, load_system("h100-sxm", 64), JobSpec(global_batch=64, pins={"cp": 16}))
    assert space.domains["cp"] == (16,)
    with pytest.raises(SpecError, match=r"pin cp: 3 needs the sequence \(8192\) to be a multiple of 2·cp \(6\)"):
        build_space(model, load_system("h100-sxm", 96), JobSpec(global_batch=64, pins={"cp": 3}))
