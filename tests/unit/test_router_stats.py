"""`RouterStats` reads nothing back per router call and once per `pop`, counts a forward
that activation recompute re-runs in backward once, and reports the statistics the same
routers give by hand (issue #54: three host syncs per router call, doubled under recompute).

The routers are stand-ins for megatron's `TopKRouter` (its class, so the hooks find them;
its `gating` and the `(probs, routing_map)` it returns; none of its set-up). A "read-back"
is any `torch.Tensor` call that brings a value to the host: on a GPU each one waits for the
device (`torch.cuda.set_sync_debug_mode` would flag them), on the CPU they are counted here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from megatron.core.transformer.moe.router import TopKRouter
from torch.utils.checkpoint import checkpoint

from megatron_seed.models.router_stats import RouterStats

LAYERS, EXPERTS, TOP_K, HIDDEN = 2, 8, 2, 16
# torch.Tensor methods that hand a value to Python; masked indexing and `nonzero` read the
# count of selected elements back to size their result
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
READ_FUNCTIONS = ("nonzero", "masked_select", "unique")


class _Router(TopKRouter):
    """Megatron's top-k router as `RouterStats` sees it: a linear gating, then the top k."""

    def __init__(self, layer_number: int, seed: int) -> None:
        torch.nn.Module.__init__(self)  # not TopKRouter's: it needs model-parallel state
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(EXPERTS, HIDDEN, generator=g))
        self.layer_number = layer_number  # 1-based, as megatron's

    def gating(self, input: torch.Tensor) -> torch.Tensor:  # [s, b, h] -> [s * b, E]
        return input.reshape(-1, HIDDEN) @ self.weight.t()

    def forward(
        self, input: torch.Tensor, padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gating(input)  # [T, E]
        top = torch.softmax(logits, dim=-1).topk(TOP_K, dim=-1)  # [T, k]
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top.indices, True)
        return top.values, routing_map  # [T, k], [T, E]


def _micro_batch(seed: int, s: int = 6, b: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden `[s, b, h]`, padding `[s, b]`, True at padding: row 1's last 2 tokens)."""
    g = torch.Generator().manual_seed(seed)
    padding = torch.zeros(s, b, dtype=torch.bool)
    padding[-2:, 1] = True
    return torch.randn(s, b, HIDDEN, generator=g), padding


def _by_hand(routers: list[_Router], batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """The metrics of every router over `batches`, counted once each, with masked indexing."""
    out, balance, entropy = {}, [], []
    with torch.no_grad():
        for layer, router in enumerate(routers):
            load, ent, tokens = torch.zeros(EXPERTS, dtype=torch.float64), 0.0, 0
            for hidden, padding in batches:
                real = ~padding.reshape(-1)  # [T]
                probs = torch.softmax(router.gating(hidden).float(), dim=-1)[real]  # [t, E]
                chosen = probs.topk(TOP_K, dim=-1).indices  # [t, k]
                load += torch.zeros_like(probs).scatter(1, chosen, 1.0).sum(0).double()
                ent += float(-(probs * probs.log()).sum())
                tokens += int(real.sum())
            balance.append(float(load.max() / load.mean()))
            entropy.append(ent / tokens)
            out[f"moe/load_max_mean/layer_{layer}"] = balance[-1]
            out[f"moe/router_entropy/layer_{layer}"] = entropy[-1]
    out["moe/load_max_mean"] = max(balance)
    out["moe/router_entropy"] = sum(entropy) / len(entropy)
    return out


def _counted(fn: Callable, reads: list[str]) -> Callable:
    def wrapper(*args, **kwargs):
        reads.append(fn.__name__)
        return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def host_reads() -> Iterator[list[str]]:
    """Inside: each read-back (see `READS`, plus indexing by a boolean tensor) appends its
    name to the list yielded."""
    reads: list[str] = []
    getitem = torch.Tensor.__getitem__

    def indexing(self: torch.Tensor, index: object) -> torch.Tensor:
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            reads.append("x[mask]")
        return getitem(self, index)

    with pytest.MonkeyPatch.context() as mp:
        for name in READS:
            mp.setattr(torch.Tensor, name, _counted(getattr(torch.Tensor, name), reads))
        for name in READ_FUNCTIONS:
            mp.setattr(torch, name, _counted(getattr(torch, name), reads))
            mp.setattr(torch.Tensor, name, _counted(getattr(torch.Tensor, name), reads))
        mp.setattr(torch.Tensor, "__getitem__", indexing)
        yield reads


def _model() -> tuple[torch.nn.ModuleList, RouterStats]:
    routers = torch.nn.ModuleList([_Router(i + 1, seed=10 + i) for i in range(LAYERS)])
    return routers, RouterStats(routers, LAYERS, EXPERTS)


def test_a_router_call_reads_nothing_back_and_pop_reads_back_once() -> None:
    routers, stats = _model()
    batches = [_micro_batch(seed) for seed in range(3)]
    routers[0](*_micro_batch(99))  # outside `collecting`: not counted
    per_call = []
    with stats.collecting():
        for hidden, padding in batches:
            for router in routers:
                with host_reads() as reads:
                    router(hidden, padding)  # the model passes the padding positionally
                per_call.append(list(reads))
    assert per_call == [[]] * (len(batches) * LAYERS)
    with host_reads() as reads:
        metrics = stats.pop()
    assert reads == ["tolist"]  # the sums of every layer, once
    want = _by_hand(list(routers), batches)
    assert metrics.keys() == want.keys()
    for key, value in want.items():  # loads are whole numbers: their ratio is exact
        assert metrics[key] == (value if "load" in key else pytest.approx(value, rel=1e-6)), key
    assert stats.pop() == {}  # a pop starts over


def test_a_forward_recomputed_in_backward_is_counted_once() -> None:
    """Micro-batch A runs under reentrant activation checkpointing (megatron's full
    recompute is the same mechanism: an autograd function whose backward runs the forward
    again, hooks and all), B without: the statistics are those of A and B once each, not A
    twice (which, mixed with B, moves them)."""
    routers, stats = _model()
    a, b = _micro_batch(1), _micro_batch(2)
    with stats.collecting():
        hidden, padding = a
        hidden = hidden.clone().requires_grad_(True)
        for router in routers:
            probs, _ = checkpoint(router, hidden, padding, use_reentrant=True)
            probs.sum().backward()  # re-runs the router's forward
        for router in routers:
            probs, _ = router(*b)
            probs.sum().backward()
    metrics = stats.pop()
    once, twice = _by_hand(list(routers), [a, b]), _by_hand(list(routers), [a, a, b])
    assert twice["moe/load_max_mean/layer_0"] != once["moe/load_max_mean/layer_0"]
    assert metrics == pytest.approx(once, rel=1e-6)
