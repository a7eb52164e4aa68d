"""Tiny GGUF files written here with the `gguf` package's writer, as llama.cpp's converter
writes them: a tiny HF Llama's tensors (F32 norms and o_proj, an F16 embedding and
down_proj, Q8_0 and Q4_1 projections, q/k rows permuted for llama.cpp's RoPE) and the tiny
tokenizer and its chat template as metadata (`write_llama_gguf`)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
# HF name suffix -> (GGUF name suffix, stored type); layer tensors are blk.{i}.<suffix>
LAYER_TENSORS = {
    "input_layernorm.weight": ("attn_norm.weight", Q.F32),
    "self_attn.q_proj.weight": ("attn_q.weight", Q.Q8_0),
    "self_attn.k_proj.weight": ("attn_k.weight", Q.Q4_1),
    "self_attn.v_proj.weight": ("attn_v.weight", Q.Q4_1),
    "self_attn.o_proj.weight": ("attn_output.weight", Q.F32),
    "post_attention_layernorm.weight": ("ffn_norm.weight", Q.F32),
    "mlp.gate_proj.weight": ("ffn_gate.weight", Q.Q4_1),
    "mlp.up_proj.weight": ("ffn_up.weight", Q.Q8_0),
    "mlp.down_proj.weight": ("ffn_down.weight", Q.F16),
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": ("token_embd.weight", Q.F16),
    "model.norm.weight": ("output_norm.weight", Q.F32),
    "lm_head.weight": ("output.weight", Q.Q8_0),
}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for its RoPE (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _stored(name: str, w: np.ndarray, qtype: int, cfg: dict) -> np.ndarray:
    """The tensor as the file stores it (q/k permuted, quantized)."""
    if name.endswith("q_proj.weight"):
        w = permute(w, cfg["num_attention_heads"])
    elif name.endswith("k_proj.weight"):
        w = permute(w, cfg["num_key_value_heads"])
    return gguf.quants.quantize(np.ascontiguousarray(w), qtype)


def write_llama_gguf(hf_dir: Path, tokenizer, path: Path, arch: str = "llama", extra=()) -> dict:
    """Write `hf_dir` (a tiny HF Llama) as a GGUF file; return the HF tensors the file
    holds after dequantization (what an import must reproduce exactly)."""
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    sd = {k: v.numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    _add_tokenizer(w, tokenizer, cfg["vocab_size"])
    expected: dict[str, torch.Tensor] = {}
    names = {**GLOBAL_TENSORS}
    for i in range(cfg["num_hidden_layers"]):
        for hf, (name, qtype) in LAYER_TENSORS.items():
            names[f"model.layers.{i}.{hf}"] = (f"blk.{i}.{name}", qtype)
    for hf, (name, qtype) in names.items():
        data = _stored(hf, sd[hf], qtype, cfg)
        w.add_tensor(name, data, raw_dtype=qtype)
        expected[hf] = _dequantized(sd[hf], qtype)
    for name, array, qtype in extra:  # (name, array, stored type or None)
        w.add_tensor(name, array, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def _dequantized(w: np.ndarray, qtype: int) -> torch.Tensor:
    """`w` stored as `qtype` and read back (per row block: it commutes with the q/k row
    permutation, so the permuted file reads back to this, rows restored)."""
    stored = gguf.quants.quantize(np.ascontiguousarray(w), qtype)
    return torch.from_numpy(gguf.quants.dequantize(stored, qtype).reshape(w.shape).copy())


def _add_tokenizer(w, tokenizer, vocab: int) -> None:
    """The tiny tokenizer as llama.cpp's metadata: byte-level BPE ("gpt2") with Qwen2's split
    regex ("qwen2"), its special tokens as CONTROL, padded to the model's vocabulary."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    ids = {t: i for t, i in spec["model"]["vocab"].items()}
    tokens = [t for t, _ in sorted(ids.items(), key=lambda kv: kv[1])]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(tokenizer.chat_template)
