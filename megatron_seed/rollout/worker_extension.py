"""Methods mixed into every vLLM worker (`worker_extension_cls`), called by `collective_rpc`.

vLLM imports this module in every worker process before it loads the model, including the
tensor-parallel workers it starts itself: importing it registers the "objstore" weight
transfer backend there (`rollout.transfer.register`), which the worker's weight-transfer
engine is made from right after the model loads.

It also calls the one fix-up vLLM's in-place reload needs on a CPU (`cpu_moe.repack_cpu_moe`)
and holds the route record of a MoE model (`RouteBuffer`), which the import makes part of every model an
engine asking for it (`ROUTE_CAPTURE`) loads, before vLLM compiles it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from megatron_seed.rollout import cpu_moe, transfer

transfer.register()

# `additional_config` key of an engine whose model records its routes (`RouteBuffer`). The
# record is part of a CPU engine's compiled graph, and vLLM's compile cache keys on
# `additional_config`: a graph compiled without it is never loaded for an engine with it.
ROUTE_CAPTURE = "seed_route_capture"
_BUFFER = "seed_route_buffer"  # the model's attribute holding its `RouteBuffer`


class RouteBuffer:
    """The experts each MoE layer's router picked for each token of the last forward pass:
    `rows[t, layer, j]`, the j-th of the k experts of token t at the layer-th MoE layer.

    The router fills it: vLLM's `BaseRouter.select_experts` hands the top-k ids it routes by
    to its `capture_fn` (vLLM 0.32 `model_executor/layers/fused_moe/router/base_router.py`),
    the slot vLLM's own routed-experts return binds (`bind_routed_experts_capturer`,
    `fused_moe/routed_experts_capturer.py`): the rows are the experts the kernel used.

    Why it survives compilation and CUDA graphs: `capture` is one in-place copy into a tensor
    allocated once, before vLLM compiles the model (`bind`, from the loader). On a CPU the MoE
    layer is traced into the torch.compile graph (`MoERunner._select_forward`,
    `fused_moe/runner/moe_runner.py`), the copy with it. On a GPU the layer runs inside the
    opaque custom op `vllm::moe_forward`, whose Python runs at every compiled call and at
    CUDA-graph capture, which records the copy into this fixed address: each replay writes it
    again. Rows past a step's real tokens are padding; `record_steps` keeps the real ones, as
    vLLM's `RoutedExpertsCapturer.snapshot_routing_data` does. Forward hooks added after
    compilation never ran: a compiled engine "routed 0 tokens of a 7-token sequence"
    (test_compiled_routes.py).
    """

    def __init__(self, layer_ids: list[int], tokens: int, k: int, device: torch.device) -> None:
        self.columns = {layer_id: column for column, layer_id in enumerate(layer_ids)}
        self.rows = torch.zeros(tokens, len(layer_ids), k, dtype=torch.int16, device=device)
        self.recording = False
        self.steps: list[torch.Tensor] = []  # host copies of the recorded steps' rows

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        """Record MoE layer `layer_id`'s routing of this forward's tokens (`topk_ids`: [n, k])."""
        self.rows[: topk_ids.shape[0], self.columns[layer_id]] = topk_ids

    def record_steps(self, execute_model: Callable[..., Any]) -> Callable[..., Any]:
        """The model runner's `execute_model`, keeping while `recording` a host copy of the
        rows of each step's real tokens, taken right after its forward and before the next
        step's can overwrite them (on a GPU the copy waits for the forward)."""

        def recorded(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            out = execute_model(scheduler_output, *args, **kwargs)
            tokens = scheduler_output.total_num_scheduled_tokens
            if self.recording and tokens:
                self.steps.append(self.rows[:tokens].to("cpu", copy=True))  # [tokens, layers, k]
            return out

        return recorded

    def take(self) -> torch.Tensor:
        """The recorded steps' rows in order, `[tokens, layers, k]`; the record starts over."""
        routes = torch.cat(self.steps or [self.rows[:0].cpu()])
        self.steps = []
        return routes

    @classmethod
    def bind(cls, model: torch.nn.Module, vllm_config: Any) -> RouteBuffer | None:
        """A buffer for `model`'s MoE layers (whole-model layer order), bound to their
        routers; None for a dense model. Sized for the largest step (the scheduler's token
        budget), as vLLM sizes its own capturer."""
        if not vllm_config.model_config.is_moe:
            return None
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import (
            RoutedExpertsCaptureSource,
            bind_routed_experts_capturer,
        )
        from vllm.platforms import current_platform

        # the modules vLLM's binder gives a capture function (each with its layer_id)
        sources = (MoERunner, RoutedExpertsCaptureSource)
        layer_ids = sorted({m.layer_id for m in model.modules() if isinstance(m, sources)})
        buffer = cls(
            layer_ids,
            tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            k=vllm_config.model_config.get_num_experts_per_tok(),
            device=torch.device(current_platform.device_type),  # where the routers compute
        )
        try:
            bind_routed_experts_capturer(model, buffer)  # type: ignore[arg-type]
        except ValueError as e:  # a MoE kernel that routes inside itself and reports nothing
            setattr(model, _BUFFER, str(e))  # the engine starts; reading its routes says why
            return None
        setattr(model, _BUFFER, buffer)
        return buffer


def record_routes_from_load() -> None:
    """Make vLLM's model loader bind a `RouteBuffer` to every MoE model it loads for an engine
    whose `additional_config` sets `ROUTE_CAPTURE` (idempotent). The loader is the last step
    before the model runner compiles the model and captures its graphs (`load_model`, then
    profiling and warm-up); `collective_rpc` reaches a worker only after both."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    load: Callable[..., torch.nn.Module] = BaseModelLoader.load_model
    if getattr(load, "seed_routes", False):
        return

    def load_model(self: Any, vllm_config: Any, model_config: Any, prefix: str = "") -> Any:
        model = load(self, vllm_config, model_config, prefix)
        extra = vllm_config.additional_config
        if isinstance(extra, dict) and extra.get(ROUTE_CAPTURE):
            RouteBuffer.bind(model, vllm_config)
        return model

    load_model.seed_routes = True  # type: ignore[attr-defined]
    BaseModelLoader.load_model = load_model  # type: ignore[method-assign]


record_routes_from_load()


class SeedWorkerExtension:
    """Methods mixed into every vLLM worker (`worker_extension_cls`), called by collective_rpc."""

    def seed_reload_weights(self, payload: Any) -> int:
        """Reload checkpoint-format weights in place; returns the number of tensors.

        `payload` is a list of (HF name, tensor) (in-process engines) or safetensors bytes
        (multiprocess engines, where arguments are serialised).
        """
        if isinstance(payload, bytes | bytearray | memoryview):
            from safetensors.torch import load as load_safetensors

            weights = list(load_safetensors(bytes(payload)).items())
        else:
            weights = list(payload)
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        cpu_moe.repack_cpu_moe(self.model_runner.get_model(), (name for name, _ in weights))  # type: ignore[attr-defined]
        return len(weights)

    def seed_route_capture(self, on: bool) -> int:
        """Start (`on`) or stop recording which experts each MoE layer's router picks, for
        every token of every forward pass, kept until `seed_take_routes` (`RouteBuffer`).
        Returns the number of MoE layers (0: a dense model)."""
        runner = self.model_runner  # type: ignore[attr-defined]
        buffer: RouteBuffer | str | None = getattr(runner.get_model(), _BUFFER, None)
        if not isinstance(buffer, RouteBuffer):
            if runner.model_config.is_moe:
                why = buffer or (
                    f"build it with additional_config={{{ROUTE_CAPTURE!r}: True}} (VLLMEngine does)"
                )
                raise RuntimeError(f"this engine's model does not record its routes: {why}")
            return 0
        parallel = runner.vllm_config.parallel_config
        if parallel.data_parallel_size > 1 or parallel.use_ubatching:
            # a router then sees other ranks' tokens, or one step's tokens in parts
            raise NotImplementedError("route read-back needs data_parallel_size 1, no ubatching")
        if not getattr(self, "_seed_steps_recorded", False):
            runner.execute_model = buffer.record_steps(runner.execute_model)
            self._seed_steps_recorded = True
        buffer.recording, buffer.steps = on, []
        return buffer.rows.shape[1]

    def seed_take_routes(self) -> Any:
        """The routes recorded since the last call, `[tokens, layers, k]` int16 (numpy), the
        tokens of the forward passes in order; the record starts over."""
        return getattr(self.model_runner.get_model(), _BUFFER).take().numpy()  # type: ignore[attr-defined]

    def seed_reseed(self, seed: int) -> None:
        """Restart the sampler's random stream (it draws for requests without a seed)."""
        torch.manual_seed(seed)

    def seed_weight_checksum(self) -> float:
        """Sum of all parameters (float64): a cheap probe that two engines hold the same weights."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(sum(p.detach().double().sum() for p in model.parameters()))
