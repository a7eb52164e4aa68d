"""The fleet's client API: `Fleet`, E engines in Ray actors, built from a `FleetSpec`.

Load balancing: `generate` splits the prompts into E contiguous chunks of about equal cost
(prompt tokens + max_tokens), so the N copies of a GRPO group's prompt share one engine's
prefix cache; request seeds are `spec.seed + global prompt index`, so seeded samples do not
depend on which engine served them. An engine that dies (or exceeds `request_timeout_s`)
during `generate` or `prompt_logprobs` is restarted with the last synced weights and its
share rerun, at most `max_restarts` times per slot; only the owning `Fleet` restarts
engines (`Fleet.connect` gives a client that raises instead). Weight sync: `sync.py`; the
replay copy: `replay.py`; placement: `placement.py`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from megatron_seed.data.generation import Generation
from megatron_seed.rollout.engine import SamplingSpec
from megatron_seed.rollout.fleet.actor import VLLMEngineActor
from megatron_seed.rollout.fleet.errors import FleetError
from megatron_seed.rollout.fleet.placement import EngineSlots, is_death
from megatron_seed.rollout.fleet.replay import _FleetState, _Replay
from megatron_seed.rollout.fleet.spec import FleetSpec
from megatron_seed.rollout.fleet.sync import _SyncClient, _watched, packed_bytes
from megatron_seed.rollout.weight_sync import flatten_bucket, iter_buckets, tensor_bytes

log = logging.getLogger(__name__)
NAMESPACE = "megatron_seed"


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


@dataclass(frozen=True)
class RunningFleet:
    """The engines of a fleet another process owns: its state actor and engine handles."""

    state: Any
    engines: list[Any]


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


@dataclass
class _Work:
    engine: int
    indices: list[int]
    method: str
    args: tuple
    started: float = field(default_factory=time.monotonic)


class Fleet:
    """E VLLMEngine instances, each in its own Ray actor (needs ray.init() first).

    `running` given (what `Fleet.connect` passes): a client of those engines, which syncs
    weights with the owner's transport, deadlines and replay copy, generates and scores,
    but never restarts engines; its `close()` leaves them running."""

    def __init__(
        self,
        model_dir: str,
        spec: FleetSpec | None = None,
        *,
        actor_cls: type | None = None,
        running: RunningFleet | None = None,
    ) -> None:
        import ray

        from megatron_seed.rollout.transfer import vllm_backend

        if not ray.is_initialized():
            raise FleetError("Fleet needs a running Ray: call ray.init() first")
        spec = spec or FleetSpec()
        if running is None and not os.path.isfile(os.path.join(model_dir, "config.json")):
            raise FileNotFoundError(f"no config.json in model dir {model_dir!r}")
        vllm_backend(spec.transport)  # fail early on a name vLLM would reject at the first sync
        self.spec = spec
        self.model_dir = str(model_dir)
        self.name = spec.name or f"fleet-{uuid.uuid4().hex[:8]}"
        self.transport, self.replay, self.replay_dir = spec.transport, spec.replay, spec.replay_dir
        self.engine_tp = spec.engine.tensor_parallel_size
        self.sync_timeout_s, self.max_inflight = spec.sync_timeout_s, spec.max_inflight
        self.request_timeout_s = spec.request_timeout_s
        self._owner = running is None
        self.max_restarts = spec.max_restarts if self._owner else 0
        self.restarts = [0] * spec.engines
        self._nccl: Any = None  # vLLM's NCCL sender, once its group is formed
        self._nccl_stale = False  # engines may still hold an old group
        self._closed = False
        self._dtype: str | None = None
        if running is not None:
            self._state = running.state
        else:
            self._state = (
                ray.remote(num_cpus=0)(_FleetState)
                .options(name=f"{self.name}-state", namespace=NAMESPACE)
                .remote()
            )
        actors = None if running is None else running.engines
        actor_cls = actor_cls or VLLMEngineActor
        self._slots = EngineSlots(self.name, self.model_dir, spec, actor_cls, actors)
        if running is None:
            ray.get(self._state.set_engines.remote(self._slots.actors))
            owner = {"model_dir": self.model_dir, "spec": replace(spec, name=self.name)}
            ray.get(self._state.set_settings.remote(owner))

    @classmethod
    def connect(cls, address: FleetAddress) -> Fleet:
        """A client of an existing fleet (this process must have called `ray.init(address=...)`;
        done here when not)."""
        import ray

        if not ray.is_initialized():
            ray.init(
                address=address.gcs_address or "auto",
                namespace=address.namespace,
                log_to_driver=False,
            )
        state = ray.get_actor(f"{address.name}-state", namespace=address.namespace)
        engines = list(ray.get(state.get_engines.remote()))
        owner = ray.get(state.get_settings.remote())
        # a client waits for answers as long as the defaults say (the owner's are its own)
        spec = replace(
            owner["spec"],
            name=address.name,
            request_timeout_s=FleetSpec.request_timeout_s,
        )
        return cls(owner["model_dir"], spec, running=RunningFleet(state, engines))

    @property
    def actors(self) -> list[Any]:
        """The engine actors' handles, by slot (an `EngineActor` each)."""
        return self._slots.actors

    def placement(self) -> list[str]:
        """The node each engine runs on (Slurm's node name, else the host name)."""
        return [name for name, _ in self._slots.nodes]

    # ------------------------------------------------------------------ lifecycle

    @property
    def num_engines(self) -> int:
        """Number of engine slots."""
        return len(self._slots.actors)

    @functools.cached_property
    def on_gpu(self) -> bool:
        """Whether the engines run on GPUs; on CPUs they share the machine's cores with the
        env workers (`rollout.overlap` paces them then). The owner knows from its engines'
        resources; a connected client asks engine 0 once (when it cannot answer: whether
        this process sees a GPU)."""
        import ray

        if self._owner:
            return bool(self.spec.gpus_per_engine)
        try:
            return bool(ray.get(self.actors[0].on_gpu.remote(), timeout=60))
        except Exception:  # a dead engine: the stream restarts it at its first call
            return torch.cuda.is_available()

    @property
    def address(self) -> FleetAddress:
        """Pass to another process (picklable); there: `Fleet.connect(address)`."""
        import ray

        return FleetAddress(self.name, NAMESPACE, ray.get_runtime_context().gcs_address)

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
        self._slots.replace(index, self.restarts[index], reason)
        self._drop_nccl()  # the group lost a member: rebuilt (new port) at the next sync
        refs = ray.get(self._state.synced_refs.remote())
        if self.replay == "off":
            log.warning(
                "engine %d restarted from %s: the replay copy is off", index, self.model_dir
            )
        # Replay the last synced weights, bucket by bucket, before any work is resubmitted.
        engine = self.actors[index]
        ray.get([engine.load_bucket.remote(r) for r in refs], timeout=self.spec.start_timeout_s)
        ray.get(self._state.set_engine.remote(index, engine))

    def kill_engine(self, index: int) -> None:
        """Kill engine actor `index` now, without telling the fleet (failure tests)."""
        import ray

        ray.kill(self.actors[index], no_restart=True)

    def close(self) -> None:
        """Stop the engines and the state actor (the owner only; idempotent)."""
        import ray

        if self._closed:
            return
        self._closed = True
        if not self._owner:
            return
        self._slots.close()
        with contextlib.suppress(Exception):
            ray.kill(self._state, no_restart=True)

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
                if not is_death(exc):
                    raise
                self._restart(w.engine, f"{type(exc).__name__}: {str(exc)[:300]}")
                pending[self._submit(w)] = w
        return results

    def _submit(self, w: _Work) -> Any:
        w.started = time.monotonic()
        return getattr(self.actors[w.engine], w.method).remote(*w.args)

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

    def routes(self, sequences: list[list[int]]) -> list[Any]:
        """Per sequence, the experts each MoE layer of the engines picks for every token
        (`[len, layers, k]` int16, `VLLMEngine.routes`), in sequence order."""
        if not sequences:
            return []
        chunks = _balanced_chunks([len(s) for s in sequences], self.num_engines)
        works = [
            _Work(e, idx, "routes", ([sequences[i] for i in idx],)) for e, idx in enumerate(chunks)
        ]
        return self._gather(works, len(sequences))

    def prompt_logprobs_per_engine(self, sequences: list[list[int]]) -> list[list[list[float]]]:
        """The same sequences scored by every engine (checks that all engines agree)."""
        return self._per_engine("prompt_logprobs", sequences)

    def routes_per_engine(self, sequences: list[list[int]]) -> list[list[Any]]:
        """The same sequences routed by every engine (`routes`; the MoE refit probe)."""
        return self._per_engine("routes", sequences)

    def _per_engine(self, method: str, sequences: list[list[int]]) -> list[list[Any]]:
        """`method` of every engine on all of `sequences`: one result list per engine."""
        works = [
            _Work(e, list(range(len(sequences))), method, (sequences,))
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
        return self.actors[engine].advance.remote(requests, linger_s, until_done)

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
        for ref in [e.usage.remote() for e in self.actors]:
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
            self._dtype = ray.get(self.actors[0].weights_dtype.remote())
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
            list(self.actors),
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
            engines=len(self.actors),
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
        world = 1 + len(self.actors) * self.engine_tp
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
        for e, engine in enumerate(self.actors):
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
