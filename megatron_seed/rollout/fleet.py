"""The rollout fleet: E `VLLMEngine`s, one per Ray actor, with weight sync and restarts.

Needs `ray.init()` first. Each engine actor runs vLLM in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) with `threads_per_engine` OpenMP threads and a
fractional CPU request (default 0), so two engines and a trainer fit on a 2-core machine.

Load balancing: `generate` splits the prompts into E contiguous chunks of about equal cost
(prompt tokens + max_tokens). Contiguous, so the N copies of a GRPO group's prompt land on
one engine and share its prefix cache. Per-request seeds are `spec.seed + global prompt
index`, so with a seed the samples do not depend on which engine served a prompt.

Weight sync: `update_weights` consumes the (name, tensor) stream once, in buckets of about
`bucket_bytes` (`weight_sync.iter_buckets`), puts each bucket in the object store once and
every engine loads it (at most `max_inflight` buckets in flight). A `_FleetState` actor also
keeps a copy of the last synced weights (one model copy in host memory) and the current
engine handles, so that
  * a restarted engine loads the LAST synced weights (replayed bucket by bucket), not the
    original checkpoint, even when the sync came from another process, and
  * a trainer process (e.g. Megatron rank 0 under torchrun) can reach the fleet with
    `Fleet.connect(fleet.address)` after `ray.init(address=...)` and stream its export in.

Failures: an engine actor that dies (or exceeds `request_timeout_s`) during `generate`,
`prompt_logprobs` or `update_weights` is killed, restarted from the original checkpoint
plus the last synced weights, and its share of the work rerun. Each engine slot may be
restarted `max_restarts` times over the fleet's life; one more failure raises
`FleetError`. Only the owning `Fleet` restarts engines; a connected client raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from megatron_seed.rollout.engine import Generation, SamplingSpec
from megatron_seed.rollout.weight_sync import (
    FlatBucket,
    flatten_bucket,
    iter_buckets,
    make_transport,
    tensor_bytes,
    unflatten_bucket,
)

log = logging.getLogger(__name__)
NAMESPACE = "megatron_seed"


class FleetError(RuntimeError):
    """An engine kept failing (beyond max_restarts) or the fleet is misused."""


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


class _EngineActor:
    """Holds one VLLMEngine; the methods are the fleet's remote calls."""

    def __init__(self, model_dir: str, engine_kwargs: dict[str, Any], threads: int) -> None:
        torch.set_num_threads(threads)
        from megatron_seed.rollout.engine import VLLMEngine

        self.engine = VLLMEngine(model_dir, **engine_kwargs)

    def ready(self) -> int:
        return os.getpid()

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

    def load_bucket(self, bucket: FlatBucket) -> int:
        return self.engine.update_weights(unflatten_bucket(bucket))

    def load_bucket_ipc(self, meta: FlatBucket, rebuild: Any, args: tuple) -> int:
        from megatron_seed.rollout.weight_sync import receive_ipc

        return self.engine.update_weights(receive_ipc(meta, rebuild, args))

    def init_weight_group(self, host: str, port: int, rank: int, world_size: int) -> None:
        self.engine.llm.collective_rpc(
            "seed_init_weight_group", args=(host, port, rank, world_size)
        )

    def load_bucket_nccl(self, meta: FlatBucket, nbytes: int) -> int:
        counts = self.engine.llm.collective_rpc("seed_receive_nccl", args=(meta, nbytes))
        if not self.engine.llm.reset_prefix_cache():
            raise RuntimeError("could not reset the prefix cache after a weight update")
        return int(counts[0])

    def weight_checksum(self) -> float:
        return self.engine.weight_checksum()

    def reseed(self, seed: int) -> None:
        self.engine.reseed(seed)

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()


