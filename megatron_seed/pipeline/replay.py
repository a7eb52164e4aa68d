"""Analyzer replay (`algo.replay_weight`): accepted Stage-1 examples in every Stage-2 update,
so the analyzer keeps what Stage 1 taught it while the policy moves."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from megatron_seed.data import TokenBatch, TrajectoryRecord, collate, read_jsonl
from megatron_seed.pipeline.job import Stage2Job
from megatron_seed.pipeline.roles import update_seed
from megatron_seed.pipeline.stage1 import sft_sequence

if TYPE_CHECKING:
    from megatron_seed.config import SeedConfig


def replay_pool(job: Stage2Job) -> list[TrajectoryRecord]:
    """The accepted Stage-1 records analyzer replay draws from ([] when it is off)."""
    if not job.cfg.algo.replay_weight:
        return []
    pool = [r for r in read_jsonl(job.replay_data) if r.has_teacher]
    if not pool:
        raise ValueError(f"{job.replay_data} holds no accepted skill for analyzer replay")
    return pool


def replay_batch(
    cfg: SeedConfig, step: int, pool: list[TrajectoryRecord], tokenizer: Any, multiple: int
) -> TokenBatch:
    """Update `step`'s analyzer-replay examples: `algo.replay_examples` accepted Stage-1
    records of `pool` drawn by (seed, update), as SFT sequences (loss on the answer tokens)
    padded to a multiple of `multiple` tokens, the same on every rank."""
    rng = random.Random(update_seed(cfg.seed, step))
    picked = rng.sample(pool, min(cfg.algo.replay_examples, len(pool)))
    seqs = [
        sft_sequence(tokenizer, r, cfg.skill.analyzer_layout, cfg.skill.min_words) for r in picked
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return collate(seqs, pad, multiple)
