"""Everything that differs between machines and megatron-core versions, in one place.

Megatron-core is written for CUDA. On a CPU-only machine (the test bed and the default job)
`enable_cpu_mode()` neutralises its CUDA assumptions so that the *same* Megatron code paths
(GPTModel with the local layer spec, tensor/pipeline parallel over gloo, DDP grad buffers,
the optimizer's gradient clipping, dist-checkpointing) run in float32 on the CPU:

1. `torch.cuda.current_device()` (RoPE buffers, TP collectives, p2p shapes) returns "cpu".
2. `device="cuda"` literals (the default causal mask, the schedules' token counters, the
   grad-norm reduction) and `Tensor.cuda()` are redirected to the CPU by a torch function
   mode (`_CudaToCpuMode`), which only rewrites the `device` argument of factory calls.
3. `torch.cuda.synchronize`, `current_stream`, `default_stream` and `stream` become no-ops
   (p2p after send/recv, the DDP buffer, the checkpoint writer call them).
4. The RNG tracker is created without CUDA RNG state (`inference_rng_tracker=True`).
5. The optimizer's gradient clipping asserts CUDA tensors and uses a CUDA multi-tensor
   kernel: `_clip_grads_cpu` (same arithmetic: scale by max_norm / (norm + 1e-6)) replaces it.
6. Activation recompute (`CheckpointFunction`) saves and restores the CUDA RNG state around
   each recomputed block: on the CPU there is none (the CPU RNG state, which it also saves,
   is the one that matters), so getting it returns an empty placeholder and setting it is a
   no-op.
7. Mixture-of-experts layers (`_moe_cpu_mode`): the all-to-all dispatcher makes a `torch.cuda.Stream` for its
   device-to-host copies (a `_NoStream` here, whose recorded event synchronises at once) and
   converts the split sizes to numpy only when they are on a GPU, while gloo's
   `all_to_all_single` takes them only as integers (so they are converted on the CPU too).
   With expert TP > 1 the dispatcher gathers and reduce-scatters each TP rank's own number
   of routed tokens, which gloo refuses (equal sizes only): `_uneven_collectives` pads them.

With CUDA present `enable_cpu_mode()` does nothing. One patch applies on every device,
GPUs without Transformer Engine too (`megatron_without_te`, called by `init_parallel`): the
MoE router's GEMM names TE's `te_general_gemm`, which megatron-core leaves undefined when TE
does not import (a NameError at the first routed token, seen on a GPU; None selects its
torch path). Version differences between the
megatron-core that Python 3.11 resolves to (0.16.x) and the newest (Python 3.12) are the
small functions at the bottom of this module.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CPU_MODE_ON = False


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, int):
        return True  # a bare index means a CUDA ordinal
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


class _CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA `device=` arguments to the CPU and makes `Tensor.cuda()` a no-op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            kwargs = {**kwargs, "device": "cpu"}
        if func in (torch.Tensor.to,) and args and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _NoStream:
    """Stands in for a CUDA stream on the CPU."""

    def wait_stream(self, *_: Any) -> None:
        return None

    def record_event(self, *_: Any) -> _NoStream:
        return self  # an event that is complete: its `synchronize` returns at once

    def synchronize(self) -> None:
        return None


def enable_cpu_mode() -> bool:
    """Make megatron-core run on the CPU. Returns True if the CPU mode is (now) on.

    Idempotent; does nothing and returns False when CUDA is available.
    """
    global _CPU_MODE_ON
    if torch.cuda.is_available():
        return False
    if _CPU_MODE_ON:
        return True
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *_a, **_k: None  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *_a, **_k: _NoStream()  # type: ignore[assignment]
    torch.cuda.default_stream = lambda *_a, **_k: _NoStream()  # type: ignore[assignment]
    torch.cuda.stream = lambda *_a, **_k: contextlib.nullcontext()  # type: ignore[assignment]
    _CudaToCpuMode().__enter__()  # stays on the mode stack for the life of the process
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer

    clip_grads.clip_grad_by_total_norm_fp32 = _clip_grads_cpu
    optimizer.clip_grad_by_total_norm_fp32 = _clip_grads_cpu
    import megatron.core.tensor_parallel.random as tp_random

    # activation recompute saves and restores the CUDA RNG around each recomputed block
    tp_random._get_cuda_rng_state = lambda *_a, **_k: torch.empty(0, dtype=torch.uint8)
    tp_random._set_cuda_rng_state = lambda *_a, **_k: None
    _moe_cpu_mode()
    _CPU_MODE_ON = True
    return True


def _moe_cpu_mode() -> None:
    """Item 7 of this module's list: megatron-core's MoE layers on the CPU."""
    torch.cuda.Stream = _NoStream  # type: ignore[assignment,misc]
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    to_cpu = moe_utils.maybe_move_tensor_to_cpu

    def split_sizes_to_numpy(
        tensor: Any, as_numpy: bool = False, record_stream: bool = False
    ) -> Any:
        moved = to_cpu(tensor, as_numpy=as_numpy, record_stream=record_stream)
        if as_numpy and torch.is_tensor(moved):
            return moved.numpy()
        return moved

    dispatcher.maybe_move_tensor_to_cpu = split_sizes_to_numpy
    _uneven_collectives()


def _uneven_collectives() -> None:
    """`torch.distributed.all_gather` and `reduce_scatter` (list forms) with pieces of
    different lengths along dim 0, which gloo refuses: each piece padded to the longest,
    the equal-size collective, the padding dropped. Equal pieces go straight through."""
    import torch.distributed as dist

    all_gather, reduce_scatter = dist.all_gather, dist.reduce_scatter

    def padded(t: torch.Tensor, rows: int) -> torch.Tensor:
        out = t.new_zeros((rows, *t.shape[1:]))
        out[: t.shape[0]] = t
        return out

    def gather(outputs: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
               async_op: bool = False) -> Any:  # fmt: skip
        if all(o.shape == tensor.shape for o in outputs) or async_op:
            return all_gather(outputs, tensor, group=group, async_op=async_op)
        rows = max(o.shape[0] for o in outputs)
        parts = [tensor.new_empty((rows, *tensor.shape[1:])) for _ in outputs]
        all_gather(parts, padded(tensor, rows), group=group)
        for out, part in zip(outputs, parts, strict=True):
            out.copy_(part[: out.shape[0]])
        return None

    def scatter(output: torch.Tensor, inputs: list[torch.Tensor], op: Any = dist.ReduceOp.SUM,
                group: Any = None, async_op: bool = False) -> Any:  # fmt: skip
        if all(t.shape == output.shape for t in inputs) or async_op:
            return reduce_scatter(output, inputs, op=op, group=group, async_op=async_op)
        rows = max(t.shape[0] for t in inputs)
        reduced = output.new_empty((rows, *output.shape[1:]))
        stacked = torch.cat([padded(t, rows) for t in inputs])  # [world * rows, ...]
        dist.reduce_scatter_tensor(reduced, stacked, op=op, group=group)
        output.copy_(reduced[: output.shape[0]])
        return None

    dist.all_gather, dist.reduce_scatter = gather, scatter


def megatron_without_te() -> None:
    """Define the Transformer Engine names megatron-core's MoE router reads but leaves
    undefined when TE does not import (this module's docstring); idempotent."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _clip_grads_cpu(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """CPU twin of megatron-core's `clip_grad_by_total_norm_fp32`."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for p in parameters:
            grad = p.decoupled_grad if use_decoupled_grad else p.grad
            if grad is not None:
                grad.mul_(clip_coeff)


def cpu_mode_enabled() -> bool:
    """Whether `enable_cpu_mode()` has patched this process."""
    return _CPU_MODE_ON


# ---------------------------------------------------------------- megatron-core versions


def megatron_core_version() -> tuple[int, int]:
    """(major, minor) of the installed megatron-core."""
    major, minor = importlib.metadata.version("megatron-core").split(".")[:2]
    return int(major), int(minor)


def model_parallel_seed(seed: int) -> None:
    """Seed Megatron's model-parallel RNG tracker without touching CUDA RNG state on CPU."""
    from megatron.core import tensor_parallel

    fn = tensor_parallel.model_parallel_cuda_manual_seed
    if torch.cuda.is_available():
        fn(seed)
    elif "inference_rng_tracker" in inspect.signature(fn).parameters:
        fn(seed, inference_rng_tracker=True)
    else:  # pragma: no cover - older releases
        fn(seed)


def filter_kwargs(
    fn: Any, kwargs: dict[str, Any], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The keyword arguments this megatron-core's `fn` accepts; `ValueError` naming any other
    one, unless it is in `optional` (switches whose absence changes nothing, e.g. a fusion
    turned off). A silently dropped `fp8_recipe` or `bf16` would change the model."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    dropped = sorted(k for k in kwargs if k not in params and k not in optional)
    if dropped:
        version = ".".join(map(str, megatron_core_version()))
        raise ValueError(
            f"megatron-core {version}: {getattr(fn, '__qualname__', fn)} does not accept "
            f"{', '.join(dropped)}"
        )
    return {k: v for k, v in kwargs.items() if k in params}
