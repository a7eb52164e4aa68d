"""Trainer -> engine weight transfer through vLLM's weight-transfer API, one code path for all.

vLLM (`vllm/distributed/weight_transfer/`) pairs a worker-side engine (made by
`WeightTransferEngineFactory` from the LLM's `weight_transfer_config.backend`) with a
trainer-side engine (`WeightTransferTrainerFactory.trainer_init(init_info, client=...,
source=...)`) whose `send_weights()` drives the LLM through a `VLLMWeightSyncClient`: start
a weight update (layerwise reload begins), one `update_weights` per chunk, finish (layers
finalised: CPU repacking, post-load processing). Which backend:

  "objstore"  any device (the CPU default): registered here in both factories under
              `OBJSTORE`. Each bucket of about `bucket_bytes` (`weight_sync.iter_buckets`)
              is packed into one flat buffer, put in Ray's object store once, and every
              engine's worker reads it zero-copy and loads it.
  "ipc"       vLLM's CUDA IPC engine: engines colocated on the trainer's GPUs map the
              trainer's tensors (handles keyed by GPU UUID, so `CUDA_VISIBLE_DEVICES` may
              differ between the two sides; packed, one reused staging buffer, freed with
              `torch.cuda.ipc_collect()` by vLLM's trainer engine).
  "nccl"      vLLM's NCCL engine: engines on other GPUs join one group with trainer rank 0
              (packed, double-buffered broadcast).

The fleet is the client (`rollout.fleet.sync` implements `VLLMWeightSyncClient` with a
timeout on every call); `ExportSource` turns the trainer's export stream into vLLM's
`WeightSource` and tees every tensor into the fleet's replay copy. The GPU backends are
vLLM's own code: they run only on a CUDA build (they are not exercised on a CPU machine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from megatron_seed.rollout.weight_sync import FlatBucket, flatten_bucket, iter_buckets

OBJSTORE = "seed_objstore"
BACKENDS = {"objstore": OBJSTORE, "ipc": "ipc", "nccl": "nccl"}


def vllm_backend(transport: str) -> str:
    """vLLM's backend name for a `FleetConfig.transport`."""
    if transport not in BACKENDS:
        raise ValueError(f"unknown weight transport {transport!r}; choose from {list(BACKENDS)}")
    return BACKENDS[transport]


# ----------------------------------------------------------------- worker side


@dataclass
class ObjectStoreInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the object store is Ray's."""


@dataclass
class ObjectStoreUpdateInfo(WeightTransferUpdateInfo):
    """One bucket: where its tensors lie in the flat buffer, and the buffer (an ObjectRef,
    or the `FlatBucket` itself when the caller already holds it)."""

    names: list[str] = field(default_factory=list)
    dtype_names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    data: Any = None


class ObjectStoreEngine(WeightTransferEngine[ObjectStoreInitInfo, ObjectStoreUpdateInfo]):
    """Worker side of "objstore": read each bucket from Ray's object store and load it."""

    init_info_cls = ObjectStoreInitInfo
    update_info_cls = ObjectStoreUpdateInfo

    def init_transfer_engine(self, init_info: ObjectStoreInitInfo) -> None:
        """Nothing to do (the worker runs inside a Ray actor)."""

    def start_weight_update(self) -> None:
        """Begin vLLM's layerwise reload (layers are rebuilt as their tensors arrive)."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)
        self.loaded: list[str] = []  # the names this update wrote (CPU MoE re-pack)

    def receive_weights(self, update_info: ObjectStoreUpdateInfo) -> None:
        """Load one bucket (views of the flat buffer: no copy before `load_weights`)."""
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        from megatron_seed.rollout.weight_sync import unflatten_bucket

        data = update_info.data
        if not isinstance(data, FlatBucket):
            import ray

            data = ray.get(data)
        with disable_mtp_completeness_check():
            self.model.load_weights(unflatten_bucket(data))
        self.loaded += update_info.names

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """`receive_weights` without the base class's accelerator synchronize (CPU-safe;
        nothing is asynchronous here)."""
        self.receive_weights(self.parse_update_info(update_info))

    def finish_weight_update(self) -> None:
        """Finish the reload (untouched layers keep their weights; CPU repacking, of MoE
        layers too: `cpu_moe.repack_cpu_moe`)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        from megatron_seed.rollout import cpu_moe

        finalize_layerwise_reload(self.model, self.model_config)
        cpu_moe.repack_cpu_moe(self.model, self.loaded)

    def shutdown(self) -> None:
        """Nothing held."""


# ----------------------------------------------------------------- trainer side


@dataclass(kw_only=True)
class ObjectStoreTrainerInitInfo(TrainerInitInfo):
    """Trainer side of "objstore": the bucket size."""

    backend: ClassVar[str] = OBJSTORE
    bucket_bytes: int = 64 << 20


