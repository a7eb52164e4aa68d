"""Packed micro-batches: sequences of different lengths concatenated into rows, no padding
between them.

`collate` gives a `[B, s]` batch with every row right-padded to the longest sequence. A
`PackPlan` puts the B sequences (lengths n_i, without their padding) into R packed rows of
one common width T; each packed row is one `[1, T]` micro-batch:

    row r:  seq a (n_a tokens) | seq b (n_b) | ... | end padding (T - sum n)
    cu_seqlens[r]   = [0, n_a, n_a + n_b, ..., sum n, T]    int32, the segment boundaries
    position_ids[r] = 0 .. n_a-1, 0 .. n_b-1, ..., 0 .. (T - sum n)-1

The end padding is a segment of its own (when there is any), so every one of the T tokens
belongs to a segment: attention runs inside each segment only (Megatron's `thd` format,
`PackedSeqParams`), positions (RoPE) restart at 0 in each, and the padding computes finite
values that no loss reads. Every per-token tensor of the batch, in `collate`'s shift
convention, packs the same way: positions 0 .. n_i - 1 of row i go to packed row
`row_of[i]` at offset `start[i]`. The last position of a sequence (n_i - 1) has no target:
its label is the padded layout's (a valid id) and its loss mask False, so no loss crosses
into the next sequence of the row; `unpack_tensor` is the exact inverse.

Planning (`pack`): rows hold at most `capacity` tokens (a sequence longer than that is never
split: it gets a row as wide as itself, and the capacity of every row becomes its length,
since all micro-batches of one schedule call share one shape anyway). The row count is the
smallest multiple of `row_multiple` (the data-parallel size: each DP rank gets R / dp rows)
for which the longest-first, least-loaded assignment fits; that assignment balances the rows,
so the common width T (the fullest row, rounded up to `multiple`) leaves little padding.
Deterministic: the same lengths give the same plan on every rank.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackPlan:
    """Where each of B sequences sits in R packed rows of width T tokens."""

    lengths: torch.Tensor  # [B] int64, tokens of each sequence
    row_of: torch.Tensor  # [B] int64, the packed row of each sequence (0 for empty ones)
    start: torch.Tensor  # [B] int64, its first token's offset in that row
    rows: int  # R
    width: int  # T, tokens of every packed row (a multiple of `multiple`)
    cu_seqlens: tuple[torch.Tensor, ...]  # R tensors [segments + 1] int32, from 0 to T

    @property
    def num_sequences(self) -> int:
        """B."""
        return int(self.lengths.shape[0])

    @property
    def real_tokens(self) -> int:
        """Tokens that belong to a sequence (the rest of the R * T is padding)."""
        return int(self.lengths.sum())

    @property
    def pad_fraction(self) -> float:
        """Padding tokens / all R * T tokens of the packed rows."""
        return 1.0 - self.real_tokens / (self.rows * self.width)

    def max_seqlen(self, row: int) -> int:
        """The longest segment of packed row `row` (the end padding included)."""
        return int((self.cu_seqlens[row][1:] - self.cu_seqlens[row][:-1]).max())

    def _index(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat index into [B, s], flat index into [R, T]) of every real token: [n] each."""
        if self.num_sequences and int(self.lengths.max()) > s:
            raise ValueError(f"a sequence of {int(self.lengths.max())} tokens does not fit {s}")
        total = self.real_tokens
        seq = torch.repeat_interleave(torch.arange(self.num_sequences), self.lengths)  # [n]
        first = torch.cumsum(self.lengths, 0) - self.lengths  # [B]
        pos = torch.arange(total) - first[seq]  # [n], 0 .. n_i - 1 within each sequence
        src = seq * s + pos
        dst = self.row_of[seq] * self.width + self.start[seq] + pos
        return src, dst

    def pack_tensor(self, x: torch.Tensor, fill: float | int | bool = 0) -> torch.Tensor:
        """`[B, s, ...]` (right-padded rows) -> `[R, T, ...]`; padding holds `fill`."""
        b, s = x.shape[:2]
        if b != self.num_sequences:
            raise ValueError(f"the plan has {self.num_sequences} sequences, got {b} rows")
        src, dst = self._index(s)
        out = x.new_full((self.rows * self.width, *x.shape[2:]), fill)  # [R * T, ...]
        out[dst] = x.reshape(b * s, *x.shape[2:])[src]
        return out.view(self.rows, self.width, *x.shape[2:])

    def unpack_tensor(self, y: torch.Tensor, s: int, fill: float | int | bool = 0) -> torch.Tensor:
        """`[R, T, ...]` -> `[B, s, ...]`, the inverse of `pack_tensor`; positions past each
        sequence's length hold `fill`."""
        if tuple(y.shape[:2]) != (self.rows, self.width):
            raise ValueError(f"expected [{self.rows}, {self.width}, ...], got {tuple(y.shape)}")
        src, dst = self._index(s)
        b = self.num_sequences
        out = y.new_full((b * s, *y.shape[2:]), fill)  # [B * s, ...]
        out[src] = y.reshape(self.rows * self.width, *y.shape[2:])[dst]
        return out.view(b, s, *y.shape[2:])

    def position_ids(self) -> torch.Tensor:
        """`[R, T]` int64: 0 at the start of every segment, counting up within it."""
        out = torch.empty(self.rows, self.width, dtype=torch.long)
        for r, cu in enumerate(self.cu_seqlens):
            seg = (cu[1:] - cu[:-1]).long()  # [segments]
            first = torch.repeat_interleave(cu[:-1].long(), seg)  # [T]
            out[r] = torch.arange(self.width) - first
        return out


