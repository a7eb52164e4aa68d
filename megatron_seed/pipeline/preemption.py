"""SIGTERM (what Slurm sends before it kills a preempted or timed-out job) as a request to
stop at the next update boundary, agreed by every trainer rank."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from megatron_seed.pipeline.collective import any_rank


@contextlib.contextmanager
def preemption() -> Iterator[Callable[[], bool]]:
    """Record SIGTERM instead of dying of it (main thread only); yields `asked() -> bool`,
    true on every rank once any rank was asked (a collective: call it on every rank)."""
    box = {"asked": False}

    def handler(signum: int, frame: Any) -> None:
        box["asked"] = True
        print("SIGTERM: finishing this update, then a checkpoint", flush=True)

    if threading.current_thread() is not threading.main_thread():
        yield lambda: any_rank(False)
        return
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield lambda: any_rank(box["asked"])
    finally:
        signal.signal(signal.SIGTERM, old)