class ObjectStoreTrainerEngine(TrainerWeightTransferEngine[ObjectStoreTrainerInitInfo]):
    """Puts each bucket in the object store once; every engine loads the same object."""

    init_info_cls = ObjectStoreTrainerInitInfo

    def __init__(self, *, client: Any, source: WeightSource | None, bucket_bytes: int) -> None:
        super().__init__(client=client, source=source, is_sender=True)
        self.bucket_bytes = bucket_bytes

    @classmethod
    def trainer_init(
        cls, init_info: ObjectStoreTrainerInitInfo, *, client: Any, source: Any = None
    ) -> ObjectStoreTrainerEngine:
        """Register with the engines (no rendezvous) and return the sender."""
        client.init_weight_transfer_engine({})
        return cls(client=client, source=source, bucket_bytes=init_info.bucket_bytes)

    def send_weights(self) -> None:
        """start -> one update per bucket -> finish, the stream consumed once."""
        import ray

        self.client.start_weight_update()
        for bucket in iter_buckets(self.source, self.bucket_bytes):
            flat = flatten_bucket([(n, t.detach().cpu()) for n, t in bucket])
            info = ObjectStoreUpdateInfo(
                names=flat.names,
                dtype_names=flat.dtypes,
                shapes=[list(s) for s in flat.shapes],
                offsets=flat.offsets,
                data=ray.put(flat),
            )
            self.client.update_weights(info.__dict__)
        self.client.finish_weight_update()


class ExportSource(WeightSource):
    """The trainer's export stream as vLLM's `WeightSource` (iterated once), each tensor in
    `dtype` and handed to `tee` (the fleet's replay copy) as it passes."""

    def __init__(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        meta: list[ParamMeta] | None = None,
        dtype: torch.dtype | None = None,
        tee: Callable[[str, torch.Tensor], None] | None = None,
    ) -> None:
        self._weights = iter(weights)
        self._meta = meta
        self.dtype = dtype
        self.tee = tee
        self.tensors = 0
        self.bytes = 0

    def metadata(self) -> list[ParamMeta]:
        """Names, dtypes and shapes in stream order (needed before iterating by "nccl")."""
        if self._meta is None:
            raise ValueError("this transfer needs the export's metadata up front (meta=...)")
        return self._meta

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._weights:
            if self.dtype is not None and tensor.dtype != self.dtype:
                tensor = tensor.to(self.dtype)
            self.tensors += 1
            self.bytes += tensor.numel() * tensor.element_size()
            if self.tee is not None:
                self.tee(name, tensor)
            yield name, tensor


def register() -> None:
    """Make "objstore" known to vLLM's two factories in this process (idempotent); every
    engine actor calls it before building its `LLM`, the fleet before a sync."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if OBJSTORE not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(OBJSTORE, ObjectStoreEngine)
    if OBJSTORE not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(OBJSTORE, ObjectStoreTrainerEngine)


_NCCL_GROUPS = [0]  # NCCL groups formed by this process (each rebuild takes a new port)


def nccl_init_info(world_size: int) -> Any:
    """vLLM's NCCL sender info for a group of trainer rank 0 + `world_size - 1` engine
    workers: this node's address and `SEED_WEIGHT_SYNC_PORT` (+1 per rebuild; a free port
    when unset)."""
    import os

    import ray
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    from megatron_seed.models.parallel import free_port

    base = int(os.environ.get("SEED_WEIGHT_SYNC_PORT", "0"))
    port = base + _NCCL_GROUPS[0] if base else free_port()
    _NCCL_GROUPS[0] += 1
    return NCCLTrainerInitInfo(
        rank=0,
        master_address=ray.util.get_node_ip_address(),
        master_port=port,
        world_size=world_size,
    )


def export_meta(spec: Any, dtype: torch.dtype) -> list[ParamMeta]:
    """The export stream's (name, dtype, shape) in order, known before any tensor is
    gathered (the NCCL receivers size their buffers from it)."""
    from megatron_seed.models.convert import hf_names, hf_shape

    return [ParamMeta(name, dtype, tuple(hf_shape(spec, name))) for name in hf_names(spec)]


def follow_sync(
    weights: Iterable[tuple[str, torch.Tensor]],
    transport: str,
    rank: int,
    dtype: torch.dtype,
    buffer_bytes: int,
) -> None:
    """A sync on trainer ranks other than 0 (a collective: every rank iterates the export).
    "objstore" and "nccl" send from rank 0 only: drain. "ipc": every colocated rank shares
    its own GPU's copy, so each joins vLLM's handle exchange (no client: rank 0 drives),
    with rank 0's staging buffer size `buffer_bytes` (`fleet.packed_bytes`)."""
    from megatron_seed.rollout.weight_sync import drain

    if transport != "ipc":
        drain(weights)
        return
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    info = IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=buffer_bytes)
    source = ExportSource(weights, dtype=dtype)
    WeightTransferTrainerFactory.trainer_init(info, client=None, source=source).send_weights()


def trainer_init_info(transport: str, bucket_bytes: int, world_size: int) -> Any:
    """vLLM's trainer init info of a transport for trainer rank 0 (the sender): the packed
    buffer of IPC/NCCL is `bucket_bytes` (`fleet.packed_bytes`)."""
    if transport == "objstore":
        return ObjectStoreTrainerInitInfo(rank=0, bucket_bytes=bucket_bytes)
    if transport == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=0, packed=True, packed_buffer_size_bytes=bucket_bytes)
    info = nccl_init_info(world_size)
    info.packed_buffer_size_bytes = bucket_bytes
    return info
