"""The engine's route read-back (`VLLMEngine.routes`) on a GPU engine, which runs with CUDA
graphs: the route record (`worker_extension.RouteBuffer`) must see every token of a short
sequence (one a captured graph would replay) and of a long one, and pick the experts
transformers' routers pick (float32) on all but near ties (the engine computes in bfloat16).
The CPU engines' exact checks are in tests/distributed/test_fleet_moe.py (eager) and
test_compiled_routes.py (compiled)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
        reason="needs vLLM's CUDA build",
    ),
]


def test_a_gpu_engine_reports_the_routes_of_short_and_long_sequences(tmp_path):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine's worker in this process
    from transformers import AutoModelForCausalLM

    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.rollout.engine import VLLMEngine

    hf_dir = make_tiny_qwen(tmp_path / "moe", seed=3, model_type="qwen3_moe")
    engine = VLLMEngine(str(hf_dir), max_model_len=1024, gpu_memory_utilization=0.3)
    g = torch.Generator().manual_seed(0)
    vocab = AutoModelForCausalLM.from_pretrained(hf_dir).config.vocab_size
    sequences = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 600)]
    routes = engine.routes(sequences)  # [n, layers, k] per sequence
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    for ids, got in zip(sequences, routes, strict=True):
        assert got.shape[0] == len(ids)  # every token was seen by the hooks
        with torch.no_grad():
            logits = hf(torch.tensor([ids]), output_router_logits=True).router_logits
        k = got.shape[-1]
        for layer, per_layer in enumerate(logits):  # [n, E]
            want = per_layer.topk(k, dim=-1).indices.sort(-1).values
            same = (torch.as_tensor(got[:, layer]).long().sort(-1).values == want).all(-1)
            assert float(same.float().mean()) >= 0.9, (len(ids), layer)
