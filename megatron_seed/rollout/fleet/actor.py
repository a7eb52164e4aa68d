"""The engine actor: one `VLLMEngine` per Ray actor, and `EngineActor`, the surface the
fleet calls on it (the fake in `testbed.fake_engine` implements the same, checked by
`tests/unit/test_engine_actor.py`)."""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

import torch

from megatron_seed.data.generation import Generation
from megatron_seed.rollout.engine import EngineSpec, SamplingSpec
from megatron_seed.rollout.weight_sync import FlatBucket, unflatten_bucket

Request = tuple[Any, list[int], SamplingSpec, int]  # (key, prompt ids, sampling, seed offset)


def engine_env(threads: int) -> dict[str, str]:
    """Environment variables of an engine actor (and of vLLM's TP workers, which inherit its
    runtime environment). `CUDA_DEVICE_MAX_CONNECTIONS` is CUDA's default (8): the trainer's
    ranks set 1 for Megatron's overlapped TP communication (`models.parallel`), and a Ray
    started from a rank would hand that one hardware queue to every engine on the node."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_DEVICE_MAX_CONNECTIONS": "8",
    }


class EngineActor(Protocol):
    """What the fleet calls on each engine actor (remotely). Built as
    `cls(model_dir, spec, threads)`; the weight-transfer calls are vLLM's
    `VLLMWeightSyncClient` ones, fanned out by `sync._SyncClient`."""

    def __init__(self, model_dir: str, spec: EngineSpec, threads: int) -> None: ...

    def ready(self) -> int:
        """The actor's process id, once the engine is built."""
        ...

    def on_gpu(self) -> bool:
        """Whether the engine runs on a GPU."""
        ...

    def node(self) -> tuple[str, str]:
        """(node name, Ray node id) of the actor."""
        ...

    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, offsets: list[int]
    ) -> list[Generation]:
        """One completion per prompt; request k's seed is `spec.seed + offsets[k]`."""
        ...

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """Log-prob of every token after the first of each sequence."""
        ...

    def routes(self, sequences: list[list[int]]) -> list[Any]:
        """The experts each MoE layer picks for every token of each sequence
        (`[len, layers, k]`); `ValueError` for a model without experts."""
        ...

    def advance(
        self, requests: list[Request], linger_s: float = 0.0, until_done: list[Any] | None = None
    ) -> list[Any]:
        """The streaming call (`VLLMEngine.advance`): finished (key, Generation) pairs."""
        ...

    def usage(self) -> dict[str, float]:
        """`busy_s` (seconds generating) and `cpu_s` (the actor's CPU seconds)."""
        ...

    def load_bucket(self, bucket: FlatBucket | str) -> int:
        """Load one replayed bucket (a flat bucket, or a safetensors file of one)."""
        ...

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None: ...

    def shutdown_weight_transfer_engine(self) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict[str, Any]) -> None: ...

    def finish_weight_update(self) -> None: ...

    def weights_dtype(self) -> str:
        """The torch dtype name of the engine's weights."""
        ...

    def weight_checksum(self) -> float:
        """Sum of all parameters."""
        ...

    def reseed(self, seed: int) -> None:
        """Restart the unseeded sampling stream at `seed`."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Give the GPU memory back (weights to host, KV cache dropped)."""
        ...

    def wake(self, tags: list[str] | None = None) -> None:
        """Take back `tags` ("weights", "kv_cache"; None: both)."""
        ...


class VLLMEngineActor:
    """`EngineActor` over one `VLLMEngine`."""

    def __init__(self, model_dir: str, spec: EngineSpec, threads: int) -> None:
        torch.set_num_threads(threads)
        from megatron_seed.rollout.engine import VLLMEngine

        self.engine = VLLMEngine.from_spec(model_dir, spec)

    def ready(self) -> int:
        return os.getpid()

    def on_gpu(self) -> bool:
        return bool(self.engine.on_gpu)

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

    def routes(self, sequences: list[list[int]]) -> list[Any]:
        return self.engine.routes(sequences)

    def advance(
        self, requests: list[Request], linger_s: float = 0.0, until_done: list[Any] | None = None
    ) -> list[Any]:
        return self.engine.advance(requests, linger_s, until_done or ())

    def usage(self) -> dict[str, float]:
        return {"busy_s": self.engine.busy_s, "cpu_s": time.process_time()}

    def load_bucket(self, bucket: FlatBucket | str) -> int:
        if isinstance(bucket, str):
            from safetensors.torch import load_file

            return self.engine.update_weights(load_file(bucket).items())
        return self.engine.update_weights(unflatten_bucket(bucket))

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.engine.init_transfer(init_info)

    def shutdown_weight_transfer_engine(self) -> None:
        self.engine.shutdown_transfer()

    def start_weight_update(self) -> None:
        self.engine.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.engine.receive(update_info)

    def finish_weight_update(self) -> None:
        self.engine.finish_weight_update()

    def weights_dtype(self) -> str:
        return self.engine.weights_dtype()

    def weight_checksum(self) -> float:
        return self.engine.weight_checksum()

    def reseed(self, seed: int) -> None:
        self.engine.reseed(seed)

    def sleep(self, level: int = 1) -> None:
        self.engine.sleep(level)

    def wake(self, tags: list[str] | None = None) -> None:
        self.engine.wake(tags)
