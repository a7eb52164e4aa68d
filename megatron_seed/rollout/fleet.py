"""The rollout fleet: E `VLLMEngine`s, one per Ray actor, with weight sync and restarts.

Needs `ray.init()` first. Each engine actor runs vLLM in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) with `threads_per_engine` OpenMP threads and a
fractional CPU request (default 0), so two engines and a trainer fit on a 2-core machine.

Load balancing: `generate` splits the prompts into E contiguous chunks of about equal cost
(prompt tokens + max_tokens). Contiguous, so the N copies of a GRPO group's prompt land on
one engine and share its prefix cache. Per-request seeds are `spec.seed + global prompt
index`, so with a seed the samples do not depend on which engine served a prompt.

Weight sync (`update_weights`) goes through vLLM's weight-transfer API (`rollout.transfer`):
the fleet is the `VLLMWeightSyncClient` that vLLM's trainer-side engine drives (start ->
chunks -> finish on every engine), with backend `transport`: "objstore" (any device; each
bucket of about `bucket_bytes` put in Ray's object store once and read by every engine),
"ipc" (engines colocated on the trainer's GPUs) or "nccl" (engines on other GPUs; the
group is built at the first sync and rebuilt, on a new port, after any engine restart).
Weights travel in the engines' dtype. Every call has a deadline (`sync_timeout_s`): an
engine that dies, stalls or fails to load (vLLM leaves a half-reloaded model behind) is
dropped from the sync and restarted after it; with "nccl", whose broadcast needs every
engine, the sync raises `WeightSyncError` naming the engine instead of hanging.

The replay copy: as the weights pass, they are also kept (`replay`: "memory", in Ray's
object store, held by a `_FleetState` actor; "disk", safetensors files under
`replay_dir`; "off") so that a restarted engine loads the LAST synced weights, bucket by
bucket, not the original checkpoint, even when the sync came from another process. The
state actor also holds the current engine handles: a trainer process (Megatron rank 0
under torchrun) reaches the fleet with `Fleet.connect(fleet.address)`.

Placement: an engine that reserves GPUs gets its own placement group of `engine_tp`
one-GPU bundles (`STRICT_PACK`: never across nodes); vLLM's TP workers use its bundles.

Failures: an engine actor that dies (or exceeds `request_timeout_s`) during `generate` or
`prompt_logprobs` is killed, restarted from the original checkpoint plus the replay copy,
and its share of the work rerun. Each engine slot may be restarted `max_restarts` times
over the fleet's life; one more failure raises `FleetError`. Only the owning `Fleet`
restarts engines; a connected client raises.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from megatron_seed.rollout.engine import Generation, SamplingSpec
from megatron_seed.rollout.weight_sync import (
    FlatBucket,
    flatten_bucket,
    fusion_key,
    iter_buckets,
    tensor_bytes,
    unflatten_bucket,
)

log = logging.getLogger(__name__)
NAMESPACE = "megatron_seed"


class FleetError(RuntimeError):
    """An engine kept failing (beyond max_restarts) or the fleet is misused."""


class WeightSyncError(FleetError):
    """A weight sync that could not finish (an engine the transfer needs died or stalled)."""


@dataclass
class SyncStats:
    """One weight sync: wall seconds, payload bytes (once, not per engine), buckets, engines."""

    seconds: float
    bytes: int
    buckets: int
    engines: int
    tensors: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class FleetAddress:
    """What another process needs to reach a fleet (after `ray.init(address=...)`)."""

    name: str
    namespace: str = NAMESPACE
    gcs_address: str = ""


# ------------------------------------------------------------------ actors


def engine_env(threads: int) -> dict[str, str]:
    """Environment variables of an engine actor (and of vLLM's TP workers, which inherit its
    runtime environment). `CUDA_DEVICE_MAX_CONNECTIONS` is CUDA's default (8): the trainer's
    ranks set 1 for Megatron's overlapped TP communication (`models.parallel`), and a Ray
    started from a rank would hand that one hardware queue to every engine on the node."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_DEVICE_MAX_CONNECTIONS": "8",
    }


