"""The GPU hand-over between colocated engines and the trainer (`fleet.colocate`).

Nothing is taken before the other side has let it go: each step that frees memory on one
side is followed by a barrier over the trainer ranks before the other side allocates.
`launch.layout.colocated_memory_gib` sizes each phase.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from megatron_seed.pipeline.collective import barrier


def build_beside_engines(side: Any, build: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """The colocated start: the engines have started and sized their share of each GPU;
    they sleep, `build()` makes the trainer (and resumes it) on the freed memory, the
    trainer gives back its gradient buffers and optimizer state until it trains, and the
    engines wake. Returns `build()`'s (trainer, resumed checkpoint or None)."""
    side.sleep()
    barrier()  # no rank allocates before every engine has let its GPU go
    trainer, resumed = build()
    trainer.release_memory()
    barrier()  # no engine takes memory back before every rank has given it
    side.wake()
    return trainer, resumed


@contextmanager
def trainer_turn(side: Any, trainer: Any) -> Iterator[None]:
    """Around the train phase: engines sleep -> the trainer takes back its optimizer state
    and gradient buffers -> (train) -> the trainer offloads its optimizer state and frees
    its gradients and cached activations -> the engines wake their weights (the sync then
    puts the trainer's bf16 weights and its staging buffer beside them)."""
    side.sleep()
    barrier()
    trainer.reclaim_memory()
    yield
    trainer.release_memory()
    barrier()
    side.wake(["weights"])


def kv_cache_back(side: Any) -> None:
    """After the sync: every rank's staging buffer is released, the engines wake their KV
    cache (the refit probe needs it)."""
    barrier()
    side.wake(["kv_cache"])
