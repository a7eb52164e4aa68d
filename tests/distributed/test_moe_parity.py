"""Qwen3-MoE on Megatron against transformers: a tiny Qwen3-MoE checkpoint (8 experts, top-2,
written by transformers' own class) scored at EP=1, EP=2 and with EP beside TP and PP (gloo,
1-4 CPU processes), HF->Megatron->HF bit-exact, both router rules (`norm_topk_prob`), and
the dist-checkpoint written at EP=2 read back at EP=1."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_seed.models.parity import check_parity
from megatron_seed.models.tiny import make_tiny_qwen


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {
        renorm: make_tiny_qwen(root / f"renorm-{renorm}", seed=5, model_type="qwen3_moe",
                               norm_topk_prob=renorm)
        for renorm in (True, False)
    }  # fmt: skip


@pytest.mark.parametrize("tp,pp,ep", [(1, 1, 1), (1, 1, 2), (2, 1, 2), (1, 2, 2)])
def test_moe_logprob_parity_and_roundtrip(moe, tp, pp, ep):
    result = check_parity(moe[True], tp, pp, batch=2, seq=32, ep=ep)
    assert result["max_abs_diff"] <= 1e-4, result
    assert result["ranks_agree"], result
    assert result["roundtrip_exact"], result["mismatched"]


def test_the_router_without_renormalisation_matches_too(moe):
    """norm_topk_prob=False: the softmax over all experts weighs the chosen ones (Megatron's
    pre-softmax routing); the renormalised rule would be off by the dropped mass."""
    result = check_parity(moe[False], 1, 1, batch=2, seq=32, ep=2)
    assert result["max_abs_diff"] <= 1e-4, result


def test_parity_sees_a_router_that_weighs_experts_wrongly(moe, tmp_path):
    """The check can fail: the same weights under the other router rule score differently."""
    from megatron_seed.models.parity import hf_reference_logprobs, random_batch

    other = tmp_path / "other-rule"
    other.mkdir()
    for f in moe[True].iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "norm_topk_prob": False}))
    ids = random_batch(cfg["vocab_size"], 2, 32)
    diff = hf_reference_logprobs(other, ids) - hf_reference_logprobs(moe[True], ids)
    assert diff.abs().max() > 1e-3
    assert check_parity(other, 1, 1, batch=2, seq=32)["max_abs_diff"] <= 1e-4


def test_a_checkpoint_written_at_ep2_reads_back_at_ep1(moe, tmp_path):
    """hf-to-megatron at EP=2 (a dist-checkpoint, every expert saved once by its owner),
    then megatron-to-hf at EP=1: the HF tensors come back bit-exact."""
    from safetensors.torch import load_file

    from megatron_seed.cli import main

    src = moe[True]
    assert main(["convert", "hf-to-megatron", "--hf", str(src), "--out", str(tmp_path / "m"),
                 "--ep", "2"]) == 0  # fmt: skip
    assert main(["convert", "megatron-to-hf", "--megatron", str(tmp_path / "m"),
                 "--out", str(tmp_path / "hf")]) == 0  # fmt: skip
    before = load_file(str(src / "model.safetensors"))
    after = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert sorted(before) == sorted(after)
    assert all(torch.equal(before[k], after[k]) for k in before)
