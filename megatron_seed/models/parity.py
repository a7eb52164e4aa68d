"""Log-prob parity between transformers and megatron-seed for a HF checkpoint.

`megatron_logprobs_distributed` spawns TP x PP x EP processes (EP: a mixture-of-experts
model's experts split over the data-parallel ranks), loads the checkpoint into the sharded
Megatron model and scores a batch; `check_parity` compares with transformers.
"""

from __future__ import annotations

from pathlib import Path

import torch


def _score_worker(
    hf_dir: str, tp: int, pp: int, input_ids: torch.Tensor, mbs: int, ep: int = 1
) -> dict:
    """One rank: build the stage, load the HF weights, score, round-trip the weights."""
    import torch.distributed as dist

    from megatron_seed.models.convert import HFCheckpoint, export_hf_weights, load_hf_weights
    from megatron_seed.models.logprobs import token_logprobs
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.models.qwen import build_gpt_model

    init_parallel(tp, pp, ep=ep)
    ckpt = HFCheckpoint(hf_dir)
    model = build_gpt_model(ckpt.spec)
    load_hf_weights(model, ckpt)
    logprobs = token_logprobs(model, input_ids, micro_batch_size=mbs)
    exact = True
    mismatched: list[str] = []
    for name, tensor in export_hf_weights(model, ckpt.spec):
        if not torch.equal(tensor.cpu(), ckpt.get(name)):
            exact = False
            mismatched.append(name)
    return {
        "rank": dist.get_rank(),
        "logprobs": logprobs.cpu(),
        "roundtrip_exact": exact,
        "mismatched": mismatched,
    }


def megatron_logprobs_distributed(
    hf_dir: str | Path,
    tp: int,
    pp: int,
    input_ids: torch.Tensor,
    micro_batch_size: int = 1,
    ep: int = 1,
) -> list[dict]:
    """Score `input_ids` with the checkpoint split TP x PP (x EP) ways; one result per rank
    (every rank scores the whole batch)."""
    from megatron_seed.models.parallel import spawn

    world = tp * pp * ep
    return spawn(_score_worker, world, str(hf_dir), tp, pp, input_ids, micro_batch_size, ep)


def random_batch(vocab_size: int, batch: int = 4, seq: int = 64, seed: int = 0) -> torch.Tensor:
    """Random token ids `[batch, seq]` (no tokenizer needed)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq), generator=g)


def hf_reference_logprobs(hf_dir: str | Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token log-probs from transformers in float32."""
    from transformers import AutoModelForCausalLM

    from megatron_seed.models.logprobs import hf_token_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    return hf_token_logprobs(model, input_ids)


def check_parity(
    hf_dir: str | Path,
    tp: int,
    pp: int,
    batch: int = 4,
    seq: int = 64,
    seed: int = 0,
    ep: int = 1,
) -> dict:
    """Max |logprob diff| between transformers and megatron-seed, plus the round-trip check."""
    from megatron_seed.models.qwen import QwenSpec

    spec = QwenSpec.from_pretrained(hf_dir)
    spec.check_layout(tp, pp, ep)
    ids = random_batch(spec.vocab_size, batch, seq, seed)
    ref = hf_reference_logprobs(hf_dir, ids)
    mbs = batch // 2 if batch % 2 == 0 else 1
    results = megatron_logprobs_distributed(hf_dir, tp, pp, ids, mbs, ep)
    diffs = [float((r["logprobs"] - ref).abs().max()) for r in results]
    return {
        "max_abs_diff": max(diffs),
        "ranks_agree": all(torch.equal(r["logprobs"], results[0]["logprobs"]) for r in results),
        "roundtrip_exact": all(r["roundtrip_exact"] for r in results),
        "mismatched": sorted({m for r in results for m in r["mismatched"]}),
        "tokens": int(ids.numel()),
    }
