"""Exposed time of activation offload to a host memory tier, as Transformer Engine schedules it.

Megatron-LM's --cpu-offloading-num-layers N hands N and the block's layer count L to Transformer
Engine's get_cpu_offload_context (megatron/core/transformer/transformer_block.py; megatron-core
0.19.2). TE (transformer_engine/pytorch/cpu_offload.py, OffloadSynchronizer
._default_offload_sync_init) offloads layers 0..N-1 (never the last: N <= L - 1) on one copy
stream and fixes two deadlines per offloaded layer i:
  - its copy out must have finished when layer L - N + i starts its forward;
  - its copy back starts when layer L - 1 - N + i starts its backward and must have finished
    when layer i's backward starts.
Copies are sequential on that stream and start when their layer's forward has produced the
tensors (out) or at the reload point (back). With uniform layers (forward t_c per layer, copy
t_x per layer), the largest lateness over the layers is

    exposed = max(0, N·t_x − (L − 2)·t_c, t_x − (L − N − 1)·t_c)      for N <= L − 2

(the first term when the link is slower than a layer's compute and the copies queue up; the
second when one copy outlasts the slack between its layer and its deadline; a stall delays all
later layers by the same amount, so the largest lateness is the time added). With N = L − 1 each
copy's deadline is the very next layer, which cannot start before it: every copy is exposed,
exposed = N·t_x. tests/test_grace_offload.py checks both against an event-by-event simulation of
the schedule. N is Megatron's whole-layer count, ceil(f·L) capped at L − 1
(planner.megatron.expressible.cpu_offload_layers, the launch `planner megatron` emits). The backward has the
same form with the backward time per layer, the reloads running in the other link direction
(host-to-device) while the forward's copies ran device-to-host: the tier bandwidth is per
direction. TE's `double_buffering` and `offload_weights` arguments are deprecated no-ops there
(weights are never offloaded), which is why Megatron's weight offload is not expressible.
"""
from __future__ import annotations

import numpy as np


def offloaded_layers(fraction: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """Whole layers whose activations go to the host: the plan's fraction of the rank's layers
    rounded up, at most all but the last (TE: num_layers <= model_layers - 1)."""
    whole = np.ceil(fraction * layers - 1e-9)
    return np.where(fraction > 0, np.clip(whole, 1.0, np.maximum(layers - 1.0, 0.0)), 0.0)


def fraction_of_layers(k: np.ndarray, layers) -> np.ndarray:
    """The fraction that offloads k whole layers of `layers` (inverse of `offloaded_layers`; the
    most, all but the last, as 1.0, the fraction a Megatron launch of it runs)."""
    k = np.asarray(k, dtype=np.float64)
    return np.where(k >= np.asarray(layers) - 1, 1.0, k / np.asarray(layers, dtype=np.float64))


def schedule_exposed_s(n_offloaded: np.ndarray, layers: np.ndarray, copy_per_layer_s: np.ndarray,
                       compute_per_layer_s: np.ndarray) -> np.ndarray:
    """Seconds one direction's copies add to one microbatch's forward (or backward) pass under
    TE's default offload schedule (module docstring)."""
    n, L = n_offloaded, layers
    queued = n * copy_per_layer_s - (L - 2.0) * compute_per_layer_s
    single = copy_per_layer_s - (L - n - 1.0) * compute_per_layer_s
    overlapped = np.maximum(0.0, np.maximum(queued, single))
    serial = n * copy_per_layer_s  # N = L - 1: each layer waits for the previous layer's copy
    return np.where(n > 0, np.where(L - n <= 1.0, serial, overlapped), 0.0)


def activation_offload_exposed_s(fraction: np.ndarray, layers: np.ndarray, activation_bytes: np.ndarray,
                                 bandwidth_bytes_per_s: float, forward_s: np.ndarray,
                                 backward_s: np.ndarray) -> np.ndarray:
    """Seconds activation offload adds to one microbatch: copies out during the forward, back
    during the backward. `activation_bytes` are the microbatch's stored activations on the rank
    (all its `layers`), `forward_s` / `backward_s` its compute over those layers."""
    L = np.maximum(layers, 1.0)
    n = offloaded_layers(fraction, layers)
    copy = activation_bytes / L / bandwidth_bytes_per_s
    return (schedule_exposed_s(n, L, copy, forward_s / L)
            + schedule_exposed_s(n, L, copy, backward_s / L))


__all__ = ["activation_offload_exposed_s", "offloaded_layers", "schedule_exposed_s"]
