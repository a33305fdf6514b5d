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
