"""The project's weight-transfer classes against the installed vLLM's own base classes, used
the way vLLM's own senders use them, so a vLLM whose interface moved fails here and not in
the first GPU job (`rollout/transfer.py`, `rollout/fleet/`, `rollout/worker_extension.py`).

vLLM's NCCL sender asks the source for `metadata()`, checks every yielded tensor against it
(`_checked_iter`) and, on non-sender ranks, drains the stream; its IPC sender iterates the
source; `iter_groups` (the base class) batches the stream by layer and checks its order. All
of that is plain Python on the CPU: only the wire (NCCL, CUDA IPC) needs a GPU.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

DTYPE = torch.bfloat16


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list]:
    """(metadata, stream): a tiny Qwen2's export, in the order and dtype the trainer sends."""
    from megatron_seed.models.convert import HFCheckpoint
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.rollout.transfer import export_meta

    ckpt = HFCheckpoint(make_tiny_qwen(tmp_path_factory.mktemp("m") / "m"))
    meta = export_meta(ckpt.spec, DTYPE)
    return meta, [(m.name, ckpt.get(m.name).float()) for m in meta]  # fp32: the source casts


def drive_like_vllms_senders(make_source: Callable[[Iterable, list], Any], export) -> None:
    """Everything vLLM's trainer-side engines do with a `WeightSource` short of the wire.

    `make_source(stream, meta)` builds a fresh source; each use below gets its own, since a
    source is iterated once per sync."""
    from vllm.distributed.weight_transfer import base
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    meta, stream = export
    names = [m.name for m in meta]

    # the NCCL sender: metadata first (it sizes the receivers), then every tensor checked
    source = make_source(stream, meta)
    declared = source.metadata()
    assert [m.name for m in declared] == names
    sent = list(NCCLTrainerWeightTransferEngine._checked_iter(source, declared))
    assert [n for n, _ in sent] == names and {t.dtype for _, t in sent} == {DTYPE}

    # a non-sender NCCL rank: metadata, then the stream drained as a collective (no CUDA)
    source = make_source(stream, meta)
    engine = NCCLTrainerWeightTransferEngine(client=None, source=source, is_sender=False)
    engine.send_weights()
    assert source.tensors == len(meta)

    # the base class's layer-wise batching, with its order check against metadata()
    source = make_source(stream, meta)
    grouped = [n for group, _ in source.iter_groups() for n in group]
    assert grouped == names and base.layerwise_groups(names)

    # the iteration entry points a newer base class may add (all must give the same stream)
    for hook in ("iter_full",):
        if hasattr(base.WeightSource, hook):
            source = make_source(stream, meta)
            assert [n for n, *_ in getattr(source, hook)()] == names, hook


def test_export_source_is_what_vllms_senders_consume(export) -> None:
    from megatron_seed.rollout.transfer import ExportSource

    drive_like_vllms_senders(lambda stream, meta: ExportSource(stream, meta, DTYPE), export)


def test_a_source_that_disagrees_with_its_metadata_is_refused_by_vllm(export) -> None:
    """The check the wire relies on is really there: a source whose stream and metadata
    differ (one shape off) is stopped by vLLM's own sender check, naming the tensor."""
    from megatron_seed.rollout.transfer import ExportSource

    meta, stream = export
    bad = [(n, t[..., :-1] if i == 3 else t) for i, (n, t) in enumerate(stream)]
    with pytest.raises((ValueError, AssertionError), match=meta[3].name.replace(".", r"\.")):
        drive_like_vllms_senders(lambda s, m: ExportSource(bad, m, DTYPE), (meta, stream))


def test_the_fleets_client_is_vllms_weight_sync_client_and_the_engines_are_complete() -> None:
    """The fleet's sync client implements vLLM's `VLLMWeightSyncClient` protocol method for
    method (same parameters), and both objstore engines implement every abstract method of
    their base."""
    from vllm.distributed.weight_transfer.base import VLLMWeightSyncClient

    from megatron_seed.rollout import transfer
    from megatron_seed.rollout.fleet.sync import _SyncClient

    protocol = [
        n for n, f in vars(VLLMWeightSyncClient).items() if inspect.isfunction(f) and n[0] != "_"
    ]
    assert protocol, "vLLM's client protocol has no methods?"
    for name in protocol:
        want = list(inspect.signature(getattr(VLLMWeightSyncClient, name)).parameters)
        have = list(inspect.signature(getattr(_SyncClient, name)).parameters)
        assert have[: len(want)] == want, (name, have, want)
    for cls in (transfer.ObjectStoreEngine, transfer.ObjectStoreTrainerEngine):
        assert not cls.__abstractmethods__, (cls.__name__, cls.__abstractmethods__)
    info = transfer.trainer_init_info("objstore", 1 << 20, world_size=2)
    assert info.backend == transfer.OBJSTORE and info.is_sender


def test_the_worker_extension_does_not_shadow_a_vllm_worker_method() -> None:
    """vLLM mixes `SeedWorkerExtension` into its worker class; a method name the worker
    already has would silently replace vLLM's own."""
    from vllm.v1.worker.gpu_worker import Worker

    from megatron_seed.rollout.worker_extension import SeedWorkerExtension

    ours = {n for n in vars(SeedWorkerExtension) if not n.startswith("__")}
    assert ours and not ours & set(dir(Worker)), ours & set(dir(Worker))
    for name in ours:
        assert name.startswith("seed_"), name
    assert Path(inspect.getfile(Worker)).is_file()
