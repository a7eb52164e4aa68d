"""The colocated hand-over's host copy of the optimizer state, in page-locked buffers.

While colocated engines generate, the trainer's optimizer state (fp32 master weights, Adam
moments) waits in host memory (`SeedTrainer.release_memory`). megatron-core's own RL offload
(`MegatronOptimizer.offload_to_cpu`) copies each tensor with `.cpu()` into freshly allocated
pageable memory every time: the first H200 run measured 1.5 GiB/s for such copies, ~40 s per
update and rank at Qwen3-30B-A3B's 62 GB of state. Here each tensor gets one page-locked
(pinned) host buffer, made at the first release and reused by every later one, so the copies
run as DMA at the link's speed and nothing is allocated per update; the buffers stay for the
trainer's life (`launch.layout.node_host_memory_gib` counts them in every phase, not only
while the engines generate).

The optimizer keeps its objects: a master weight's `.data` and each state entry point to the
host buffer while released and to a new device tensor after `reclaim` (the same values,
bit for bit). Every tensor on `device` is moved; on a CPU (tests) pass `device="cpu"` and the
same copies run between ordinary memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

Slot = tuple[Any, ...]  # which tensor of which optimizer: a buffer's key


class PinnedHostOffload:
    """Host buffers for one optimizer's state, reused across hand-overs."""

    def __init__(self, pin: bool | None = None) -> None:
        # page-locked memory needs a CUDA context; without one the buffers are ordinary
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.buffers: dict[Slot, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        """Bytes the host buffers hold (made at the first release)."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def release(self, optimizer: Any, device: torch.device | str) -> int:
        """Copy every optimizer tensor on `device` into its host buffer and point the
        optimizer at the buffer (the device copies are then free). Returns bytes moved."""
        device = torch.device(device)
        moved = 0
        for key, tensor, put in _slots(optimizer):
            if tensor.device.type != device.type or _is_buffer(self.buffers.get(key), tensor):
                continue
            buffer = self.buffers.get(key)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = torch.empty(
                    tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self.pin
                )
                self.buffers[key] = buffer
            buffer.copy_(tensor, non_blocking=self.pin)
            put(buffer)
            moved += tensor.numel() * tensor.element_size()
        if self.pin:
            torch.cuda.synchronize()  # the copies are done before the device memory is reused
        return moved

    def reclaim(self, optimizer: Any, device: torch.device | str) -> int:
        """Copy every tensor the optimizer holds in a host buffer back to `device` (the
        buffers stay for the next release). Returns bytes moved."""
        device = torch.device(device)
        moved = 0
        for key, tensor, put in _slots(optimizer):
            if not _is_buffer(self.buffers.get(key), tensor):
                continue
            back = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
            back.copy_(tensor, non_blocking=self.pin)
            put(back)
            moved += tensor.numel() * tensor.element_size()
        if self.pin:
            torch.cuda.synchronize()
        return moved


def _is_buffer(buffer: torch.Tensor | None, tensor: torch.Tensor) -> bool:
    """Whether `tensor` is (the storage of) that host buffer."""
    return buffer is not None and tensor.data_ptr() == buffer.data_ptr()


def _slots(optimizer: Any) -> Iterator[tuple[Slot, torch.Tensor, Any]]:
    """(key, tensor, setter) for every tensor of every inner torch optimizer: each
    parameter group's parameters (megatron-core's fp32 master weights; set through `.data`)
    and each parameter's state entries (Adam's step, exp_avg, exp_avg_sq)."""
    for o, opt in enumerate(getattr(optimizer, "chained_optimizers", None) or [optimizer]):
        inner = getattr(opt, "optimizer", opt)  # megatron wraps a torch optimizer
        if inner is None or getattr(opt, "is_stub_optimizer", False):
            continue
        for g, group in enumerate(inner.param_groups):
            for i, param in enumerate(group["params"]):
                yield (o, "param", g, i), param.data, _set_data(param)
                state = inner.state.get(param, {})
                for name, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim():
                        yield (o, "state", g, i, name), value, _set_item(state, name)


def _set_data(param: torch.Tensor) -> Any:
    def put(tensor: torch.Tensor) -> None:
        param.data = tensor

    return put


def _set_item(state: dict[str, Any], name: str) -> Any:
    def put(tensor: torch.Tensor) -> None:
        state[name] = tensor

    return put
