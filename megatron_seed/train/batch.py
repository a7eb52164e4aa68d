"""From trajectory records to the tensors of one update (identical on every rank)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from megatron_seed.algo import group_advantages
from megatron_seed.data import TokenBatch, TrajectoryRecord, collate
from megatron_seed.data.collate import NO_ROUTE
from megatron_seed.data.sequences import build_sequences


@dataclass
class PolicyBatch:
    """One update's sequences. Row r of `student` belongs to record `record_index[r]`."""

    student: TokenBatch  # [B, s]
    teacher: TokenBatch | None  # [B_t, s_t]: the rows with a valid skill, in order
    has_teacher: torch.Tensor  # [B] bool
    advantages: torch.Tensor  # [B] float32 (the record's group-normalised advantage)
    record_index: torch.Tensor  # [B] int64
    won: torch.Tensor | None = None  # [B] bool: the record succeeded (None: not known)

    @property
    def rows(self) -> int:
        """Number of sequences B."""
        return int(self.student.input_ids.shape[0])


def build_policy_batch(
    records: Sequence[TrajectoryRecord],
    tokenizer,
    skill_insert_at: str = "task_line",
    with_teacher: bool = True,
    adv_eps: float = 1e-6,
    pad_to_multiple_of: int = 1,
) -> PolicyBatch:
    """Advantages per record (GRPO groups), then student/teacher sequences per record, each
    batch padded to a multiple of `pad_to_multiple_of` tokens (`models.fp8.seq_multiple`)."""
    usable = [r for r in records if r.trainable]
    if not usable:
        raise ValueError("no trainable trajectories in this batch")
    rewards = torch.tensor([r.reward for r in usable], dtype=torch.float32)
    adv = group_advantages(rewards, [r.group_id for r in usable], eps=adv_eps)  # [n]
    students, teachers, has_teacher, row_adv, index, won = [], [], [], [], [], []
    for i, record in enumerate(usable):
        for pair in build_sequences(record, tokenizer, skill_insert_at, with_teacher):
            students.append(pair.student)
            has_teacher.append(pair.teacher is not None)
            if pair.teacher is not None:
                teachers.append(pair.teacher)
            row_adv.append(float(adv[i]))
            index.append(i)
            won.append(bool(record.won))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return PolicyBatch(
        # student and teacher alike: FP8 GEMMs need the token count a multiple of the block
        student=collate(students, pad, pad_to_multiple_of),
        teacher=collate(teachers, pad, pad_to_multiple_of) if teachers else None,
        has_teacher=torch.tensor(has_teacher, dtype=torch.bool),
        advantages=torch.tensor(row_adv, dtype=torch.float32),
        record_index=torch.tensor(index, dtype=torch.long),
        won=torch.tensor(won, dtype=torch.bool),
    )


def select_rows(batch: TokenBatch, rows: torch.Tensor) -> TokenBatch:
    """The sub-batch of `rows` (a [k] index tensor)."""
    fields = (getattr(batch, f) for f in TokenBatch.__dataclass_fields__)
    return TokenBatch(*(None if x is None else x[rows] for x in fields))


def with_routes(batch: TokenBatch, routes: Sequence[Any | None]) -> TokenBatch:
    """`batch` with the engine's routes of its rows: `routes[r]` is row r's `[n_r, layers, k]`
    (array or tensor, n_r its length), or None for a row without; padding and rows without
    hold `NO_ROUTE`."""
    b, s = batch.input_ids.shape
    if len(routes) != b:
        raise ValueError(f"{len(routes)} routes for a batch of {b} rows")
    parts = [None if r is None else torch.as_tensor(r).to(torch.int16) for r in routes]
    given = [p for p in parts if p is not None]
    if not given:
        raise ValueError("no row has routes")
    shape = given[0].shape[1:]  # [layers, k]
    out = torch.full((b, s, *shape), NO_ROUTE, dtype=torch.int16)  # [b, s, layers, k]
    for row, (part, n) in enumerate(zip(parts, batch.lengths.tolist(), strict=True)):
        if part is None:
            continue
        if part.shape != (n, *shape):
            raise ValueError(
                f"row {row}: routes of shape {tuple(part.shape)} for a {n}-token sequence "
                f"(expected {(n, *shape)})"
            )
        out[row, :n] = part
    return dataclasses.replace(batch, routes=out)


def outcome_signal(records: Sequence[TrajectoryRecord]) -> dict[str, float]:
    """What the update's outcomes can teach: its GRPO groups (trainable records) and the
    shares that are tied (every reward equal: advantage 0) with every episode won or lost,
    and the share with a signal (`batch/signal_frac`)."""
    groups: dict[Any, list[TrajectoryRecord]] = {}
    for r in records:
        if r.trainable:
            groups.setdefault(r.group_id, []).append(r)
    n = len(groups)
    if not n:
        return {}
    tied = [g for g in groups.values() if len({r.reward for r in g}) == 1]
    won = sum(all(r.won for r in g) for g in tied)
    lost = sum(not any(r.won for r in g) for g in tied)
    return {
        "batch/groups": float(n),
        "batch/tied_won_frac": won / n,
        "batch/tied_lost_frac": lost / n,
        "batch/signal_frac": (n - len(tied)) / n,
    }


def permute_advantages(pb: PolicyBatch, generator: torch.Generator) -> PolicyBatch:
    """`pb` with its records' advantages permuted at random across the batch (the negative
    control `AlgoConfig.shuffle_advantages`): every row of a record takes the advantage of
    the record it is paired with; the multiset of advantages is unchanged."""
    records = int(pb.record_index.max()) + 1
    per_record = torch.zeros(records, dtype=pb.advantages.dtype)  # [n]
    per_record[pb.record_index] = pb.advantages
    perm = torch.randperm(records, generator=generator)  # [n]
    return dataclasses.replace(pb, advantages=per_record[perm][pb.record_index])
