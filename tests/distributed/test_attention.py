"""The local layer spec's core attention (`models.attention.SdpaDotProductAttention`, torch's
fused kernel) against Megatron's own `DotProductAttention`, inside a whole GPTModel with the
same weights: per-token NLL and every parameter's gradient, at TP=1 and TP=2, for grouped
(Qwen2: 6 heads / 2 groups) and Qwen3 (q/k norms) attention."""

from __future__ import annotations

import pytest

from megatron_seed.models.parallel import spawn
from megatron_seed.models.tiny import make_tiny_qwen
from tests.distributed.workers import (
    attention_paths_agree,
    packed_matches_separate,
    parameter_dtypes,
)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize("tp", [1, 2])
def test_fused_attention_matches_megatron(tmp_path, model_type, tp):
    hf = make_tiny_qwen(tmp_path / model_type, seed=3, model_type=model_type)
    results = spawn(attention_paths_agree, tp, str(hf), tp, 40)
    for r in results:
        # every layer of both passes went through the fused kernel in the Sdpa model only
        assert r["fused_calls"] > 0, r
        assert r["nll_diff"] < 1e-5, r
        assert r["grad_diff"] < 1e-5 * max(1.0, r["grad_scale"]), r


@pytest.mark.parametrize(
    ("model_type", "tp", "sp"), [("qwen2", 1, False), ("qwen3", 2, False), ("qwen2", 2, True)]
)
def test_packed_sequences_match_running_each_alone(tmp_path, model_type, tp, sp):
    """Sequences packed into one row (Megatron's thd `PackedSeqParams`: RoPE restarting per
    segment, `SdpaDotProductAttention` attending within each) give each sequence's own NLL
    and gradients, at TP=1, TP=2 and TP=2 with sequence parallelism."""
    hf = make_tiny_qwen(tmp_path / model_type, seed=3, model_type=model_type)
    lengths = [13, 5, 22, 1, 9]  # sum 50: one padding token under the multiple of 2
    results = spawn(packed_matches_separate, tp, str(hf), tp, lengths, sp)
    for r in results:
        assert r["nll_scale"] > 1.0 and r["unpacked_diff"] > 1e-3, r
        assert r["nll_diff"] < 1e-5, r
        assert r["grad_diff"] < 1e-5 * max(1.0, r["grad_scale"]), r


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_a_bf16_model_holds_every_parameter_in_bf16(tmp_path, model_type):
    """torch creates its norms (the local spec's RMSNorms, Qwen3's q/k norms) in float32;
    one float32 parameter in a bf16 model falls outside Megatron's mixed-precision optimizer's
    bf16 groups and its checkpoint pairs Adam states with the wrong parameters (seen on the
    first GPU run: "Optimizer shape (896,) does not match model shape (1152,)")."""
    hf = make_tiny_qwen(tmp_path / model_type, model_type=model_type)
    (dtypes,) = spawn(parameter_dtypes, 1, str(hf), "bf16")
    assert any("q_layernorm" in n for n in dtypes) and any("layernorm" in n for n in dtypes)
    assert {n: d for n, d in dtypes.items() if d != "torch.bfloat16"} == {}
