"""Trainer -> rollout fleet weight streaming: buckets and flat buffers.

The trainer side is `SeedTrainer.export_weights`: a stream of (HF name, full tensor), in
`hf_names` order, that every model-parallel rank iterates (it is a collective). Trainer
rank 0 feeds it to the fleet through vLLM's weight-transfer API (`rollout.transfer`); the
object-store backend and the fleet's replay copy group it into buckets of about
`bucket_bytes` (`iter_buckets`), each packed into one flat byte buffer (`FlatBucket`): one
object to ship, read zero-copy on the other side.

Buckets never split a fused vLLM module: q/k/v_proj (-> qkv_proj), gate/up_proj
(-> gate_up_proj) of one layer, and every expert of one MoE layer (-> its FusedMoE module,
one [E, 2F, H] and one [E, H, F] tensor) land in the same bucket, because a replayed bucket
is loaded by one `reload_weights` call, and vLLM's layerwise in-place reload rebuilds a
fused module from the tensors of ONE reload call (splitting q from k/v, or one layer's
experts, across two calls gives NaNs or garbage; measured). A bucket can therefore exceed
`bucket_bytes` by at most one fused module: for an MoE layer, all of its experts (Qwen3-
30B-A3B: 128 x 3 x 2048 x 768 x 2 bytes = 1.2 GB in bf16).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_FUSED = re.compile(
    r"^(model\.layers\.\d+\.)(self_attn\.[qkv]_proj|mlp\.(?:gate|up)_proj|mlp\.experts)\."
)


def fusion_key(name: str) -> str:
    """The vLLM module an HF tensor is loaded into (tensors with equal keys travel together):
    `model.layers.3.self_attn.qkv_proj` for its q/k/v_proj, `model.layers.3.mlp.experts` for
    every tensor of every expert of that layer."""
    match = _FUSED.match(name)
    if match is None:
        return name.rsplit(".", 1)[0]
    prefix, module = match.groups()
    if module.startswith("self_attn"):
        return prefix + "self_attn.qkv_proj"
    return prefix + ("mlp.experts" if module == "mlp.experts" else "mlp.gate_up_proj")


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's data."""
    return t.numel() * t.element_size()


def iter_buckets(
    weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a (name, tensor) stream into lists of about `bucket_bytes`, consuming it once.

    A bucket closes once it holds >= `bucket_bytes`, but never between tensors of the same
    fused module. Tensors of one fused module must be adjacent in the stream (they are in
    `hf_names` order); a module that reappears after its bucket closed is an error.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    closed: set[str] = set()
    open_keys: set[str] = set()
    for name, tensor in weights:
        key = fusion_key(name)
        if key in closed:
            raise ValueError(
                f"{name!r} belongs to {key!r}, whose other tensors were already sent in an "
                "earlier bucket: the tensors of a fused module must be adjacent in the stream"
            )
        if size >= bucket_bytes and key not in open_keys:
            yield bucket
            closed |= open_keys
            bucket, size, open_keys = [], 0, set()
        bucket.append((name, tensor))
        open_keys.add(key)
        size += tensor_bytes(tensor)
    if bucket:
        yield bucket


# ------------------------------------------------------------------ flat buckets


@dataclass
class FlatBucket:
    """Tensors packed into one contiguous byte buffer (one object to ship, zero-copy to read).

    names/dtypes/shapes/offsets describe tensor i = data[offsets[i] : offsets[i] + nbytes_i].
    `data` is a uint8 numpy array (on the CPU) or a uint8 torch tensor (on a GPU).
    """

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]
    data: Any

    @property
    def nbytes(self) -> int:
        """Payload bytes."""
        return int(self.data.nbytes if isinstance(self.data, np.ndarray) else self.data.numel())

    def meta(self) -> FlatBucket:
        """The same description without the payload (what the NCCL receivers get)."""
        return FlatBucket(self.names, self.dtypes, self.shapes, self.offsets, None)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def flatten_bucket(tensors: list[tuple[str, torch.Tensor]], device: str = "cpu") -> FlatBucket:
    """Pack tensors into one uint8 buffer (numpy on CPU, torch on `device` otherwise)."""
    names, dtypes, shapes, offsets = [], [], [], []
    total = 0
    for name, t in tensors:
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(tuple(t.shape))
        offsets.append(total)
        total += tensor_bytes(t)
    flat = torch.empty(total, dtype=torch.uint8, device=device)
    for (_, t), off in zip(tensors, offsets, strict=True):
        # view(-1).view(uint8): raw bytes, works for bf16 (numpy has no bf16)
        flat[off : off + tensor_bytes(t)].copy_(t.detach().contiguous().view(-1).view(torch.uint8))
    data: Any = flat.numpy() if device == "cpu" else flat
    return FlatBucket(names, dtypes, shapes, offsets, data)


def unflatten_bucket(bucket: FlatBucket) -> list[tuple[str, torch.Tensor]]:
    """Views of the packed tensors (no copy; read-only if the buffer is)."""
    data = bucket.data
    if isinstance(data, np.ndarray):
        if not data.flags.writeable:  # an object-store buffer: torch wants a writable one
            data = (
                torch.frombuffer(memoryview(data), dtype=torch.uint8)
                if data.size
                else torch.empty(0, dtype=torch.uint8)
            )
        else:
            data = torch.from_numpy(data)
    out = []
    for name, dt, shape, off in zip(
        bucket.names, bucket.dtypes, bucket.shapes, bucket.offsets, strict=True
    ):
        dtype = _dtype(dt)
        n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        out.append((name, data[off : off + n].view(dtype).view(shape)))
    return out


def drain(weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Iterate a collective export to its end on ranks that do not feed the fleet."""
    for _ in weights:
        pass
