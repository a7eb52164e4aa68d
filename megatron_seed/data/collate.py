"""Right-padded `[b, s]` batches of token sequences, in the trainer's shifted convention.

Shift convention (the one every per-token tensor in `megatron_seed.algo` uses): the logit
at position i predicts token i + 1. So for a sequence of ids x_0 .. x_{n-1}:

    input_ids[i]        = x_i                       i < n, else pad_id
    labels[i]           = x_{i+1}                   i < n - 1, else pad_id
    loss_mask[i]        = x_{i+1} is an action token (False for i >= n - 1)
    rollout_logprobs[i] = rollout log-prob of x_{i+1} where loss_mask[i], else 0
    turn_index[i]       = turn of x_{i+1} (-1 where i >= n - 1 or x_{i+1} is system text)

and the trainer computes logp[i] = log p(x_{i+1} | x_0 .. x_i) = -CE(logits[i], labels[i]).
Ignored labels hold pad_id (a valid id, not -100), since vocab-parallel cross entropy
indexes with every label; only loss_mask decides what counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from megatron_seed.data.sequences import TokenSequence

NO_ROUTE = -1  # `TokenBatch.routes` of a token with none given: its router picks freely


def pad_value(key: str) -> int:
    """What pads a micro-batch tensor called `key` where no token is: `NO_ROUTE` for the
    routes (padding routes freely), else 0 (no id, no loss, no mask)."""
    return NO_ROUTE if key == "routes" else 0


@dataclass
class TokenBatch:
    """A padded batch; every tensor is [b, s] except `lengths` ([b]) and `routes`."""

    input_ids: torch.Tensor  # [b, s] int64, right-padded with pad_id
    labels: torch.Tensor  # [b, s] int64, input_ids shifted left by one
    loss_mask: torch.Tensor  # [b, s] bool, labels[:, i] is a sampled action token
    rollout_logprobs: torch.Tensor  # [b, s] float32, aligned with labels
    turn_index: torch.Tensor  # [b, s] int64, aligned with labels
    attention_mask: torch.Tensor  # [b, s] bool, True on real (unpadded) input tokens
    position_ids: torch.Tensor  # [b, s] int64, 0 .. s-1 per row
    lengths: torch.Tensor  # [b] int64, unpadded lengths
    # a mixture-of-experts model's routes, when the engine reported them: the experts each
    # MoE layer picked for each input token ([b, s, layers, k] int16; NO_ROUTE: not given)
    routes: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Loss tokens in this batch."""
        return int(self.loss_mask.sum())


def collate(
    sequences: Sequence[TokenSequence], pad_id: int, pad_to_multiple_of: int = 1
) -> TokenBatch:
    """Right-pad `sequences` to one [b, s] batch; s is the longest length, rounded up to a
    multiple of `pad_to_multiple_of` (e.g. the TP size for sequence parallelism)."""
    if not sequences:
        raise ValueError("collate needs at least one sequence")
    b = len(sequences)
    longest = max(len(seq) for seq in sequences)
    s = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((b, s), pad_id, dtype=torch.long)  # [b, s]
    labels = torch.full((b, s), pad_id, dtype=torch.long)  # [b, s]
    loss_mask = torch.zeros(b, s, dtype=torch.bool)  # [b, s]
    logprobs = torch.zeros(b, s, dtype=torch.float32)  # [b, s]
    turns = torch.full((b, s), -1, dtype=torch.long)  # [b, s]
    lengths = torch.tensor([len(seq) for seq in sequences], dtype=torch.long)  # [b]
    for row, seq in enumerate(sequences):
        n = len(seq)
        if n and seq.action_mask[0]:
            raise ValueError(f"row {row}: token 0 is a loss token but nothing predicts it")
        input_ids[row, :n] = torch.tensor(seq.input_ids, dtype=torch.long)
        labels[row, : n - 1] = input_ids[row, 1:n]
        loss_mask[row, : n - 1] = torch.tensor(seq.action_mask[1:], dtype=torch.bool)
        logprobs[row, : n - 1] = torch.tensor(seq.logprobs[1:], dtype=torch.float32)
        turns[row, : n - 1] = torch.tensor(seq.turn_index[1:], dtype=torch.long)
    logprobs = torch.where(loss_mask, logprobs, 0.0)
    attention_mask = torch.arange(s).unsqueeze(0) < lengths.unsqueeze(1)  # [b, s]
    position_ids = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()  # [b, s]
    return TokenBatch(
        input_ids, labels, loss_mask, logprobs, turns, attention_mask, position_ids, lengths
    )


def align_teacher(
    teacher_values: torch.Tensor,
    teacher_mask: torch.Tensor,
    student_mask: torch.Tensor,
    has_teacher: torch.Tensor,
) -> torch.Tensor:
    """Move per-token teacher values onto the student's positions.

    teacher_values, teacher_mask: [b_t, s_t], one row per student row with has_teacher,
        in the same order; student_mask: [b, s]; has_teacher: [b] bool, b_t = sum.
    Returns [b, s]: the teacher value of each student loss token (the k-th action token of
    a student row gets the k-th of its teacher row), 0 elsewhere and on rows without one.
    """
    device = teacher_values.device
    has_teacher = has_teacher.to(device=device, dtype=torch.bool)
    if int(has_teacher.sum()) != teacher_values.shape[0]:
        raise ValueError(
            f"{int(has_teacher.sum())} rows have a teacher, got {teacher_values.shape[0]}"
        )
    teacher_mask = teacher_mask.to(device=device, dtype=torch.bool)
    student_mask = student_mask.to(device=device, dtype=torch.bool)
    target = student_mask[has_teacher]  # [b_t, s]
    if not torch.equal(target.sum(-1), teacher_mask.sum(-1)):
        raise ValueError("student and teacher rows have different numbers of action tokens")
    rows = teacher_values.new_zeros(target.shape)  # [b_t, s]
    rows[target] = teacher_values[teacher_mask]  # row-major order keeps each row's k-th token
    out = teacher_values.new_zeros(student_mask.shape)  # [b, s]
    out[has_teacher] = rows
    return out
