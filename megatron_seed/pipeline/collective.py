"""The few collectives the Stage-2 driver needs, each a no-op without a process group."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _grouped() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This trainer rank (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank."""
    if not _grouped():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_or_raise(result: Any, error: type[Exception], context: str) -> Any:
    """Rank 0's `result` on every rank, or, where it is an error message (a `str`: rank 0
    caught its failure and sends it instead of leaving the others waiting on the broadcast),
    `error("CONTEXT: MESSAGE")` raised on every rank."""
    got = broadcast(result)
    if isinstance(got, str):
        raise error(f"{context}: {got}")
    return got


def barrier() -> None:
    """Every rank reaches this point before any goes on."""
    if _grouped():
        dist.barrier()


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on any rank."""
    if not _grouped():
        return flag
    t = torch.tensor([float(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
