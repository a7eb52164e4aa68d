"""The engines' routes of an update's sequences, for a mixture-of-experts model: routing
replay (`algo.routing_replay`, `models.routing_replay`), the agreement metric, and the
refit probe scored on each engine's routes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from megatron_seed.data import TokenBatch
from megatron_seed.pipeline.collective import broadcast_or_raise
from megatron_seed.rollout.refit import RefitError
from megatron_seed.train.batch import PolicyBatch, select_rows, with_routes

if TYPE_CHECKING:
    from megatron_seed.config import SeedConfig
    from megatron_seed.pipeline.roles import Follower


def engine_routes(
    cfg: SeedConfig, is_moe: bool, side: Follower, step: int, pb: PolicyBatch, timer: Any
) -> PolicyBatch:
    """`pb` with the engines' routes (the `routes` phase): of every student and teacher
    sequence with routing replay, else of the first `algo.route_check_rows` students (for
    the agreement metric); `pb` itself for a dense model (`is_moe` False) or with
    one-step-off. Rank 0 (`side`) reads them back from the engines while they still hold the
    weights that played them and broadcasts them, or the error that stopped it (every rank
    raises it, naming update `step`)."""
    replay, check = cfg.algo.routing_replay, cfg.algo.route_check_rows
    if not is_moe or cfg.rollout.one_step_off or not (replay or check):
        return pb
    context = f"update {step}: reading the engines' routes back"
    with timer.time("routes"):
        got = side.routes(pb, None if replay else check)
        student, teacher = broadcast_or_raise(got, RuntimeError, context)
    pb.student = with_routes(pb.student, student)
    if pb.teacher is not None and replay:
        pb.teacher = with_routes(pb.teacher, teacher)
    return pb


def probe_on_engine_routes(side: Follower, probe: TokenBatch, step: int) -> TokenBatch:
    """The refit probe (`[1, n]`) once per engine (`[E, n]`), each row with that engine's
    routes of it (rank 0, `side`, reads them and broadcasts them, or the error every rank
    raises)."""
    context = f"update {step}: reading the engines' routes of the probe"
    routes = broadcast_or_raise(side.probe_routes(probe.input_ids[0].tolist()), RefitError, context)
    rows = select_rows(probe, torch.zeros(len(routes), dtype=torch.long))  # [E, n]
    return with_routes(rows, routes)
