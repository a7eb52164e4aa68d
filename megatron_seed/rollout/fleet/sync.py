"""The weight-sync client: vLLM's `VLLMWeightSyncClient` over the engine actors, with a
deadline on every call, and the watchdog around the sender. An engine that dies, stalls or
fails to load (vLLM leaves a half-reloaded model behind) is dropped from the sync and
restarted after it; with "nccl", whose broadcast needs every engine, the sync raises
`WeightSyncError` naming the engine instead of hanging."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import torch

from megatron_seed.rollout.fleet.errors import FleetError, WeightSyncError


class _SyncClient:
    """vLLM's `VLLMWeightSyncClient` over the fleet's engine actors, with deadlines.

    Every call fans out to the engines still in the sync; `update_weights` calls are
    pipelined (at most `max_inflight` outstanding per engine; Ray runs an actor's calls in
    order). An engine that dies, misses the deadline or fails to load is recorded in
    `lost` and left out of the rest of the sync, unless `needs_all` (NCCL: a broadcast
    needs every rank), where it raises `WeightSyncError` naming it."""

    def __init__(
        self,
        engines: list[Any],
        timeout_s: float,
        needs_all: bool,
        max_inflight: int = 2,
        ranks_per_engine: int = 1,
    ) -> None:
        self.engines = engines
        self.timeout_s = timeout_s
        self.needs_all = needs_all
        self.max_inflight = max_inflight
        self.ranks_per_engine = ranks_per_engine
        self.lost: dict[int, str] = {}
        self.pending: list[dict[int, Any]] = []
        self.last_progress = time.monotonic()

    def _fan(self, method: str, *args: Any) -> dict[int, Any]:
        return {
            i: getattr(e, method).remote(*args)
            for i, e in enumerate(self.engines)
            if i not in self.lost
        }

    def _settle(self, refs: dict[int, Any]) -> None:
        import ray
        import ray.exceptions as rex

        deadline = time.monotonic() + self.timeout_s
        for i, ref in refs.items():
            if i in self.lost:
                continue
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except rex.GetTimeoutError:
                self._lose(i, f"stalled: no answer within {self.timeout_s:g} s")
            except rex.RayActorError as exc:
                self._lose(i, f"died during the weight sync ({type(exc).__name__})")
            except Exception as exc:  # a failed reload leaves a broken model: fatal for it
                self._lose(i, f"failed to load the weights: {str(exc).splitlines()[-1][:300]}")
            else:
                self.last_progress = time.monotonic()

    def _lose(self, index: int, reason: str) -> None:
        self.lost[index] = reason
        if self.needs_all:
            raise WeightSyncError(f"weight sync failed: engine {index} {reason}")

    def _drain(self) -> None:
        while self.pending:
            self._settle(self.pending.pop(0))

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        if "rank_offset" not in init_info:
            self._settle(self._fan("init_weight_transfer_engine", init_info))
            return
        # NCCL: vLLM's sender gives every worker rank_offset 1 (one engine); engine i's
        # workers take ranks 1 + i * TP ... of the group
        base = init_info["rank_offset"]
        refs = {
            i: e.init_weight_transfer_engine.remote(
                {**init_info, "rank_offset": base + i * self.ranks_per_engine}
            )
            for i, e in enumerate(self.engines)
            if i not in self.lost
        }
        self._settle(refs)

    def shutdown_weight_transfer_engine(self) -> None:
        self._settle(self._fan("shutdown_weight_transfer_engine"))

    def start_weight_update(self) -> None:
        self._settle(self._fan("start_weight_update"))

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        if isinstance(update_info, list):
            raise FleetError("per-rank update infos are not used by this fleet")
        self.pending.append(self._fan("update_weights", update_info))
        if len(self.pending) > self.max_inflight:
            self._settle(self.pending.pop(0))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._drain()
        self._settle(self._fan("finish_weight_update"))


def packed_bytes(bucket_bytes: int, meta: list[Any] | None) -> int:
    """The staging buffer of a packed IPC/NCCL transfer: the bucket size, or the largest
    tensor when that is bigger (vLLM's packer refuses a tensor larger than its buffer)."""
    largest = max((math.prod(m.shape) * m.dtype.itemsize for m in meta or []), default=0)
    return max(bucket_bytes, largest)


def _watched(fn: Any, progress: Any, timeout_s: float, what: str) -> None:
    """Run `fn()` in a thread; raise `WeightSyncError` once `progress()` (the monotonic
    time of the last sign of life) is older than `timeout_s`. A transfer stuck in a
    collective cannot be interrupted: its (daemon) thread is left behind."""
    box: dict[str, BaseException] = {}
    device = torch.cuda.current_device() if torch.cuda.is_available() else None

    def target() -> None:
        if device is not None:
            torch.cuda.set_device(device)
        try:
            fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="weight-sync", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=min(1.0, timeout_s))
        if thread.is_alive() and time.monotonic() - progress() > timeout_s:
            raise WeightSyncError(f"weight sync stalled: {what} for {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
