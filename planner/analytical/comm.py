"""Collective-communication times (seconds), vectorised over groups.

Ring algorithms (Thakur, Rabenseifner & Gropp 2005; NCCL's "bus bandwidth" convention): an
all-reduce of B bytes over n ranks moves 2(n−1)/n·B per rank in 2(n−1) steps; reduce-scatter
and all-gather move (n−1)/n·B in n−1 steps; all-to-all moves (n−1)/n·B. The bandwidth of a group
comes from the network tiers it spans (see group_link).
"""
from __future__ import annotations

import numpy as np

from hardware.spec import SystemSpec


# group_link's answers for small inputs, by the network tiers and the inputs' values: the fit
# (planner/fit.py) costs the same few plans thousands of times with only the GPU efficiencies
# changed, ~5 calls of ~40 us each per step_time, the same every time; the key takes ~4 us.
# Large inputs (the search's 10^4-row chunks) are not kept: they seldom repeat.
_SMALL_INPUT = 256
_LINKS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
_LINKS_KEPT = 4096


def group_link(system: SystemSpec, size, stride) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth bytes/s per GPU, latency s) for a collective over `size` ranks spaced `stride`
    apart (Megatron rank order tp → cp → ep/dp → pp); small inputs answered from `_LINKS`
    (copies: a caller may write into them)."""
    size, stride = np.asarray(size, dtype=np.float64), np.asarray(stride, dtype=np.float64)
    if size.size + stride.size > _SMALL_INPUT:
        return _group_link(system, size, stride)
    key = (tuple((t.domain_gpus, t.bandwidth_bytes_per_s, t.latency_s) for t in system.network), system.gpus_per_node,
           size.shape, size.tobytes(), stride.shape, stride.tobytes())
    kept = _LINKS.get(key)
    if kept is None:
        if len(_LINKS) >= _LINKS_KEPT:
            _LINKS.clear()
        kept = _LINKS[key] = _group_link(system, size, stride)
    return kept[0].copy(), kept[1].copy()


def _group_link(system: SystemSpec, size, stride) -> tuple[np.ndarray, np.ndarray]:
    """group_link, computed.

    A group inside one tier's domain runs at that tier. A group crossing a domain runs one ring
    channel per member it has inside the domain, each through that member's own link (NCCL
    rings over rail-optimised NICs): k members per domain give k× the outer per-GPU bandwidth,
    never more than the inner tier's."""
    # (size and stride broadcast in the arithmetic; np.minimum/np.maximum are np.clip without its
    # per-call overhead: the fit calls this ~10^5 times on a few rows each)
    size, stride = np.asarray(size, dtype=np.float64), np.asarray(stride, dtype=np.float64)
    span = size * stride
    inner = system.network[0]
    bw = np.full(span.shape, inner.bandwidth_bytes_per_s)
    lat = np.full(span.shape, inner.latency_s)
    for prev, tier in zip(system.network[:-1], system.network[1:]):
        crosses = span > prev.domain_gpus
        members_inside = np.minimum(np.maximum(prev.domain_gpus / stride, 1.0), size)
        misaligned, whole = _straddles_node_fabric(system, prev.domain_gpus, span)
        if misaligned.any():
            # the worst straddling group's smallest piece in one domain: gcd(domain, span) ranks
            piece = np.gcd(prev.domain_gpus, whole) / stride
            members_inside = np.where(misaligned, np.minimum(np.maximum(piece, 1.0), size), members_inside)
            crosses = crosses | misaligned
        bw = np.where(crosses, np.minimum(bw, members_inside * tier.bandwidth_bytes_per_s), bw)
        lat = np.where(crosses, tier.latency_s, lat)
    return bw, lat


def _straddles_node_fabric(system: SystemSpec, domain_gpus: int, span) -> tuple[np.ndarray, np.ndarray | None]:
    """(whether some group of `span` consecutive ranks straddles two domains of `domain_gpus`
    although it fits in one, the spans as integers or None where no group can). Only a node's own
    fabric (a domain of at most one node): groups tile the ranks from 0, so a span that does not
    divide it puts a group across two (tp 6 in 8-GPU nodes: ranks 6-11). Multi-node domains (NVL72)
    are allocated in node segments a group aligns with (SystemSpec.inside_nvlink, the scalar rule)."""
    span = np.asarray(span, dtype=np.float64)
    if domain_gpus > system.gpus_per_node:
        return np.zeros(span.shape, dtype=bool), None
    whole = np.maximum(np.rint(span), 1.0).astype(np.int64)
    return (span <= domain_gpus) & (domain_gpus % whole != 0), whole


def group_link_crosses_nvlink(system: SystemSpec, size) -> np.ndarray:
    """Whether a group of `size` consecutive ranks leaves the NVLink domain for some of its
    members (SystemSpec.inside_nvlink, vectorised)."""
    size = np.asarray(size, dtype=np.float64)
    return (size > system.nvlink_domain_gpus) | _straddles_node_fabric(system, system.nvlink_domain_gpus, size)[0]


def all_reduce_s(nbytes, n, bw, lat):
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, 2.0 * (n - 1) / n * nbytes / bw + 2.0 * (n - 1) * lat, 0.0)


def reduce_scatter_s(nbytes, n, bw, lat):
    """Also the all-gather time (same traffic, reversed)."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 1, (n - 1) / n * nbytes / bw + (n - 1) * lat, 0.0)


all_gather_s = reduce_scatter_s
all_to_all_s = reduce_scatter_s


def all_to_all_placed_s(system: SystemSpec, nbytes, n, stride, efficiency: float = 1.0, outer_bytes=None):
    """All-to-all of `nbytes` per rank over `n` ranks spaced `stride` apart, placed on the links:
    each rank keeps 1/n, sends to the k−1 peers inside its innermost domain over that tier and to
    the n−k others through its OWN outer link (every GPU has its NIC: no ring channels to borrow,
    unlike `group_link`), both at once; `efficiency` is the all-to-all's achieved fraction of
    the links' (already derated) bandwidth. Latency: one step per peer, as the ring forms.
    `outer_bytes` overrides what leaves the domain (a deduplicating dispatcher sends less)."""
    nbytes, n, stride = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (nbytes, n, stride)))
    inner = system.network[0]
    span = n * stride
    k = np.clip(inner.domain_gpus / stride, 1.0, n)
    inside = nbytes * (k - 1) / n / (inner.bandwidth_bytes_per_s * efficiency)
    t = inside
    lat = np.full(n.shape, inner.latency_s)
    for prev, tier in zip(system.network[:-1], system.network[1:]):
        crosses = span > prev.domain_gpus
        k_prev = np.clip(prev.domain_gpus / stride, 1.0, n)
        out_b = nbytes * (n - k_prev) / n if outer_bytes is None else outer_bytes
        outside = out_b / (tier.bandwidth_bytes_per_s * efficiency)
        t = np.where(crosses, np.maximum(t, outside), t)
        lat = np.where(crosses, tier.latency_s, lat)
    return np.where(n > 1, t + (n - 1) * lat, 0.0)


def p2p_s(nbytes, bw, lat):
    return nbytes / bw + lat
