"""An update's rows split into mini-batches whatever their count (`optim.mini_batches_per_update`)."""

from __future__ import annotations

import pytest
import torch

from megatron_seed.train.trainer import mini_batches


@pytest.mark.parametrize(
    ("rows", "k", "sizes"),
    [(12, 4, [3, 3, 3, 3]), (10, 4, [3, 3, 2, 2]), (5, 4, [2, 1, 1, 1]), (3, 4, [1, 1, 1])],
)
def test_every_row_in_exactly_one_mini_batch_sizes_within_one(rows, k, sizes):
    parts = mini_batches(rows, k)
    assert [len(p) for p in parts] == sizes
    assert torch.equal(torch.cat(parts), torch.arange(rows))  # contiguous, in order, once


def test_no_rows_is_an_error():
    with pytest.raises(ValueError, match="at least one row"):
        mini_batches(0, 2)
