"""The local layer spec's core attention (`models.attention.SdpaDotProductAttention`, torch's
fused kernel) against Megatron's own `DotProductAttention`, inside a whole GPTModel with the
same weights: per-token NLL and every parameter's gradient, at TP=1 and TP=2, for grouped
(Qwen2: 6 heads / 2 groups) and Qwen3 (q/k norms) attention."""

from __future__ import annotations

import pytest

from megatron_seed.models.parallel import spawn
from megatron_seed.testbed.tiny import make_tiny_qwen
from tests.distributed.workers import attention_paths_agree

pytestmark = pytest.mark.distributed


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
