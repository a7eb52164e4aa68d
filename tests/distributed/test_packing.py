"""Packed micro-batches (`optim.micro_batch_tokens` > 0) against padded ones: the same SEED
update, NLL step and log-probs at TP=1, TP=2 with sequence parallelism, PP=2 and DP=2, on a
batch of short and long episodes whose teachers are longer still."""

from __future__ import annotations

import pytest
import torch

from megatron_seed.config import AlgoConfig, OptimConfig, SeedConfig
from megatron_seed.models.parallel import spawn
from tests.distributed import workers

CFG = SeedConfig(
    algo=AlgoConfig(teacher_mode="live", lambda_opd=1.0, beta_kl=0.1),
    optim=OptimConfig(lr=1e-3, clip_grad=1e9, mini_batches_per_update=1, micro_batch_size=1),
)
TOKENS = 384  # students 78-258 tokens, teachers 116-287: several sequences per packed row


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def _same_grads(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(_rel(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("tp", "pp", "dp", "sp"),
    [(1, 1, 1, False), (2, 1, 1, True), (1, 2, 1, False), (1, 1, 2, False)],
    ids=["tp1", "tp2-sp", "pp2", "dp2"],
)
def test_packed_equals_padded(tp_checkpoint, tp, pp, dp, sp):
    hf, tok = tp_checkpoint
    results = spawn(workers.packed_and_padded, tp * pp * dp, hf, tok, tp, pp, CFG, TOKENS, sp)
    out = results[0]
    for r in results[1:]:  # every rank reports the same
        assert r["packed"]["metrics"] == out["packed"]["metrics"]
    padded, packed = out["padded"], out["packed"]
    base = padded["metrics"]
    assert abs(base["loss/total"]) > 1e-2 and 0 < base["opd/token_frac"] < 1
    scale = abs(base["loss/total"])
    for key in ("loss/total", "loss/policy", "loss/opd", "kl", "clip_frac", "opd/gate_mean"):
        tol = 1e-5 * max(abs(base[key]), scale)
        assert abs(packed["metrics"][key] - base[key]) <= tol, (key, packed["metrics"], base)
    assert packed["metrics"]["tokens"] == base["tokens"]
    assert _same_grads(packed["grads"], padded["grads"]) <= 1e-5
    # the NLL step (SFT on the teachers, the longest sequences)
    assert abs(packed["nll"]["nll"] - padded["nll"]["nll"]) <= 1e-5 * padded["nll"]["nll"]
    assert _same_grads(packed["nll_grads"], padded["nll_grads"]) <= 1e-5
    # score(): the same log-probs wherever a token has a target, [B, s] in both layouts
    for which, lengths in zip(("student", "teacher"), out["lengths"], strict=True):
        a, b = padded[which], packed[which]
        assert a.shape == b.shape
        has_target = torch.arange(a.shape[1])[None, :] < (lengths - 1)[:, None]  # [B, s]
        assert float((a - b)[has_target].abs().max()) <= 1e-5, which
        assert not b[~has_target].any()
    # the padding the training forward ran on
    pad, packed_pad = base["pad_frac"], packed["metrics"]["pad_frac"]
    print(f"pad_frac tp={tp} pp={pp} dp={dp}: padded {pad:.3f}, packed {packed_pad:.4f}")
    # DP=2: six students in four rows (two per rank), 266 tokens wide at best (5.3 %)
    assert pad > 0.3 and packed_pad < (0.01 if dp == 1 else 0.06)
