"""Routing statistics of a mixture-of-experts model's training passes: how evenly each MoE
layer's router spreads the real tokens over its experts, and how sure it is.

Per MoE layer, over the real tokens (the `padding_mask` the model gets) of every training
forward pass while `collecting`: the load, tokens routed to each expert (a token counts once
for each of its k experts), reported as max / mean over the experts (1.0 when perfectly
balanced, E / k when every token goes to the same k experts); and the router entropy, the
mean over tokens of the entropy (nats) of the softmax over all experts (log E when uniform).
Each rank counts the tokens its routers see (sequence parallelism and expert parallelism
give ranks disjoint tokens; pipeline stages own disjoint layers), so one sum over all ranks
gives the totals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class RouterStats:
    """Forward hooks on a model's MoE routers that count, while collecting, what they do."""

    def __init__(self, model: Any, num_layers: int, num_experts: int) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.num_experts = num_experts
        # per layer (0-based, the whole model's): tokens per expert, entropy sum, token count
        self.sums = torch.zeros(num_layers, num_experts + 2, dtype=torch.float64)
        self.active = False
        for module in model.modules():
            if isinstance(module, TopKRouter):
                module.register_forward_hook(self._hook, with_kwargs=True)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Count the routers' decisions inside this block."""
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def _hook(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if not self.active:
            return
        hidden = args[0]  # [s, b, h] (or [T, h])
        padding = args[1] if len(args) > 1 else kwargs.get("padding_mask")
        _, routing_map = output  # [T, E] bool
        with torch.no_grad():
            logits = module.gating(hidden).reshape(-1, self.num_experts).float()  # [T, E]
            probs = torch.softmax(logits, dim=-1)
            entropy = -(probs * torch.log(probs.clamp(min=1e-30))).sum(-1)  # [T]
            real = torch.ones_like(entropy, dtype=torch.bool)
            if padding is not None:  # True at padding
                real = ~padding.reshape(-1).bool()
            row = self.sums[module.layer_number - 1]
            row[: self.num_experts] += routing_map[real].sum(0).double().cpu()
            row[-2] += float(entropy[real].sum())
            row[-1] += float(real.sum())

    def pop(self) -> dict[str, float]:
        """The metrics of what was counted since the last pop (every rank calls it: one
        all-reduce), then start over. No metric for a layer that saw no token."""
        import torch.distributed as dist

        sums = self.sums.clone()
        if dist.is_initialized():
            device = "cuda" if torch.cuda.is_available() else "cpu"
            sums = sums.to(device)
            dist.all_reduce(sums)
            sums = sums.cpu()
        self.sums.zero_()
        out: dict[str, float] = {}
        balance, entropy = [], []
        for layer, row in enumerate(sums):
            tokens = float(row[-1])
            if tokens == 0:
                continue
            load = row[: self.num_experts]
            balance.append(float(load.max() / load.mean()))
            entropy.append(float(row[-2]) / tokens)
            out[f"moe/load_max_mean/layer_{layer}"] = balance[-1]
            out[f"moe/router_entropy/layer_{layer}"] = entropy[-1]
        if balance:
            out["moe/load_max_mean"] = max(balance)
            out["moe/router_entropy"] = sum(entropy) / len(entropy)
        return out
