"""One-step-off Stage 2 (`rollout.one_step_off`): the next update plays while this one trains.

Each update's records then come from the weights one trainer step behind; `staleness`
measures what that lag does to the analyzer's skills (Proposition 3 of the paper).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from megatron_seed.algo.staleness import staleness_metrics
from megatron_seed.data import TrajectoryRecord, collate
from megatron_seed.data.sequences import build_sequences
from megatron_seed.pipeline.collective import broadcast
from megatron_seed.pipeline.metrics import PhaseTimer
from megatron_seed.pipeline.roles import Slot

if TYPE_CHECKING:
    from megatron_seed.config import SeedConfig
    from megatron_seed.pipeline.roles import Follower, Played
    from megatron_seed.train.trainer import SeedTrainer


def play_ahead(
    cfg: SeedConfig, side: Follower, trainer: SeedTrainer, pool: ThreadPoolExecutor | None
) -> Future[Played] | None:
    """Start the next update's rollout and analysis in `pool`'s thread (the driver's, made
    when `rollout.one_step_off` is on), on the weights the engines hold now (the trainer's
    before this update's step); None when there is no next one."""
    if not cfg.rollout.one_step_off or trainer.state.step + 1 >= cfg.updates:
        return None
    assert pool is not None
    now = Slot.now(trainer.state)
    slot = Slot(now.step + 1, now.position + cfg.rollout.tasks_per_update, now.version)

    def play() -> Played:
        timer = PhaseTimer()
        records, metrics = side.play_and_analyze(timer, slot)
        metrics.update({f"ahead/{k}_s": v for k, v in timer.seconds.items()})
        return records, metrics

    return pool.submit(play)


def staleness(
    cfg: SeedConfig,
    side: Follower,
    trainer: SeedTrainer,
    tokenizer: Any,
    records: list[TrajectoryRecord] | None,
) -> dict[str, float]:
    """Proposition 3's analyzer staleness for this update (a collective): the lag between
    the trainer and the weights that played and analysed `records` (rank 0's; None
    elsewhere); with a lag, the trainer scores the re-analysed sample's action tokens
    without a skill, with the old skill and with the new one (`algo.staleness`)."""
    lag, pairs = broadcast(side.stale_pairs(trainer.state.step, records))
    metrics: dict[str, float] = {"staleness/lag": float(lag)}
    if lag == 0:  # the analyzer that made every skill is the synchronized one
        metrics.update({"staleness/delta_abs_mean": 0.0, "staleness/gate_abs_mean": 0.0})
        metrics["staleness/bound"] = 0.0
        return metrics
    if not pairs:
        return metrics
    rows = []  # per pair: (student, stale teacher, fresh teacher) sequences
    for old, new in pairs:
        for a, b in zip(
            build_sequences(old, tokenizer, cfg.skill.insert_at),
            build_sequences(new, tokenizer, cfg.skill.insert_at),
            strict=True,
        ):
            rows.append((a.student, a.teacher, b.teacher))
    seqs = [seq for row in rows for seq in row]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = collate(seqs, pad, trainer.seq_multiple)
    logp = trainer.score(batch)  # [3 n, s]; position i scores labels[:, i]
    tokens = [logp[i][batch.loss_mask[i]] for i in range(len(seqs))]  # each [actions]
    student, stale, fresh = (torch.cat(tokens[k::3]) for k in range(3))
    metrics.update(staleness_metrics(student, stale, fresh, cfg.algo.beta_opd))
    metrics["staleness/trajectories"] = float(len(pairs))
    return metrics