class _EngineActor:
    """Holds one VLLMEngine; the methods are the fleet's remote calls."""

    def __init__(self, model_dir: str, engine_kwargs: dict[str, Any], threads: int) -> None:
        torch.set_num_threads(threads)
        from megatron_seed.rollout.engine import VLLMEngine

        self.engine = VLLMEngine(model_dir, **engine_kwargs)

    def ready(self) -> int:
        return os.getpid()

    def on_gpu(self) -> bool:
        return bool(self.engine.on_gpu)

    def node(self) -> tuple[str, str]:
        import ray

        from megatron_seed.hosts import node_name

        return node_name(), ray.get_runtime_context().get_node_id()

    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, offsets: list[int]
    ) -> list[Generation]:
        return self.engine.generate(prompts, spec, seed_offsets=offsets)

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        return self.engine.prompt_logprobs(sequences)

    def advance(
        self,
        requests: list[tuple[Any, list[int], SamplingSpec, int]],
        linger_s: float = 0.0,
        until_done: list[Any] | None = None,
    ) -> list[Any]:
        return self.engine.advance(requests, linger_s, until_done or ())

    def usage(self) -> dict[str, float]:
        return {"busy_s": self.engine.busy_s, "cpu_s": time.process_time()}

    def load_bucket(self, bucket: FlatBucket | str) -> int:
        """Load one replayed bucket (a flat bucket, or a safetensors file of one)."""
        if isinstance(bucket, str):
            from safetensors.torch import load_file

            return self.engine.update_weights(load_file(bucket).items())
        return self.engine.update_weights(unflatten_bucket(bucket))

    # vLLM's weight-transfer calls (what `VLLMWeightSyncClient` fans out)
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.engine.init_transfer(init_info)

    def shutdown_weight_transfer_engine(self) -> None:
        self.engine.shutdown_transfer()

    def start_weight_update(self) -> None:
        self.engine.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.engine.receive(update_info)

    def finish_weight_update(self) -> None:
        self.engine.finish_weight_update()

    def weights_dtype(self) -> str:
        return self.engine.weights_dtype()

    def weight_checksum(self) -> float:
        return self.engine.weight_checksum()

    def reseed(self, seed: int) -> None:
        self.engine.reseed(seed)

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()

    def sleep(self, level: int = 1) -> None:
        self.engine.sleep(level)

    def wake(self, tags: list[str] | None = None) -> None:
        self.engine.wake(tags)


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


# ------------------------------------------------------------------ driver side


def _balanced_chunks(costs: list[int], parts: int) -> list[list[int]]:
    """Split indices 0..n-1 into `parts` contiguous runs of about equal total cost."""
    n = len(costs)
    total = sum(costs)
    chunks: list[list[int]] = [[] for _ in range(parts)]
    acc, part = 0, 0
    for i, c in enumerate(costs):
        # move on once this part reached its share, keeping enough items for the rest
        while part < parts - 1 and acc >= total * (part + 1) / parts and chunks[part]:
            part += 1
        if parts - part > n - i and chunks[part]:
            part += 1
        chunks[part].append(i)
        acc += c
    return chunks


def _is_death(exc: BaseException) -> bool:
    import ray.exceptions as rex

    return isinstance(exc, rex.RayActorError | rex.GetTimeoutError)


@dataclass
class _Work:
    engine: int
    indices: list[int]
    method: str
    args: tuple
    started: float = field(default_factory=time.monotonic)


