"""Methods mixed into every vLLM worker (`worker_extension_cls`), called by `collective_rpc`.

vLLM imports this module in every worker process before it loads the model, including the
tensor-parallel workers it starts itself: importing it registers the "objstore" weight
transfer backend there (`rollout.transfer.register`), which the worker's weight-transfer
engine is made from right after the model loads.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_seed.rollout import transfer

transfer.register()


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
        return len(weights)

    def seed_reseed(self, seed: int) -> None:
        """Restart the sampler's random stream (it draws for requests without a seed)."""
        torch.manual_seed(seed)

    def seed_weight_checksum(self) -> float:
        """Sum of all parameters (float64): a cheap probe that two engines hold the same weights."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(sum(p.detach().double().sum() for p in model.parameters()))