def pack(
    lengths: torch.Tensor | list[int],
    capacity: int,
    multiple: int = 1,
    row_multiple: int = 1,
) -> PackPlan:
    """Plan packed rows of at most `capacity` tokens for sequences of these `lengths` ([B]).

    `multiple`: the width T is a multiple of it (FP8 blocks, sequence parallelism);
    `row_multiple`: the row count R is a multiple of it (data-parallel ranks; rows beyond
    what the sequences need are all padding). See the module docstring.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1)  # [B]
    for name, value in (("capacity", capacity), ("multiple", multiple)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if row_multiple < 1:
        raise ValueError(f"row_multiple must be >= 1, got {row_multiple}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"sequence lengths must be >= 0, got {int(lengths.min())}")
    sizes = lengths.tolist()
    cap = max([capacity, *sizes])
    order = sorted((i for i, n in enumerate(sizes) if n), key=lambda i: (-sizes[i], i))
    rows = -(-max(1, -(-sum(sizes) // cap)) // row_multiple) * row_multiple
    while True:  # ends: with a row per sequence, each row holds one (<= cap)
        members, loads = _least_loaded(order, sizes, rows)
        if max(loads) <= cap:
            break
        rows += row_multiple
    width = -(-max(1, max(loads)) // multiple) * multiple
    row_of = torch.zeros_like(lengths)
    start = torch.zeros_like(lengths)
    cu_seqlens = []
    for r, seqs in enumerate(members):
        bounds, offset = [0], 0
        for i in sorted(seqs):  # in batch order within a row
            row_of[i], start[i] = r, offset
            offset += sizes[i]
            bounds.append(offset)
        if offset < width:
            bounds.append(width)  # the end padding: a segment of its own
        cu_seqlens.append(torch.tensor(bounds, dtype=torch.int32))
    return PackPlan(lengths, row_of, start, rows, width, tuple(cu_seqlens))


def _least_loaded(order: list[int], sizes: list[int], rows: int) -> tuple[list, list[int]]:
    """Longest first, each sequence to the row with the fewest tokens (ties: lowest row)."""
    heap = [(0, r) for r in range(rows)]
    members: list[list[int]] = [[] for _ in range(rows)]
    loads = [0] * rows
    for i in order:
        load, r = heapq.heappop(heap)
        members[r].append(i)
        loads[r] = load + sizes[i]
        heapq.heappush(heap, (loads[r], r))
    return members, loads


def padded_fraction(lengths: torch.Tensor, rows: int, width: int) -> float:
    """Padding tokens / all tokens when `lengths` ([B]) fill `rows` rows of `width` tokens
    (the right-padded layout: rows >= B, the extra rows all padding)."""
    return 1.0 - int(lengths.sum()) / (rows * width)
