"""Per-token NLL over chunks of the sequence, so logits never exist for the whole of it.

`GPTModel(..., labels=...)` runs the output layer over the whole micro-batch and then
vocab-parallel cross entropy: float32 logits `[s, b, V/TP]` live at once, and the cross
entropy keeps its softmax of the same size for backward. At Qwen's vocabulary (151,936) and
4,096 tokens that is ~2.5 GB per tensor at TP=1, for every scoring and training pass.

`ChunkedLossGPTModel` computes the same NLL `[b, s]` chunk by chunk: each chunk of about
`logit_chunk_tokens` tokens (over the micro-batch's rows) goes through the output layer and
Megatron's own cross entropy (`compute_language_model_loss`, with whatever fusion the config
picks), and only its NLL is kept. In training each chunk runs under activation checkpointing,
so backward recomputes one chunk's logits at a time: logits memory is O(chunk x V/TP) in
forward and backward, at the cost of one more output-layer GEMM per chunk in backward. The
values are the same numbers in another order of evaluation (per-token results are
independent of the chunking; gradients are sums over chunks).

Sequence parallelism: each TP rank holds `s/TP` positions of the hidden states and the output
layer all-gathers them, so local chunk j of every rank becomes one logits chunk whose rows
are positions `r*(s/TP) + j*c + i` (rank r, offset i < c). Labels are taken, and NLL put
back, in that interleaved order.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.models.gpt import GPTModel
from torch.utils.checkpoint import checkpoint


class ChunkedLossGPTModel(GPTModel):
    """`GPTModel` whose labelled forward scores the sequence in chunks (see module docstring).

    `logit_chunk_tokens` <= 0, or a micro-batch that fits in one chunk, takes `GPTModel`'s
    own path unchanged; so does everything without labels (logits), MTP and inference.
    """

    logit_chunk_tokens: int = 0

    def _postprocess(self, hidden_states: torch.Tensor, labels: Any = None, **kwargs: Any) -> Any:
        inference = kwargs.get("inference_context") is not None and not self.training
        plain = (
            labels is None
            or not self.post_process
            or inference
            or self.config.mtp_num_layers is not None
            or self.logit_chunk_tokens <= 0
        )
        if not plain:
            sp = self.output_layer.sequence_parallel
            tp = self.config.tensor_model_parallel_size if sp else 1
            s_local, b = hidden_states.shape[0], hidden_states.shape[1]
            step = max(1, self.logit_chunk_tokens // (b * tp))  # local positions per chunk
            if step < s_local:
                return self._chunked_nll(hidden_states, labels, step, tp)
        return super()._postprocess(hidden_states=hidden_states, labels=labels, **kwargs)

    def _chunked_nll(
        self, hidden: torch.Tensor, labels: torch.Tensor, step: int, tp: int
    ) -> torch.Tensor:
        """NLL `[b, s]` of `labels` (`[b, s]`) from hidden states `[s/tp, b, h]`."""
        s_local, b = hidden.shape[0], hidden.shape[1]
        weight = (
            self.shared_embedding_or_output_weight()
            if self.share_embeddings_and_output_weights
            else None
        )
        by_rank = labels.view(b, tp, s_local)  # [b, tp, s/tp]: rank r's positions in row r
        parts = []
        for start in range(0, s_local, step):
            end = min(start + step, s_local)
            chunk_labels = by_rank[:, :, start:end].reshape(b, tp * (end - start))  # [b, c]
            args = (hidden[start:end], chunk_labels, weight)
            if torch.is_grad_enabled():
                nll = checkpoint(self._chunk_nll, *args, use_reentrant=False)
            else:
                nll = self._chunk_nll(*args)
            parts.append(nll.view(b, tp, end - start))  # [b, tp, c/tp]
        return torch.cat(parts, dim=2).view(b, tp * s_local)  # [b, s]

    def _chunk_nll(
        self, hidden: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None
    ) -> torch.Tensor:
        """One chunk: hidden `[c/tp, b, h]`, labels `[b, c]` -> NLL `[b, c]`."""
        logits, _ = self.output_layer(hidden, weight=weight)  # [c, b, V/TP]
        return self.compute_language_model_loss(labels, logits)
