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

The counts stay on the routers' device: a router call only queues kernels (no masked
indexing, no read-back) and `pop` reads the sums back once per update (three read-backs per
call, counted twice under recompute, were ~9k GPU stalls per update at 48 layers x 32
micro-batches). A router forward that autograd re-runs in backward (activation recompute) is
not counted: the schedule's forward counted its tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def in_backward() -> bool:
    """Whether autograd's engine is running a backward pass on this thread: a module
    forward seen then is activation recompute (megatron's `CheckpointFunction.backward`,
    `torch.utils.checkpoint`), the forward having run once before. The same test as
    `torch.utils.checkpoint`'s non-reentrant variant."""
    return torch._C._current_graph_task_id() != -1


class RouterStats:
    """Forward hooks on a model's MoE routers that count, while collecting, what they do."""

    def __init__(self, model: Any, num_layers: int, num_experts: int) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.num_layers = num_layers
        self.num_experts = num_experts
        # per layer (0-based, the whole model's): tokens per expert, entropy sum, token count;
        # float64 on the routers' device, made at the first count (None: nothing counted)
        self.sums: torch.Tensor | None = None  # [layers, E + 2]
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
        if not self.active or in_backward():
            return
        hidden = args[0]  # [s, b, h] (or [T, h])
        padding = args[1] if len(args) > 1 else kwargs.get("padding_mask")
        _, routing_map = output  # [T, E] bool
        with torch.no_grad():
            logits = module.gating(hidden).reshape(-1, self.num_experts).float()  # [T, E]
            probs = torch.softmax(logits, dim=-1)
            entropy = -(probs * torch.log(probs.clamp(min=1e-30))).sum(-1)  # [T]
            # masks multiply instead of indexing: `x[mask]` reads the mask's count back
            real = torch.ones_like(entropy, dtype=torch.bool)  # [T]
            if padding is not None:  # True at padding
                real = ~padding.reshape(-1).bool()
            weight = real.to(torch.float64)  # [T]
            row = torch.cat(  # [E + 2]
                [
                    (routing_map & real[:, None]).sum(0).to(torch.float64),  # [E]
                    (entropy.to(torch.float64) * weight).sum(0, keepdim=True),  # [1]
                    weight.sum(0, keepdim=True),  # [1]
                ]
            )
            if self.sums is None:
                self.sums = torch.zeros(
                    self.num_layers, self.num_experts + 2, dtype=torch.float64, device=row.device
                )
            self.sums[module.layer_number - 1] += row

    def pop(self) -> dict[str, float]:
        """The metrics of what was counted since the last pop (every rank calls it: one
        all-reduce, then the one read-back of the sums), then start over. No metric for a
        layer that saw no token."""
        import torch.distributed as dist

        counted = self.sums
        sums = torch.zeros(self.num_layers, self.num_experts + 2, dtype=torch.float64)
        if counted is not None:
            sums = counted.clone()
            counted.zero_()
        if dist.is_initialized():
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
            sums = sums.to(device)
            dist.all_reduce(sums)
        rows: list[list[float]] = sums.tolist()  # the read-back
        out: dict[str, float] = {}
        balance, entropy = [], []
        for layer, row in enumerate(rows):
            tokens = row[-1]
            if tokens == 0:
                continue
            load = row[: self.num_experts]  # whole numbers: their float64 sum is exact
            balance.append(max(load) / (sum(load) / self.num_experts))
            entropy.append(row[-2] / tokens)
            out[f"moe/load_max_mean/layer_{layer}"] = balance[-1]
            out[f"moe/router_entropy/layer_{layer}"] = entropy[-1]
        if balance:
            out["moe/load_max_mean"] = max(balance)
            out["moe/router_entropy"] = sum(entropy) / len(entropy)
        return out
