"""The engines' routes of an update's sequences, for a mixture-of-experts model: routing
replay (`algo.routing_replay`, `models.routing_replay`), the agreement metric, and the
refit probe scored on each engine's routes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from megatron_seed.data import TokenBatch
from megatron_seed.pipeline.collective import broadcast
from megatron_seed.rollout.refit import RefitError
from megatron_seed.train.batch import PolicyBatch, select_rows, with_routes

if TYPE_CHECKING:
    from megatron_seed.pipeline.stage2 import Run


def engine_routes(run: Run, pb: PolicyBatch, timer: Any) -> PolicyBatch:
    """`pb` with the engines' routes (the `routes` phase): of every student and teacher
    sequence with routing replay, else of the first `algo.route_check_rows` students (for
    the agreement metric); `pb` itself for a dense model or with one-step-off. Rank 0 reads
    them back from the engines while they still hold the weights that played them and
    broadcasts them, or the error that stopped it (every rank raises it)."""
    cfg = run.cfg
    replay, check = cfg.algo.routing_replay, cfg.algo.route_check_rows
    if not run.trainer.spec.is_moe or cfg.rollout.one_step_off or not (replay or check):
        return pb
    with timer.time("routes"):
        got = broadcast(run.side.routes(pb, None if replay else check))
    if isinstance(got, str):
        raise RuntimeError(f"update {run.step}: reading the engines' routes back: {got}")
    student, teacher = got
    pb.student = with_routes(pb.student, student)
    if pb.teacher is not None and replay:
        pb.teacher = with_routes(pb.teacher, teacher)
    return pb


def probe_on_engine_routes(run: Run) -> TokenBatch:
    """The refit probe once per engine (`[E, n]`), each row with that engine's routes of it
    (rank 0 reads them and broadcasts them, or the error every rank raises)."""
    routes = broadcast(run.side.probe_routes(run.probe.input_ids[0].tolist()))
    if isinstance(routes, str):
        raise RefitError(f"update {run.step}: reading the engines' routes of the probe: {routes}")
    rows = select_rows(run.probe, torch.zeros(len(routes), dtype=torch.long))  # [E, n]
    return with_routes(rows, routes)
