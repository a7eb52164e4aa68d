"""The replay copy of the last synced weights, bucket by bucket, so that a restarted engine
loads them and not the original checkpoint (even when the sync came from another process):
"memory" (Ray's object store, held by the `_FleetState` actor), "disk" (safetensors files
under `replay_dir`) or "off". The state actor also holds the current engine handles, which
`Fleet.connect` reads."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megatron_seed.rollout.weight_sync import flatten_bucket, fusion_key, tensor_bytes


@dataclass
class _Kept:
    """One bucket of the replay copy: its names, and its object (memory) or file (disk)."""

    names: list[str]
    ref: Any = None  # an ObjectRef of the FlatBucket, owned by the state actor
    path: str | None = None


class _FleetState:
    """The fleet's registry (current engine handles) and its replay copy of the last synced
    weights, bucket by bucket."""

    def __init__(self) -> None:
        self.engines: list[Any] = []
        self.kept: list[_Kept] = []  # replay order: older (partially overridden) first
        self._staged: list[_Kept] = []
        self.syncs = 0
        self.settings: dict[str, Any] = {}  # what a connected client needs of the owner

    def set_engines(self, engines: list[Any]) -> None:
        self.engines = engines

    def set_engine(self, index: int, engine: Any) -> None:
        self.engines[index] = engine

    def get_engines(self) -> list[Any]:
        return self.engines

    def set_settings(self, settings: dict[str, Any]) -> None:
        self.settings = dict(settings)

    def get_settings(self) -> dict[str, Any]:
        return self.settings

    def stage(self, names: list[str], refs: list[Any]) -> int:
        """Keep one bucket ("memory"): the sender's object `refs[0]` copied into one owned by
        this actor (the sender, and its objects, may be gone by the time a restart needs
        it; Ray has no way to hand an object's ownership over). The sender drops its own
        as soon as this returns (`_Replay.MAX_STAGING`)."""
        import ray

        self._staged.append(_Kept(names, ref=ray.put(ray.get(refs[0]))))
        return len(self._staged)

    def stage_file(self, names: list[str], path: str) -> int:
        """Keep one bucket written to disk ("disk")."""
        self._staged.append(_Kept(names, path=path))
        return len(self._staged)

    def commit(self) -> list[str]:
        """The staged sync becomes the replay copy; returns the files no longer needed."""
        new = {n for b in self._staged for n in b.names}
        # Keep an older bucket only if the new sync did not overwrite all of its tensors.
        dropped = [b for b in self.kept if set(b.names) <= new]
        self.kept = [b for b in self.kept if not set(b.names) <= new] + self._staged
        self._staged = []
        self.syncs += 1
        return [b.path for b in dropped if b.path]

    def abort(self) -> list[str]:
        """Forget a failed sync's staged buckets; returns their files."""
        files = [b.path for b in self._staged if b.path]
        self._staged = []
        return files

    def synced_refs(self) -> list[Any]:
        """What a restarted engine loads, in order: object refs of buckets, or file paths.
        (Returned inside a list, so they arrive as refs, not resolved.)"""
        return [b.ref if b.ref is not None else b.path for b in self.kept]


class _Replay:
    """The sender's side of the replay copy: tensors teed from a sync, grouped like
    `weight_sync.iter_buckets` (fused modules never split: a bucket is one reload call)
    and handed to the state actor ("memory") or written as safetensors ("disk")."""

    def __init__(self, state: Any, mode: str, folder: str | None, bucket_bytes: int) -> None:
        _check_replay(mode, folder)
        self.state, self.mode, self.bucket_bytes = state, mode, bucket_bytes
        self.folder = Path(folder, uuid.uuid4().hex[:12]) if mode == "disk" else None
        self.pending: list[tuple[str, torch.Tensor]] = []
        self.size, self.last_key, self.count = 0, None, 0
        self.acks: list[Any] = []
        self.settled = 0  # acks already waited for
        self.last_add = time.monotonic()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Keep one tensor (a host copy) of the sync passing by."""
        self.last_add = time.monotonic()
        if self.mode == "off":
            return
        key = fusion_key(name)
        if self.size >= self.bucket_bytes and key != self.last_key:
            self.flush()
        self.pending.append((name, tensor.detach().to("cpu", copy=True)))
        self.size += tensor_bytes(tensor)
        self.last_key = key

    def flush(self) -> None:
        """Hand the open bucket over."""
        if self.pending:
            self.add_bucket(self.pending)
        self.pending, self.size = [], 0

    # buckets whose sender-side object may wait for the state actor's copy: beyond this
    # the sender waits, so a sync never holds more than this many buckets twice
    MAX_STAGING = 1

    def add_bucket(self, bucket: list[tuple[str, torch.Tensor]], ref: Any = None) -> None:
        """Keep one whole bucket (host tensors; `ref`: the same bucket already flattened in
        the object store)."""
        import ray

        self.last_add = time.monotonic()
        if self.mode == "off":
            return
        if self.mode == "memory":
            ref = ref if ref is not None else ray.put(flatten_bucket(bucket))
            # wrapped in a list, the ref reaches the actor unresolved: it copies the object
            # into its own, and the sender's is dropped once the call returns
            self.acks.append(self.state.stage.remote([n for n, _ in bucket], [ref]))
            del ref
            while len(self.acks) - self.settled > self.MAX_STAGING:
                ray.get(self.acks[self.settled])
                self.settled += 1
        else:
            from safetensors.torch import save_file

            assert self.folder is not None
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"bucket_{self.count:05d}.safetensors"
            save_file({n: t.contiguous() for n, t in bucket}, str(path))
            self.acks.append(self.state.stage_file.remote([n for n, _ in bucket], str(path)))
        self.count += 1

    def commit(self) -> None:
        """The sync finished: it becomes the replay copy (older overridden files deleted)."""
        import ray

        self.flush()
        ray.get(self.acks)
        _remove(ray.get(self.state.commit.remote()))

    def abort(self) -> None:
        """The sync failed: the previous replay copy stays."""
        import ray

        self.pending = []
        with contextlib.suppress(Exception):
            ray.get(self.acks)
        _remove(ray.get(self.state.abort.remote()))


def _check_replay(mode: str, folder: str | None) -> None:
    """`ValueError` unless (mode, folder) is a replay copy `_Replay` can keep."""
    if mode not in ("memory", "disk", "off"):
        raise ValueError(f"replay must be memory, disk or off, got {mode!r}")
    if mode == "disk" and not folder:
        raise ValueError("replay='disk' needs a replay_dir")


def _remove(files: list[str]) -> None:
    for f in files:
        with contextlib.suppress(OSError):
            os.remove(f)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(f))  # the sync's folder, once empty