class _FleetState:
    """The fleet's registry (current engine handles) and its copy of the last synced weights."""

    def __init__(self) -> None:
        self.engines: list[Any] = []
        self.buckets: list[FlatBucket] = []  # replay order: older (partially overridden) first
        self._staged: list[FlatBucket] = []
        self._refs: list[Any] | None = None
        self.syncs = 0

    def set_engines(self, engines: list[Any]) -> None:
        self.engines = engines

    def set_engine(self, index: int, engine: Any) -> None:
        self.engines[index] = engine

    def get_engines(self) -> list[Any]:
        return self.engines

    def stage(self, bucket: FlatBucket) -> int:
        # Own the bytes: the object-store buffer belongs to the (possibly short-lived) sender.
        self._staged.append(
            FlatBucket(
                bucket.names,
                bucket.dtypes,
                bucket.shapes,
                bucket.offsets,
                np.array(bucket.data, copy=True),
            )
        )
        return len(self._staged)

    def commit(self) -> int:
        new = {n for b in self._staged for n in b.names}
        # Keep an older bucket only if the new sync did not overwrite all of its tensors.
        self.buckets = [b for b in self.buckets if not set(b.names) <= new] + self._staged
        self._staged, self._refs = [], None
        self.syncs += 1
        return self.syncs

    def abort(self) -> None:
        self._staged = []

    def synced_refs(self) -> list[Any]:
        import ray

        if self._refs is None:
            self._refs = [ray.put(b) for b in self.buckets]
        return self._refs


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
        transport: str = "ray",
        transport_kwargs: dict | None = None,
        max_inflight: int = 2,
        name: str | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        import ray

        if not ray.is_initialized():
            raise FleetError("Fleet needs a running Ray: call ray.init() first")
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        if max_restarts < 0 or request_timeout_s <= 0 or max_inflight < 1:
            raise ValueError("max_restarts >= 0, request_timeout_s > 0, max_inflight >= 1 required")
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            raise FileNotFoundError(f"no config.json in model dir {model_dir!r}")
        self.model_dir = str(model_dir)
        self.engine_kwargs = dict(engine_kwargs or {})
        self.max_restarts = max_restarts
        self.request_timeout_s = request_timeout_s
        self.start_timeout_s = start_timeout_s
        self.threads_per_engine = threads_per_engine
        self._resources = dict(num_cpus=num_cpus_per_engine, num_gpus=num_gpus_per_engine)
        self.transport = make_transport(transport, **(transport_kwargs or {}))
        self.max_inflight = max_inflight
        self.name = name or f"fleet-{uuid.uuid4().hex[:8]}"
        self.restarts = [0] * num_engines
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
        # (node name, Ray node id) of every engine: logged, and checked when one dies
        self._nodes = ray.get([e.node.remote() for e in self._engines])

    def placement(self) -> list[str]:
        """The node each engine runs on (Slurm's node name, else the host name)."""
        return [name for name, _ in self._nodes]

    # ------------------------------------------------------------------ lifecycle

    @property
    def num_engines(self) -> int:
        """Number of engine slots."""
        return len(self._engines)

    @property
    def address(self) -> FleetAddress:
        """Pass to another process (picklable); there: `Fleet.connect(address)`."""
        import ray

        return FleetAddress(self.name, NAMESPACE, ray.get_runtime_context().gcs_address)

    @classmethod
    def connect(cls, address: FleetAddress) -> Fleet:
        """A client of an existing fleet (this process must have called `ray.init(address=...)`).

        The client syncs weights, generates and scores; it never restarts engines and
        `close()` does not stop them.
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
        self.request_timeout_s, self.max_inflight = 600.0, 2
        self.transport = make_transport("ray")
        return self

    def _start_engine(self, index: int) -> Any:
        import ray

        kwargs = dict(self.engine_kwargs)
        kwargs.setdefault("seed", index)  # distinct streams when a request has no seed
        env = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(self.threads_per_engine),
            "MKL_NUM_THREADS": str(self.threads_per_engine),
            "TOKENIZERS_PARALLELISM": "false",
        }
        actor_cls = ray.remote(_EngineActor)
        return actor_cls.options(
            max_restarts=0,  # restarts are ours: Ray's would reload the original checkpoint
            runtime_env={"env_vars": env},
            **self._resources,
        ).remote(self.model_dir, kwargs, self.threads_per_engine)

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
        refs = ray.get(self._state.synced_refs.remote())
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

    def _gather(self, works: list[_Work], n: int) -> list[Any]:
        results = self._run(works)
        out: list[Any] = [None] * n
        for w in works:
            for i, r in zip(w.indices, results.get(w.engine, []), strict=True):
                out[i] = r
        return out

    def load_model(self, model_dir: str | os.PathLike) -> SyncStats:
        """Every engine takes the weights of the HF folder ``model_dir`` (a model of the
        fleet's architecture and tokenizer): one fleet serves several models in turn."""
        from megatron_seed.models.convert import HFCheckpoint

        ckpt = HFCheckpoint(model_dir)
        return self.update_weights((name, ckpt.get(name)) for name in ckpt.names())

    def update_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 64 << 20
    ) -> SyncStats:
        """Stream (HF name, full tensor) into every engine, in buckets; no disk round-trip.

        The stream is consumed once. Engines that die during the sync are restarted after
        it and load the synced weights from the fleet's copy.
        """
        import ray

        start = time.perf_counter()
        engines = list(self._engines)
        inflight: list[list[Any]] = []
        dead: dict[int, str] = {}
        total = buckets = tensors = 0
        restarts_before = sum(self.restarts)

        def settle(acks: list[Any]) -> None:
            # acks[:E] are the engines', acks[E] the state copy's
            for e, ack in enumerate(acks[: len(engines)]):
                if e in dead:
                    continue
                try:
                    ray.get(ack, timeout=self.request_timeout_s)
                except Exception as exc:
                    if not _is_death(exc):
                        raise
                    dead[e] = f"{type(exc).__name__} during weight sync"
            ray.get(acks[len(engines) :])

        try:
            for bucket in iter_buckets(weights, bucket_bytes):
                acks = self._send_bucket(bucket, engines, dead)
                total += sum(tensor_bytes(t) for _, t in bucket)
                tensors += len(bucket)
                buckets += 1
                inflight.append(acks)
                if len(inflight) >= self.max_inflight:
                    settle(inflight.pop(0))
            for acks in inflight:
                settle(acks)
        except BaseException:
            ray.get(self._state.abort.remote())
            raise
        ray.get(self._state.commit.remote())
        for e, reason in sorted(dead.items()):
            self._restart(e, reason)
        return SyncStats(
            seconds=time.perf_counter() - start,
            bytes=total,
            buckets=buckets,
            engines=len(engines),
            tensors=tensors,
            restarts=sum(self.restarts) - restarts_before,
        )

    def _send_bucket(
        self, bucket: list[tuple[str, torch.Tensor]], engines: list[Any], dead: dict[int, str]
    ) -> list[Any]:
        import ray

        if self.transport.kind == "ray":
            ref = ray.put(flatten_bucket([(n, t.detach().cpu()) for n, t in bucket]))
            acks = [
                e.load_bucket.remote(ref) if i not in dead else ref for i, e in enumerate(engines)
            ]
        else:
            acks = self.transport.send(bucket, engines)
            ref = ray.put(flatten_bucket([(n, t.detach().cpu()) for n, t in bucket]))
        return [*acks, self._state.stage.remote(ref)]

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