class Fleet:
    """E VLLMEngine instances, each in its own Ray actor (needs ray.init() first)."""

    def __init__(
        self,
        model_dir: str,
        num_engines: int = 2,
        *,
        engine_kwargs: dict | None = None,
        max_restarts: int = 2,
        request_timeout_s: float = 600.0,
        threads_per_engine: int = 1,
        num_cpus_per_engine: float = 0.0,
        num_gpus_per_engine: float = 0.0,
        transport: str = "objstore",
        sync_timeout_s: float = 60.0,
        replay: str = "memory",
        replay_dir: str | None = None,
        max_inflight: int = 2,
        name: str | None = None,
        start_timeout_s: float = 600.0,
        actor_cls: type | None = None,
    ) -> None:
        import ray

        from megatron_seed.rollout.transfer import vllm_backend

        if not ray.is_initialized():
            raise FleetError("Fleet needs a running Ray: call ray.init() first")
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        if max_restarts < 0 or request_timeout_s <= 0 or max_inflight < 1 or sync_timeout_s <= 0:
            raise ValueError(
                "max_restarts >= 0, request_timeout_s > 0, sync_timeout_s > 0 and "
                "max_inflight >= 1 required"
            )
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            raise FileNotFoundError(f"no config.json in model dir {model_dir!r}")
        vllm_backend(transport)  # fail early on a name vLLM would reject at the first sync
        _check_replay(replay, replay_dir)
        self.model_dir = str(model_dir)
        self.engine_kwargs = {**(engine_kwargs or {}), "weight_transfer": transport}
        self.engine_tp = int(self.engine_kwargs.get("tensor_parallel_size", 1))
        self.max_restarts = max_restarts
        self.request_timeout_s = request_timeout_s
        self.start_timeout_s = start_timeout_s
        self.threads_per_engine = threads_per_engine
        self._resources = dict(num_cpus=num_cpus_per_engine, num_gpus=num_gpus_per_engine)
        self.transport, self.sync_timeout_s, self.max_inflight = (
            transport,
            sync_timeout_s,
            max_inflight,
        )
        self.replay, self.replay_dir = replay, replay_dir
        self.name = name or f"fleet-{uuid.uuid4().hex[:8]}"
        self.restarts = [0] * num_engines
        self._actor_cls = actor_cls or _EngineActor
        self._groups: list[Any] = [None] * num_engines  # placement groups
        self._nccl: Any = None  # vLLM's NCCL sender, once its group is formed
        self._nccl_stale = False  # engines may still hold an old group
        self._owner = True
        self._closed = False
        self._state = (
            ray.remote(num_cpus=0)(_FleetState)
            .options(name=f"{self.name}-state", namespace=NAMESPACE)
            .remote()
        )
        self._engines = [self._start_engine(i) for i in range(num_engines)]
        self._wait_ready(list(range(num_engines)))
        ray.get(self._state.set_engines.remote(self._engines))
        settings = dict(transport=transport, sync_timeout_s=sync_timeout_s, replay=replay,
                        replay_dir=replay_dir, engine_tp=self.engine_tp,
                        max_inflight=max_inflight)  # fmt: skip
        ray.get(self._state.set_settings.remote(settings))
        # (node name, Ray node id) of every engine: logged, and checked when one dies
        self._nodes = ray.get([e.node.remote() for e in self._engines])
        self._dtype: str | None = None

    def placement(self) -> list[str]:
        """The node each engine runs on (Slurm's node name, else the host name)."""
        return [name for name, _ in self._nodes]

    # ------------------------------------------------------------------ lifecycle

    @property
    def num_engines(self) -> int:
        """Number of engine slots."""
        return len(self._engines)

    @functools.cached_property
    def on_gpu(self) -> bool:
        """Whether the engines run on GPUs; on CPUs they share the machine's cores with the
        env workers (`rollout.overlap` paces them then). The owner knows from its engines'
        resources; a connected client asks engine 0 once (when it cannot answer: whether
        this process sees a GPU)."""
        import ray

        if hasattr(self, "_resources"):
            return bool(self._resources["num_gpus"])
        try:
            return bool(ray.get(self._engines[0].on_gpu.remote(), timeout=60))
        except Exception:  # a dead engine: the stream restarts it at its first call
            return torch.cuda.is_available()

    @property
    def address(self) -> FleetAddress:
        """Pass to another process (picklable); there: `Fleet.connect(address)`."""
        import ray

        return FleetAddress(self.name, NAMESPACE, ray.get_runtime_context().gcs_address)

    @classmethod
    def connect(cls, address: FleetAddress) -> Fleet:
        """A client of an existing fleet (this process must have called `ray.init(address=...)`).

        The client syncs weights (with the owner's transport, deadlines and replay copy),
        generates and scores; it never restarts engines and `close()` does not stop them.
        """
        import ray

        if not ray.is_initialized():
            ray.init(
                address=address.gcs_address or "auto",
                namespace=address.namespace,
                log_to_driver=False,
            )
        self = cls.__new__(cls)
        self.name = address.name
        self._state = ray.get_actor(f"{address.name}-state", namespace=address.namespace)
        self._engines = list(ray.get(self._state.get_engines.remote()))
        self._nodes = ray.get([e.node.remote() for e in self._engines])
        self._owner, self._closed = False, False
        self.max_restarts, self.restarts = 0, [0] * len(self._engines)
        self.request_timeout_s = 600.0
        settings = ray.get(self._state.get_settings.remote())
        self.transport, self.replay = settings["transport"], settings["replay"]
        self.replay_dir, self.engine_tp = settings["replay_dir"], settings["engine_tp"]
        self.sync_timeout_s, self.max_inflight = (
            settings["sync_timeout_s"],
            settings["max_inflight"],
        )
        self._groups, self._nccl, self._dtype = [None] * len(self._engines), None, None
        self._nccl_stale = False
        return self

    def _start_engine(self, index: int) -> Any:
        import ray

        kwargs = dict(self.engine_kwargs)
        kwargs.setdefault("seed", index)  # distinct streams when a request has no seed
        options: dict[str, Any] = dict(
            max_restarts=0,  # restarts are ours: Ray's would reload the original checkpoint
            runtime_env={"env_vars": engine_env(self.threads_per_engine)},
            **self._resources,
        )
        if self._resources["num_gpus"]:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group = self._placement_group(index)
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=group,
                placement_group_bundle_index=0,
                placement_group_capture_child_tasks=True,  # vLLM's TP workers land in it
            )
            # TP=1: the engine is its own worker on bundle 0's GPU; TP>1: vLLM's Ray
            # workers take the bundles' GPUs and the actor itself none
            per_gpu = self._resources["num_gpus"] / self.engine_tp
            options["num_gpus"] = per_gpu if self.engine_tp == 1 else 0
        actor_cls = ray.remote(self._actor_cls)
        return actor_cls.options(**options).remote(self.model_dir, kwargs, self.threads_per_engine)

    def _placement_group(self, index: int) -> Any:
        """Engine `index`'s placement group: `engine_tp` one-GPU bundles on one node (made
        once; a restarted engine returns to it, and Ray moves it if its node is lost)."""
        import ray
        from ray.util.placement_group import placement_group

        if self._groups[index] is None:
            per_gpu = self._resources["num_gpus"] / self.engine_tp
            bundle = {"GPU": per_gpu, **({"CPU": c} if (c := self._resources["num_cpus"]) else {})}
            group = placement_group(
                [dict(bundle) for _ in range(self.engine_tp)],
                strategy="STRICT_PACK",
                name=f"{self.name}-engine-{index}",
            )
            try:
                ray.get(group.ready(), timeout=self.start_timeout_s)
            except Exception as exc:
                ray.util.remove_placement_group(group)
                raise FleetError(
                    f"engine {index}: no node has {self.engine_tp} x {per_gpu:g} free GPUs "
                    f"(placement group not ready in {self.start_timeout_s:g} s: {exc})"
                ) from exc
            self._groups[index] = group
        return self._groups[index]

    def _wait_ready(self, indices: list[int]) -> None:
        import ray

        refs = [self._engines[i].ready.remote() for i in indices]
        try:
            ray.get(refs, timeout=self.start_timeout_s)
        except Exception as exc:
            raise FleetError(
                f"engine(s) {indices} failed to start from {self.model_dir}: {exc}"
            ) from exc

    def _restart(self, index: int, reason: str) -> None:
        import ray

        if not self._owner:
            raise FleetError(
                f"engine {index} failed ({reason}); only the owning Fleet restarts engines"
            )
        self.restarts[index] += 1
        if self.restarts[index] > self.max_restarts:
            raise FleetError(
                f"engine {index} failed {self.restarts[index]} times (max_restarts="
                f"{self.max_restarts}); last failure: {reason}"
            )
        self._check_node(index, reason)
        log.warning("restarting engine %d (restart %d): %s", index, self.restarts[index], reason)
        with contextlib.suppress(Exception):
            ray.kill(self._engines[index], no_restart=True)
        self._engines[index] = self._start_engine(index)
        self._wait_ready([index])
        self._nodes[index] = ray.get(self._engines[index].node.remote())
        self._drop_nccl()  # the group lost a member: rebuilt (new port) at the next sync
        refs = ray.get(self._state.synced_refs.remote())
        if self.replay == "off":
            log.warning(
                "engine %d restarted from %s: the replay copy is off", index, self.model_dir
            )
        # Replay the last synced weights, bucket by bucket, before any work is resubmitted.
        ray.get(
            [self._engines[index].load_bucket.remote(r) for r in refs], timeout=self.start_timeout_s
        )
        ray.get(self._state.set_engine.remote(index, self._engines[index]))

    def _check_node(self, index: int, reason: str) -> None:
        """Fail at once when the engine went down with its node and no other node has the
        GPUs to restart it (waiting would only hang until `start_timeout_s`)."""
        import ray

        name, node_id = self._nodes[index]
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if node_id in alive:
            return
        need = float(self._resources["num_gpus"])
        free = float(ray.available_resources().get("GPU", 0.0))
        if need > free:
            raise FleetError(
                f"engine {index} was lost with node {name} (it left the Ray cluster), and "
                f"no node has the {need:g} free GPU(s) to restart it; last failure: {reason}"
            )

    def kill_engine(self, index: int) -> None:
        """Kill engine actor `index` now, without telling the fleet (failure tests)."""
        import ray

        ray.kill(self._engines[index], no_restart=True)

    def close(self) -> None:
        """Stop the engines and the state actor (the owner only; idempotent)."""
        import ray

        if self._closed:
            return
        self._closed = True
        if not self._owner:
            return
        for actor in [*self._engines, self._state]:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        for group in self._groups:
            if group is not None:
                with contextlib.suppress(Exception):
                    ray.util.remove_placement_group(group)

    # ------------------------------------------------------------------ fan-out with recovery

    def _run(self, works: list[_Work]) -> dict[int, list[Any]]:
        """Submit each work item to its engine; on a death, restart and resubmit it."""
        import ray

        results: dict[int, list[Any]] = {}
        pending = {self._submit(w): w for w in works if w.indices}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if not ready:
                now = time.monotonic()
                for ref, w in list(pending.items()):
                    if now - w.started > self.request_timeout_s:
                        del pending[ref]
                        self._restart(w.engine, f"no answer within {self.request_timeout_s} s")
                        pending[self._submit(w)] = w
                continue
            ref = ready[0]
            w = pending.pop(ref)
            try:
                results[w.engine] = ray.get(ref)
            except Exception as exc:
                if not _is_death(exc):
                    raise
                self._restart(w.engine, f"{type(exc).__name__}: {str(exc)[:300]}")
                pending[self._submit(w)] = w
        return results

    def _submit(self, w: _Work) -> Any:
        w.started = time.monotonic()
        return getattr(self._engines[w.engine], w.method).remote(*w.args)

    # ------------------------------------------------------------------ public API

    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[Generation]:
        """One completion per token-id prompt, in prompt order (see module docstring)."""
        if not prompts:
            return []
        chunks = _balanced_chunks([len(p) + spec.max_tokens for p in prompts], self.num_engines)
        works = [
            _Work(e, idx, "generate", ([prompts[i] for i in idx], spec, idx))
            for e, idx in enumerate(chunks)
        ]
        return self._gather(works, len(prompts))

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """`out[k][i] = log p(seq_k[i+1] | seq_k[:i+1])` from the engines (parity checks)."""
        if not sequences:
            return []
        chunks = _balanced_chunks([len(s) for s in sequences], self.num_engines)
        works = [
            _Work(e, idx, "prompt_logprobs", ([sequences[i] for i in idx],))
            for e, idx in enumerate(chunks)
        ]
        return self._gather(works, len(sequences))

    def prompt_logprobs_per_engine(self, sequences: list[list[int]]) -> list[list[list[float]]]:
        """The same sequences scored by every engine (checks that all engines agree)."""
        works = [
            _Work(e, list(range(len(sequences))), "prompt_logprobs", (sequences,))
            for e in range(self.num_engines)
        ]
        results = self._run(works)
        return [results[e] for e in range(self.num_engines)]

    # ------------------------------------------------------------------ streaming

    def advance(
        self,
        engine: int,
        requests: list[tuple[Any, list[int], SamplingSpec, int]],
        linger_s: float = 0.0,
        until_done: list[Any] | None = None,
    ) -> Any:
        """Engine `engine` adds `requests` (key, prompt ids, spec, seed offset) to its running
        batch and steps until one of its requests finishes (and `linger_s` on), or with
        `until_done` until none of those keys is in flight: the object
        ref of the finished (key, Generation) pairs (`VLLMEngine.advance`;
        `rollout.overlap.FleetStream` drives it). No recovery here: a caller that sees the
        engine die calls `restart`."""
        return self._engines[engine].advance.remote(requests, linger_s, until_done)

    def restart(self, engine: int, reason: str) -> None:
        """Replace a dead or hung engine (the last synced weights replayed into it): its
        in-flight requests are lost, the caller resubmits them. `FleetError` when it may
        not be restarted (restarts used up, not the owner, its node is gone)."""
        self._restart(engine, reason)

    def usage(self) -> list[dict[str, float] | None]:
        """Per engine, since it started: `busy_s`, seconds spent generating; `cpu_s`, its
        actor process's CPU seconds (None: no answer)."""
        import ray

        out: list[dict[str, float] | None] = []
        for ref in [e.usage.remote() for e in self._engines]:
            try:
                out.append(dict(ray.get(ref, timeout=30)))
            except Exception:
                out.append(None)
        return out

    def _gather(self, works: list[_Work], n: int) -> list[Any]:
        results = self._run(works)
        out: list[Any] = [None] * n
        for w in works:
            for i, r in zip(w.indices, results.get(w.engine, []), strict=True):
                out[i] = r
        return out

    def load_model(self, model_dir: str | os.PathLike, bucket_bytes: int = 64 << 20) -> SyncStats:
        """Every engine takes the weights of the HF folder ``model_dir`` (a model of the
        fleet's architecture and tokenizer): one fleet serves several models in turn.

        Read on the host, so not through the trainer's transport: each bucket goes into the
        object store once and every engine reloads it in place (the restart path), and it
        becomes the replay copy."""
        import ray

        from megatron_seed.models.convert import HFCheckpoint

        start = time.perf_counter()
        ckpt = HFCheckpoint(model_dir)
        dtype = self.weights_dtype
        replay = _Replay(self._state, self.replay, self.replay_dir, bucket_bytes)
        total = tensors = buckets = 0
        try:
            weights = ((n, ckpt.get(n).to(dtype)) for n in ckpt.names())
            for bucket in iter_buckets(weights, bucket_bytes):
                ref = ray.put(flatten_bucket(bucket))
                replay.add_bucket(bucket, ref)
                self._run([_Work(e, [0], "load_bucket", (ref,)) for e in range(self.num_engines)])
                total += sum(tensor_bytes(t) for _, t in bucket)
                tensors, buckets = tensors + len(bucket), buckets + 1
        except BaseException:
            replay.abort()
            raise
        replay.commit()
        return SyncStats(time.perf_counter() - start, total, buckets, self.num_engines, tensors)

    @property
    def weights_dtype(self) -> torch.dtype:
        """The dtype the engines hold their weights in (what a sync sends)."""
        import ray

        if self._dtype is None:
            self._dtype = ray.get(self._engines[0].weights_dtype.remote())
        return getattr(torch, self._dtype)

    def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        bucket_bytes: int = 64 << 20,
        meta: list[Any] | None = None,
    ) -> SyncStats:
        """Stream (HF name, full tensor) into every engine through vLLM's weight-transfer
        API (module docstring), in the engines' dtype; the stream is consumed once.

        `meta` (vLLM `ParamMeta`s in stream order) is needed by "nccl" only. Engines lost
        during the sync are restarted after it from the replay copy it just wrote."""
        from megatron_seed.rollout.transfer import ExportSource

        start = time.perf_counter()
        restarts_before = sum(self.restarts)
        replay = _Replay(self._state, self.replay, self.replay_dir, bucket_bytes)
        source = ExportSource(weights, meta, dtype=self.weights_dtype, tee=replay.add)
        client = _SyncClient(
            list(self._engines),
            self.sync_timeout_s,
            needs_all=self.transport == "nccl",
            # IPC reuses one staging buffer: a chunk must be loaded before the next is packed
            max_inflight=0 if self.transport == "ipc" else self.max_inflight,
            ranks_per_engine=self.engine_tp,
        )

        def progress() -> float:
            return max(client.last_progress, replay.last_add)

        try:  # the client's own deadlines come first; this one catches a stuck sender
            _watched(
                lambda: self._sender(
                    client, source, packed_bytes(bucket_bytes, meta)
                ).send_weights(),
                progress,
                2 * self.sync_timeout_s,
                f"no engine answered and no tensor was sent ({self.transport})",
            )
        except BaseException:
            replay.abort()
            self._recover(client)
            raise
        replay.commit()
        for e, reason in sorted(client.lost.items()):
            self._restart(e, reason)
        return SyncStats(
            seconds=time.perf_counter() - start,
            bytes=source.bytes,
            buckets=replay.count,
            engines=len(self._engines),
            tensors=source.tensors,
            restarts=sum(self.restarts) - restarts_before,
        )

    def _sender(self, client: _SyncClient, source: Any, bucket_bytes: int) -> Any:
        """vLLM's trainer-side engine for this sync (the NCCL one, and its group, reused)."""
        import ray
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from megatron_seed.rollout import transfer

        transfer.register()
        if self.transport == "nccl" and self._nccl is not None:
            self._nccl.client, self._nccl.source = client, source
            return self._nccl
        if self.transport == "nccl" and self._nccl_stale:
            # members of the old group leave it before the new one forms (on a new port)
            for ref in client._fan("shutdown_weight_transfer_engine").values():
                with contextlib.suppress(Exception):
                    ray.get(ref, timeout=self.sync_timeout_s)
            self._nccl_stale = False
        world = 1 + len(self._engines) * self.engine_tp
        info = transfer.trainer_init_info(self.transport, bucket_bytes, world)
        sender = WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
        if self.transport == "nccl":
            self._nccl = sender
        return sender

    def _drop_nccl(self) -> None:
        """Forget the NCCL group (after a failure or a restart): its communicator is
        destroyed here, the engines' at the next sync, which forms a new one."""
        if self._nccl is not None:
            with contextlib.suppress(Exception):
                self._nccl.shutdown()
            self._nccl = None
            self._nccl_stale = True

    def _recover(self, client: _SyncClient) -> None:
        """After a failed sync: engines left mid-update (or stuck in a transfer) go back to
        the last synced weights: finish + replay, or, when that fails, a restart (owner)."""
        import ray

        if self.transport == "nccl":
            self._drop_nccl()
        refs = ray.get(self._state.synced_refs.remote())
        broken = dict(client.lost)
        for e, engine in enumerate(self._engines):
            if e in broken:
                continue
            try:
                ray.get(engine.finish_weight_update.remote(), timeout=self.sync_timeout_s)
                refs_loaded = [engine.load_bucket.remote(r) for r in refs]
                ray.get(refs_loaded, timeout=self.sync_timeout_s)
            except Exception as exc:
                broken[e] = f"left broken by a failed sync ({type(exc).__name__})"
        for e, reason in sorted(broken.items()):
            if not self._owner:
                log.error("engine %d needs a restart by the fleet's owner: %s", e, reason)
                continue
            with contextlib.suppress(FleetError):
                self._restart(e, reason)

    def sleep(self, level: int = 1) -> None:
        """Every engine gives its GPU memory to a colocated trainer (weights to host memory,
        KV cache dropped; needs engines built with `enable_sleep_mode=True`)."""
        self._run([_Work(e, [0], "sleep", (level,)) for e in range(self.num_engines)])

    def wake(self, tags: list[str] | None = None) -> None:
        """Every engine takes back `tags` ("weights" before a sync, "kv_cache" after it)."""
        self._run([_Work(e, [0], "wake", (tags,)) for e in range(self.num_engines)])

    def reseed(self, seed: int) -> None:
        """Engine e restarts its unseeded sampling stream at ``seed + e``: what follows draws
        as a fresh fleet would, whatever the engines sampled before (on CPU, where vLLM
        cannot seed single requests, this is what makes an evaluation reproducible)."""
        self._run([_Work(e, [0], "reseed", (seed + e,)) for e in range(self.num_engines)])

    def weight_checksums(self) -> list[float]:
        """Sum of all parameters per engine (cheap check that engines hold the same weights)."""
        works = [_Work(e, [0], "weight_checksum", ()) for e in range(self.num_engines)]
        results = self._run(works)
        return [results[e] for e in range(self.num_engines)]

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
