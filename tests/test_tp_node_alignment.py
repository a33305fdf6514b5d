"""Tensor-parallel groups that straddle two 8-GPU nodes: with ranks filling nodes in order, tp 6
puts ranks 6-11 in one group across the node boundary. The search kept such layouts "inside the
NVLink domain" (tp <= 8) and costed their all-reduces at NVLink speed (an independent audit found
a tp 6 plan answered for GPT-3 on 96 A100-40GB). Now a node's own fabric holds a group only if the
group divides it; NVL72 racks, allocated in node segments, keep any group up to 72."""
from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from constraints.space import knob_domains
from hardware import load_system
from planner.analytical import comm
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec
from tests.conftest import one_line_error


def test_a_group_that_does_not_divide_a_node_crosses_it():
    dgx = load_system("a100-40g", 96)
    assert [dgx.inside_nvlink(t) for t in (1, 2, 4, 6, 8, 12)] == [True, True, True, False, True, False]
    nvlink_bw, _ = comm.group_link(dgx, 8, 1)
    bw6, lat6 = comm.group_link(dgx, 6, 1)
    ib = dgx.network[1]
    # the worst tp 6 group has gcd(8, 6) = 2 ranks in one node: 2 rings over the NICs
    assert float(bw6) == min(float(nvlink_bw), 2 * ib.bandwidth_bytes_per_s) < float(nvlink_bw)
    assert float(lat6) == ib.latency_s
    assert list(comm.group_link_crosses_nvlink(dgx, np.array([4, 6, 8, 16]))) == [False, True, False, True]
    rack = load_system("gb200-nvl72", 144)  # 72 GPUs of 4-GPU trays: segments align any group
    assert rack.inside_nvlink(6) and rack.inside_nvlink(16) and not rack.inside_nvlink(96)


def test_the_search_keeps_tp_to_divisors_of_the_node_unless_told_otherwise():
    model, system = load_model("gpt3-175b"), load_system("a100-40g", 96)
    assert 6 not in knob_domains(model, system, JobSpec(global_batch=256))["tp"]
    assert 6 in knob_domains(model, system, JobSpec(global_batch=256, tp_within_nvlink=False))["tp"]
    assert 6 in knob_domains(model, load_system("gb200-nvl72", 96), JobSpec(global_batch=256))["tp"]


def test_a_pinned_tp_that_straddles_nodes_is_refused_saying_why():
    line = one_line_error(CliRunner().invoke(app, ["plan", "-m", "gpt3-175b", "-s", "a100-40g", "-g", "96",
                                                   "-b", "256", "--tp", "6"]), "tp")
    assert "tp 6 puts a group across two nodes" in line and "--tp-across-nodes" in line
