"""Sequence packing (`data.packing`): the plan's rows, boundaries and positions, the exact
pack/unpack round trip, and the padding it leaves on a SEED batch of mixed lengths."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from megatron_seed.data import TokenSequence, collate
from megatron_seed.data.packing import pack, padded_fraction


def _segments(plan, row):
    cu = plan.cu_seqlens[row].tolist()
    return [b - a for a, b in pairwise(cu)]


def test_plan_hand_values() -> None:
    plan = pack([5, 3, 7, 2], capacity=9)
    # longest first, each to the emptiest row: 7 -> row 0, 5 -> row 1, 3 -> row 1, 2 -> row 0
    assert plan.rows == 2 and plan.width == 9
    assert plan.row_of.tolist() == [1, 1, 0, 0] and plan.start.tolist() == [0, 5, 0, 7]
    assert [c.tolist() for c in plan.cu_seqlens] == [[0, 7, 9], [0, 5, 8, 9]]
    assert all(c.dtype == torch.int32 for c in plan.cu_seqlens)
    assert _segments(plan, 1) == [5, 3, 1]  # the end padding is a segment of its own
    assert plan.max_seqlen(0) == 7 and plan.max_seqlen(1) == 5
    assert plan.pad_fraction == pytest.approx(1 - 17 / 18)
    assert plan.position_ids().tolist() == [
        [0, 1, 2, 3, 4, 5, 6, 0, 1],
        [0, 1, 2, 3, 4, 0, 1, 2, 0],
    ]


def test_width_rows_and_long_sequences() -> None:
    # the width is a multiple of `multiple`; the row count a multiple of `row_multiple`
    plan = pack([5, 3, 7, 2], capacity=9, multiple=4, row_multiple=4)
    assert plan.rows == 4 and plan.width == 8  # four rows balance to one sequence each
    plan = pack([5, 3], capacity=9, multiple=4, row_multiple=4)
    assert plan.rows == 4 and plan.width == 8
    empty = [r for r in range(4) if not (plan.row_of == r).any()]  # all padding
    assert empty == [2, 3] and all(plan.cu_seqlens[r].tolist() == [0, 8] for r in empty)
    # a sequence longer than the capacity is never split: rows widen to its length
    plan = pack([30, 4, 4, 4], capacity=8)
    assert plan.width == 30 and plan.rows == 2
    assert plan.row_of[0] != plan.row_of[1]
    # one sequence exactly filling a row: no padding segment, and RoPE's positions 0 .. T-1
    plan = pack([8], capacity=8)
    assert plan.cu_seqlens[0].tolist() == [0, 8] and plan.pad_fraction == 0.0
    # empty sequences take no tokens
    plan = pack([0, 3, 0], capacity=4)
    assert plan.cu_seqlens[0].tolist() == [0, 3] and plan.real_tokens == 3


def test_plan_is_deterministic_and_never_splits_or_overfills() -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        lengths = torch.randint(1, 300, (int(torch.randint(1, 40, (1,), generator=gen)),))
        cap = int(torch.randint(64, 1024, (1,), generator=gen))
        plan = pack(lengths, cap, multiple=8, row_multiple=1 + trial % 3)
        again = pack(lengths.clone(), cap, multiple=8, row_multiple=1 + trial % 3)
        assert plan.row_of.tolist() == again.row_of.tolist()
        assert plan.start.tolist() == again.start.tolist()
        limit = max(cap, int(lengths.max()))
        assert plan.width % 8 == 0 and plan.width < limit + 8
        assert plan.rows % (1 + trial % 3) == 0
        for r in range(plan.rows):
            mine = (plan.row_of == r).nonzero().flatten().tolist()
            fill = sum(int(lengths[i]) for i in mine)
            assert fill <= limit
            # sequences sit back to back from 0, each whole, then the padding segment
            assert _segments(plan, r)[: len(mine)] == [int(lengths[i]) for i in mine]
            assert int(plan.cu_seqlens[r][-1]) == plan.width
            assert sum(_segments(plan, r)) == plan.width and min(_segments(plan, r)) > 0


def test_round_trip_is_exact_and_padding_holds_fill() -> None:
    lengths = torch.tensor([6, 2, 9, 4, 1])
    b, s = 5, 11
    x = torch.randn(b, s, 3)  # a trailing dimension packs along
    plan = pack(lengths, capacity=10, multiple=2)
    y = plan.pack_tensor(x, fill=-7.0)  # [R, T, 3]
    assert y.shape == (plan.rows, plan.width, 3)
    assert int((y != -7.0).all(-1).sum()) == int(lengths.sum())
    back = plan.unpack_tensor(y, s, fill=0.0)  # [B, s, 3]
    real = torch.arange(s)[None, :] < lengths[:, None]  # [B, s]
    assert torch.equal(back[real], x[real]) and not back[~real].any()
    for i, n in enumerate(lengths.tolist()):
        row, start = int(plan.row_of[i]), int(plan.start[i])
        assert torch.equal(y[row, start : start + n], x[i, :n])
    with pytest.raises(ValueError, match="does not fit 8"):
        plan.pack_tensor(torch.zeros(b, 8))
    with pytest.raises(ValueError, match="5 sequences, got 4"):
        plan.pack_tensor(torch.zeros(4, s))


def test_shift_convention_no_loss_crosses_a_boundary() -> None:
    a = TokenSequence([10, 11, 12, 13], [False, False, True, True], [0, 0, -0.5, -0.6], [0] * 4)
    b = TokenSequence([20, 21, 22], [False, True, True], [0, -0.7, -0.8], [0] * 3)
    batch = collate([a, b], pad_id=0)
    plan = pack(batch.lengths, capacity=16)
    assert plan.rows == 1 and plan.cu_seqlens[0].tolist() == [0, 4, 7]
    ids = plan.pack_tensor(batch.input_ids)
    labels = plan.pack_tensor(batch.labels)
    mask = plan.pack_tensor(batch.loss_mask)
    assert ids.tolist() == [[10, 11, 12, 13, 20, 21, 22]]
    # each sequence's last position predicts nothing: a valid (pad) id, no loss
    assert labels.tolist() == [[11, 12, 13, 0, 21, 22, 0]]
    assert mask.tolist() == [[False, True, True, False, True, True, False]]


def test_bad_input_fails_loud() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        pack([3], 0)
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        pack([3], 8, multiple=0)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        pack([3, -1], 8)
    from megatron_seed.config import OptimConfig
    from megatron_seed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"optim.micro_batch_tokens must be >= 0, got -1"):
        OptimConfig(micro_batch_tokens=-1)
    assert OptimConfig().micro_batch_tokens == 0


def test_mixed_length_seed_batch_packs_with_little_padding(tiny_tokenizer) -> None:
    """Students and their longer teachers, short and long episodes: packed rows waste
    under 5 % of their tokens, right-padded rows several times more."""
    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.train.batch import build_policy_batch

    records = []
    for seed, turns in enumerate((1, 2, 4, 8)):  # short and long episodes
        for r in synthetic_records(tiny_tokenizer, groups=2, group_size=4, turns=turns, seed=seed):
            r.group_id = f"{r.group_id}-{turns}"
            records.append(r)
    pb = build_policy_batch(records, tiny_tokenizer)
    assert pb.teacher is not None
    lengths = torch.cat([pb.student.lengths, pb.teacher.lengths])  # [B + B_t]
    width = max(pb.student.input_ids.shape[1], pb.teacher.input_ids.shape[1])
    padded = padded_fraction(lengths, len(lengths), width)
    packed = pack(lengths, capacity=2048, multiple=16).pad_fraction
    students = pack(pb.student.lengths, capacity=2048, multiple=16, row_multiple=2)
    padded_students = padded_fraction(pb.student.lengths, *pb.student.input_ids.shape)
    print(
        f"pad_frac: students+teachers padded {padded:.3f} packed {packed:.4f}; "
        f"students padded {padded_students:.3f} packed (2 DP ranks) {students.pad_fraction:.4f}"
    )
    assert packed < 0.05 and students.pad_fraction < 0.05
    assert padded > 0.3 and padded_students > 0.3
