"""Collective-communication times (seconds), vectorised over groups.

Ring algorithms (Thakur, Rabenseifner & Gropp 2005; NCCL's "bus bandwidth" convention): an
all-reduce of B bytes over n ranks moves 2(n−1)/n·B per rank in 2(n−1) steps; reduce-scatter
and all-gather move (n−1)/n·B in n−1 steps; all-to-all moves (n−1)/n·B. The bandwidth of a group
is that of the slowest network tier it spans (Megatron rank order tp → cp → ep/dp → pp).
"""
from __future__ import annotations

import numpy as np

from hardware.spec import SystemSpec


def tier_for_span(system: SystemSpec, span_gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth bytes/s per GPU, latency s) of the tier a group spanning `span_gpus` ranks uses."""
    span = np.asarray(span_gpus, dtype=np.float64)
    bw = np.full(span.shape, system.network[-1].bandwidth_bytes_per_s)
    lat = np.full(span.shape, system.network[-1].latency_s)
    for tier in reversed(system.network[:-1]):
        inside = span <= tier.domain_gpus
        bw = np.where(inside, tier.bandwidth_bytes_per_s, bw)
        lat = np.where(inside, tier.latency_s, lat)
    return bw, lat


def all_reduce_s(nbytes, n, bw, lat):
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, 2.0 * (n - 1) / n * nbytes / bw + 2.0 * (n - 1) * lat, 0.0)


def reduce_scatter_s(nbytes, n, bw, lat):
    """Also the all-gather time (same traffic, reversed)."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, (n - 1) / n * nbytes / bw + (n - 1) * lat, 0.0)


all_gather_s = reduce_scatter_s
all_to_all_s = reduce_scatter_s


def p2p_s(nbytes, bw, lat):
    return nbytes / bw + lat
