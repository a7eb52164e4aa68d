"""Core attention for the local (non-Transformer-Engine) layer spec.

Megatron's `DotProductAttention` materialises the `[b, heads, s, s]` score matrix, masks it,
softmaxes it and multiplies it by V: on a CPU that is most of a long sequence's forward and
backward time. `SdpaDotProductAttention` keeps its parameters, state dict and every other
behaviour, and computes the common case, a causal mask given as `attention_mask=None` with
no dropout, window or query-key layer scaling, with `torch.nn.functional.
scaled_dot_product_attention` instead (a fused, memory-efficient kernel on CPU). Anything
else falls back to Megatron's own path. The two agree to float rounding (tested).

Packed sequences (`PackedSeqParams` with `qkv_format="thd"`, `megatron_seed.data.packing`):
Megatron's `DotProductAttention` refuses them; here query/key/value arrive as `[t, heads,
hn]` (Megatron squeezes the batch dimension of one packed row, and has already applied RoPE
per segment from `cu_seqlens`), and each segment `cu_seqlens[j] .. cu_seqlens[j+1]` gets
causal attention over itself only: the same fused call as an unpacked sequence of that
length, one segment at a time, so packed and separate sequences agree to float rounding.
This is the local spec's counterpart of Transformer Engine's `thd` kernels (the same
`PackedSeqParams` reach both). Anything the fused path does not cover (an explicit mask,
attention dropout in training, a window, a bias, padding inside segments) is an error there.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SdpaDotProductAttention(DotProductAttention):
    """`DotProductAttention` with torch's fused kernel for plain causal self-attention."""

    def _plain_causal(self, mask: Any, mask_type: Any, kwargs: dict) -> bool:
        """Causal attention with nothing the fused kernel lacks (mask, bias, window...)."""
        cfg = self.config
        return (
            mask is None
            and (mask_type or self.attn_mask_type) == AttnMaskType.causal
            and kwargs.get("attention_bias") is None
            and self.softmax_offset is None
            and cfg.window_size is None
            and not cfg.apply_query_key_layer_scaling
            and (cfg.attention_dropout == 0.0 or not self.training)
        )

    def _fused_ok(
        self, query: torch.Tensor, key: torch.Tensor, mask: Any, mask_type: Any, kwargs: dict
    ) -> bool:
        return (
            self._plain_causal(mask, mask_type, kwargs)
            and query.shape[0] == key.shape[0]  # self-attention over the whole sequence
            and kwargs.get("packed_seq_params") is None
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
        """query: [sq, b, np, hn]; key, value: [sk, b, ng, hn] -> context [sq, b, np * hn].
        Packed (thd): query [t, np, hn]; key, value [t, ng, hn] -> context [t, np * hn]."""
        if kwargs.get("packed_seq_params") is not None:
            return self._packed(query, key, value, attention_mask, attn_mask_type, kwargs)
        if not self._fused_ok(query, key, attention_mask, attn_mask_type, kwargs):
            return super().forward(query, key, value, attention_mask, attn_mask_type, **kwargs)
        sq, b = query.shape[:2]
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        context = self._causal(q, k, v)  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [b, np, s, hn]; k, v: [b, ng, s, hn] -> [b, np, s, hn], causal."""
        heads, groups = q.shape[1], k.shape[1]
        if groups != heads:  # grouped-query attention: each group serves heads/groups queries
            k = k.repeat_interleave(heads // groups, dim=1)  # [b, np, s, hn]
            v = v.repeat_interleave(heads // groups, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale
        )

    def _packed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: Any,
        mask_type: Any,
        kwargs: dict,
    ) -> torch.Tensor:
        """Causal attention inside each segment of one packed row (thd, see the module)."""
        params = kwargs["packed_seq_params"]
        if params.qkv_format != "thd":
            raise ValueError(f"packed sequences need qkv_format 'thd', got {params.qkv_format!r}")
        if not self._plain_causal(mask, mask_type, kwargs):
            raise ValueError(
                "packed sequences on the local attention need plain causal self-attention "
                "(no mask, bias, window or attention dropout in training)"
            )
        bounds = params.cu_seqlens_q.tolist()
        for other in (
            params.cu_seqlens_kv,
            params.cu_seqlens_q_padded,
            params.cu_seqlens_kv_padded,
        ):
            if other is not None and other.tolist() != bounds:
                raise ValueError(
                    "the local attention packs self-attention with no padding inside a "
                    "segment: every cu_seqlens of PackedSeqParams must be the same"
                )
        t = query.shape[0]
        if query.dim() != 3 or bounds[0] != 0 or bounds[-1] != t or key.shape[0] != t:
            raise ValueError(
                f"cu_seqlens {bounds} do not cover the packed row's {t} tokens "
                f"(query {tuple(query.shape)}, key {tuple(key.shape)})"
            )
        pieces = []
        for a, b in pairwise(bounds):
            if b == a:
                continue
            q = query[a:b].transpose(0, 1).unsqueeze(0)  # [1, np, n, hn]
            k = key[a:b].transpose(0, 1).unsqueeze(0)  # [1, ng, n, hn]
            v = value[a:b].transpose(0, 1).unsqueeze(0)  # [1, ng, n, hn]
            pieces.append(self._causal(q, k, v)[0].transpose(0, 1))  # [n, np, hn]
        return torch.cat(pieces, dim=0).reshape(t, self.hidden_size_per_partition)
