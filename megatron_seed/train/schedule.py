"""The learning rate of each Stage-2 update.

One update is one point of the schedule (all its optimizer steps share the rate), so a
resumed run, which knows its update index, continues the schedule where it stopped:

    warm-up   lr * (k + 1) / (W + 1)                           for k < W (lr_warmup_updates)
    constant  lr
    linear    lr * (r + (1 - r) * (1 - p))                      p = (k - W) / (U - 1 - W)
    cosine    lr * (r + (1 - r) * (1 + cos(pi * p)) / 2)        r = lr_min_ratio

k is the 0-based update, U the run's updates; the decays reach lr * r at the last update.
"""

from __future__ import annotations

import math

from megatron_seed.config import OptimConfig


def lr_at(optim: OptimConfig, update: int, updates: int) -> float:
    """The learning rate of 0-based update ``update`` of a run of ``updates`` updates."""
    if update < 0 or updates < 1:
        raise ValueError(f"need update >= 0 and updates >= 1, got {update} and {updates}")
    warm = optim.lr_warmup_updates
    if update < warm:
        return optim.lr * (update + 1) / (warm + 1)
    if optim.lr_decay == "constant":
        return optim.lr
    span = updates - 1 - warm
    progress = min(1.0, (update - warm) / span) if span > 0 else 1.0
    if optim.lr_decay == "linear":
        left = 1.0 - progress
    else:  # cosine
        left = (1.0 + math.cos(math.pi * progress)) / 2
    r = optim.lr_min_ratio
    return optim.lr * (r + (1.0 - r) * left)
