"""Core attention for the local (non-Transformer-Engine) layer spec.

Megatron's `DotProductAttention` materialises the `[b, heads, s, s]` score matrix, masks it,
softmaxes it and multiplies it by V: on a CPU that is most of a long sequence's forward and
backward time. `SdpaDotProductAttention` keeps its parameters, state dict and every other
behaviour, and computes the common case, a causal mask given as `attention_mask=None` with
no dropout, window or query-key layer scaling, with `torch.nn.functional.
scaled_dot_product_attention` instead (a fused, memory-efficient kernel on CPU). Anything
else falls back to Megatron's own path. The two agree to float rounding (tested).
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SdpaDotProductAttention(DotProductAttention):
    """`DotProductAttention` with torch's fused kernel for plain causal self-attention."""

    def _fused_ok(
        self, query: torch.Tensor, key: torch.Tensor, mask: Any, mask_type: Any, kwargs: dict
    ) -> bool:
        cfg = self.config
        return (
            mask is None
            and query.shape[0] == key.shape[0]  # self-attention over the whole sequence
            and (mask_type or self.attn_mask_type) == AttnMaskType.causal
            and kwargs.get("attention_bias") is None
            and kwargs.get("packed_seq_params") is None
            and self.softmax_offset is None
            and cfg.window_size is None
            and not cfg.apply_query_key_layer_scaling
            and (cfg.attention_dropout == 0.0 or not self.training)
        )

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """query: [sq, b, np, hn]; key, value: [sk, b, ng, hn] -> context [sq, b, np * hn]."""
        if not self._fused_ok(query, key, attention_mask, attn_mask_type, kwargs):
            return super().forward(query, key, value, attention_mask, attn_mask_type, **kwargs)
        sq, b, heads, _ = query.shape
        groups = key.shape[2]
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        if groups != heads:  # grouped-query attention: each group serves heads/groups queries
            k = k.repeat_interleave(heads // groups, dim=1)  # [b, np, sk, hn]
            v = v.repeat_interleave(heads // groups, dim=1)
        context = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale
        )  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
