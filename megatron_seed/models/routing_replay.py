"""Routing replay (R3): a mixture-of-experts model in the trainer routes each token to the
experts the rollout engine chose for it, and a count of how often it would have anyway.

An MoE model's log-probs depend on which k experts each router picks per token. The engine
and the trainer compute the router logits with different kernels (and precisions), so near
ties go different ways: the trainer scores sequences through other experts than the engine
that sampled them, one more source of training-inference mismatch. Rollout routing replay
(Ma et al., 2025) removes it: the engine's routes (`rollout.engine.VLLMEngine.routes`, per
token and MoE layer) travel with the batch (`TokenBatch.routes`, `[b, s, layers, k]`), and
every trainer pass over those sequences uses them.

megatron-core 0.16 has the hook for it: its top-k routing asks the router's `router_replay`
object (`megatron.core.transformer.moe.router_replay.RouterReplay`) for the top k when one is
set. `RouteReplay` is that object, one per router, installed by `install`; it differs from
megatron's own in three ways the trainer needs:

- a token whose route is `NO_ROUTE` (padding, rows with no engine routes such as analyzer
  replay's) routes as usual, the others as given (megatron's replays all tokens or none);
- under full activation recompute each layer's forward runs twice, once in the schedule's
  forward (no grad) and again in backward (with grad), and with pipeline parallelism other
  micro-batches' forwards come in between: the routes of every micro-batch wait in a queue
  for their recomputation, in order (the schedule runs backward in forward order);
- it counts, over the tokens marked scored, how often the router's own top-k set equals
  the engine's (`route_agreement`) and how often the set it used does (`routes_replayed`:
  1.0 when replaying; a sign that the hook ran, since the fused router kernel, which never
  asks it, is refused).

The reference model replays the same routes as the policy (R3 replays every log-prob
computation over the rollout's tokens): with replay on, the KL term compares the two on the
engine's experts.

Routes are given per whole sequence; each router takes its own slice: its layer among the
model's MoE layers, and, under sequence parallelism, this TP rank's part of the sequence
(the router sees `[s / TP, b]` tokens, flattened in `[s, b]` order).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from megatron.core.transformer.moe.router_replay import RouterReplay

from megatron_seed.data.collate import NO_ROUTE

_INSTALLED: weakref.WeakKeyDictionary[Any, ModelRoutes] = weakref.WeakKeyDictionary()


class ModelRoutes:
    """The routing replay of one model: its routers' `RouteReplay` objects and their counts."""

    def __init__(self, model: Any, sparse_layers: tuple[bool, ...], replay: bool) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.replay = replay
        # whole-model layer index -> index among the MoE layers (the engine's layer axis)
        moe_index = {
            layer: j for j, layer in enumerate(i for i, s in enumerate(sparse_layers) if s)
        }
        self.layers, self.k = len(moe_index), 0  # the routes' [layers, k] this model takes
        self.routers: list[RouteReplay] = []
        self.sequence_parallel = False
        for module in model.modules():
            if isinstance(module, TopKRouter):
                _check_router(module.config)
                module.router_replay = RouteReplay(self, moe_index[module.layer_number - 1])
                self.routers.append(module.router_replay)
                self.sequence_parallel = module.config.sequence_parallel
                self.k = module.topk
        # scored, own set == the route, used set == the route; on the routers' device (no
        # host sync per layer), summed over ranks at `pop`
        self.counts: torch.Tensor | None = None
        self.active = False

    def feed(self, batch: dict[str, Any], recompute: bool) -> None:
        """Hand every router its slice of the micro-batch's `routes` (`[b, s, layers, k]`)
        and, when counting, `scored` (`[b, s]` bool); `recompute`: this forward is one that
        full activation recompute will run again in backward."""
        from megatron.core import parallel_state as ps

        routes = batch["routes"]  # on the model's device: no copy per router call
        if tuple(routes.shape[2:]) != (self.layers, self.k):
            raise ValueError(
                f"routes for {routes.shape[2]} MoE layers x top-{routes.shape[3]}; this model "
                f"has {self.layers} x top-{self.k}"
            )
        scored = batch.get("scored") if self.active else None
        s = routes.shape[1]
        tp, rank = 1, 0
        if self.sequence_parallel:
            tp = ps.get_tensor_model_parallel_world_size()
            rank = ps.get_tensor_model_parallel_rank()
        part = slice(rank * s // tp, (rank + 1) * s // tp)
        for r in self.routers:
            given = routes[:, part, r.layer].transpose(0, 1).reshape(-1, routes.shape[-1])
            mask = None if scored is None else scored[:, part].transpose(0, 1).reshape(-1)
            r.set_routes(given.long(), mask, recompute)  # [s/tp * b, k], [s/tp * b]

    def count(
        self, routes: torch.Tensor, own: torch.Tensor, used: torch.Tensor, scored: torch.Tensor
    ) -> None:
        """Add one router call's scored tokens (`[tokens]` bool) and how many of them have
        the router's `own` / the `used` top-k set (`[tokens, k]`) equal to `routes`'."""
        target = routes.sort(-1).values
        same = [(x.sort(-1).values == target).all(-1) & scored for x in (own, used)]
        add = torch.stack([scored.sum(), *(s.sum() for s in same)]).double()  # [3]
        self.counts = add if self.counts is None else self.counts + add

    def reset(self) -> None:
        """Forget every router's routes (a schedule's start and end)."""
        for r in self.routers:
            r.clear_indices()

    def check_drained(self) -> None:
        """After a schedule: every recomputation took its routes (or the order is broken)."""
        left = sum(len(r.recomputed) for r in self.routers)
        if left:
            raise RuntimeError(f"routing replay: {left} routes were never recomputed")

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """Route the given tokens as given inside this block, whatever `replay` says (the
        refit probe: the trainer scores it on each engine's routes)."""
        saved, self.replay = self.replay, True
        try:
            yield
        finally:
            self.replay = saved

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count agreement over the `scored` tokens of the passes inside this block."""
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def pop(self) -> dict[str, float]:
        """The agreement shares of what was counted since the last pop, summed over every
        rank (a collective: every rank calls it); {} when nothing was counted."""
        import torch.distributed as dist

        device = "cuda" if torch.cuda.is_available() else "cpu"
        counts = torch.zeros(3, dtype=torch.float64, device=device)
        if self.counts is not None:
            counts += self.counts.to(device)
        self.counts = None
        if dist.is_initialized():  # a rank whose routers saw no scored token sends zeros
            dist.all_reduce(counts)
        counts = counts.cpu()
        if counts[0] == 0:
            return {}
        return {
            "moe/route_agreement": float(counts[1] / counts[0]),
            "moe/routes_replayed": float(counts[2] / counts[0]),
        }


def _check_router(config: Any) -> None:
    """`ValueError` for a router setting under which replay would not hold: the fused
    kernel asks no replay object; megatron's "moe" recompute reruns the router in backward
    outside the full-recompute order `RouteReplay` keeps."""
    if config.moe_router_fusion:
        raise ValueError("routing replay needs the unfused router (moe_router_fusion)")
    if config.recompute_granularity == "selective" and "moe" in (config.recompute_modules or []):
        raise ValueError("routing replay supports full or attention-only recompute, not 'moe'")


class RouteReplay(RouterReplay):
    """One router's routes for the micro-batch in flight (megatron's `RouterReplay` hook)."""

    def __init__(self, owner: ModelRoutes, layer: int) -> None:
        super().__init__()
        # megatron keeps every instance in a class-wide list for its static helpers, which
        # would also hold other models' routers; this one is driven through its owner only
        type(self).global_router_replay_instances.remove(self)
        self.owner = owner
        self.layer = layer  # index among the model's MoE layers
        self.scored: torch.Tensor | None = None
        self.recomputed: deque[tuple[torch.Tensor, torch.Tensor | None]] = deque()

    def set_routes(
        self, routes: torch.Tensor, scored: torch.Tensor | None, recompute: bool
    ) -> None:
        """The routes `[tokens, k]` (`NO_ROUTE` rows route freely) of the next forward."""
        self.target_topk_idx, self.scored = routes, scored
        if recompute:
            self.recomputed.append((routes, scored))

    def clear_indices(self) -> None:
        super().clear_indices()
        self.scored = None
        self.recomputed.clear()

    def get_replay_topk(
        self,
        scores: torch.Tensor,
        topk: int,
        num_groups: int | None = None,
        group_topk: int | None = None,
        default_compute_topk: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(`scores` at the chosen experts, their indices), both `[tokens, k]`: the given
        experts on tokens with a route, the top k of `scores` (`[tokens, E]`) elsewhere."""
        own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)[1]
        if torch.is_grad_enabled() and self.recomputed:  # backward's recomputation
            routes, scored = self.recomputed.popleft()
            count = False
        else:
            routes, scored = self.target_topk_idx, self.scored
            count = True
        if routes is None:
            return scores.gather(1, own), own
        given = routes[:, :1] != NO_ROUTE  # [tokens, 1]
        used = torch.where(given, routes, own) if self.owner.replay else own  # [tokens, k]
        if count and scored is not None:
            self.owner.count(routes, own, used, scored & given[:, 0])
        return scores.gather(1, used), used


def install(model: Any, sparse_layers: tuple[bool, ...], replay: bool) -> ModelRoutes:
    """Give every MoE router of `model` a `RouteReplay` (`replay`: route the given tokens as
    given; else only count agreement)."""
    routes = ModelRoutes(model, sparse_layers, replay)
    _INSTALLED[model] = routes
    return routes


def routes_of(model: Any) -> ModelRoutes | None:
    """The `ModelRoutes` installed on `model` (or the module it wraps), if any."""
    for m in (model, getattr(model, "module", None)):
        if m is not None and m in _INSTALLED:
            return _INSTALLED[m]
    return None
