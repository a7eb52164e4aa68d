"""Chunked output layer + cross entropy (`models.chunked`) against the whole-sequence path:
the same per-token NLL and the same gradients (<= 1e-5) at TP=1 and TP=2, with and without
sequence parallelism, for tied (Qwen2.5-0.5B-like) and untied embeddings."""

from __future__ import annotations

import math

import pytest

from megatron_seed.models.parallel import spawn
from megatron_seed.models.tiny import make_tiny_qwen
from tests.distributed.chunk_workers import chunked_matches_whole


@pytest.mark.parametrize(
    ("tp", "sequence_parallel", "tied"),
    [(1, False, True), (1, False, False), (2, False, True), (2, True, True), (2, True, False)],
)
def test_chunked_nll_and_grads_equal_the_whole_sequence(tmp_path, tp, sequence_parallel, tied):
    hf = make_tiny_qwen(tmp_path / "m", seed=5, tie_word_embeddings=tied)
    seq, rows, chunk = 40, 3, 21  # chunks of 7 positions at TP=1, 3 per rank under SP
    results = spawn(chunked_matches_whole, tp, str(hf), tp, seq, rows, chunk, sequence_parallel)
    local = seq // (tp if sequence_parallel else 1)
    step = chunk // (rows * (tp if sequence_parallel else 1))
    per_pass = math.ceil(local / step)
    for r in results:
        assert r["sequence_parallel"] == sequence_parallel, r
        assert r["whole_calls"] == 0, r  # the plain path never calls the chunk function
        # forward, backward's recompute, and the no-grad pass: one call per chunk each
        assert r["chunks"] == 3 * per_pass, r
        assert r["nll_diff"] < 1e-5, r
        assert r["eval_diff"] < 1e-5, r
        assert r["grad_diff"] < 1e-5 * max(1.0, r["grad_scale"]), r
