"""Rank 0's answer, or the error it caught, on every trainer rank (`broadcast_or_raise`): a
failure on rank 0 raises on every rank instead of leaving the others waiting."""

from __future__ import annotations

from megatron_seed.models.parallel import spawn
from tests.distributed import workers


def test_rank_zeros_value_or_its_error_reaches_every_rank():
    got = spawn(workers.broadcast_or_raise_on_ranks, 2, {"engine 0": 0.01})
    assert got == [("ok", {"engine 0": 0.01})] * 2
    got = spawn(workers.broadcast_or_raise_on_ranks, 2, "engine 1 differs from the trainer")
    assert got == [("raised", "update 3: engine 1 differs from the trainer")] * 2
