"""A stand-in for the fleet's engine actor: no vLLM, the same remote methods, recorded.

`Fleet(..., actor_cls=FakeEngineActor)` runs the fleet's own code (placement groups, the
weight-sync client and its deadlines, restarts, the replay copy, sleep/wake) against
engines that hold their weights in a dict and log every call to a shared `Recorder`
actor. It implements `rollout.fleet.EngineActor`, plus the `INSPECTION` methods tests
read. Behaviour is set through `EngineSpec.extra` (slot index = the engine's `seed`):

    fake_recorder   name of a `Recorder` actor (optional)
    fake_stall      {slot: seconds}: the first incarnation of that slot sleeps in
                    `update_weights` (a stalled transfer)
    fake_fail       [slot, ...]: its first incarnation raises in `update_weights` (a
                    failed reload)
    fake_marks      a folder where "first incarnation" is remembered across restarts
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from megatron_seed.data.generation import Generation
from megatron_seed.rollout.engine import EngineSpec


class Recorder:
    """An ordered event log shared by fakes in any process (a named Ray actor)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def add(self, event: str) -> None:
        self.events.append(event)

    def get(self) -> list[str]:
        return list(self.events)


def record(name: str | None, event: str) -> None:
    """Append `event` to the named `Recorder` (no-op without one)."""
    if not name:
        return
    import ray

    ray.get(ray.get_actor(name).add.remote(event))


class FakeEngineActor:
    """`rollout.fleet.EngineActor` over a dict of weights."""

    INSPECTION = ("placement", "get_init_info", "get_weights")  # for tests, not the fleet

    def __init__(self, model_dir: str, spec: EngineSpec, threads: int) -> None:
        self.spec = spec
        self.kwargs = dict(spec.extra)
        self.slot = int(spec.seed or 0)
        self.recorder = self.kwargs.get("fake_recorder")
        self.weights: dict[str, torch.Tensor] = {}
        self.asleep: set[str] = set()
        self.updating = False
        marks = self.kwargs.get("fake_marks")
        self.first = True
        if marks:
            mark = Path(marks) / f"slot-{self.slot}"
            self.first = not mark.exists()
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()

    def _log(self, event: str) -> None:
        record(self.recorder, f"engine{self.slot}:{event}")

    def ready(self) -> int:
        return os.getpid()

    def on_gpu(self) -> bool:
        return False

    def node(self) -> tuple[str, str]:
        import ray

        return "fake", ray.get_runtime_context().get_node_id()

    def placement(self) -> dict[str, Any]:
        """Where Ray put this actor and what it was given."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "placement_group": ctx.get_placement_group_id(),
            "resources": ctx.get_assigned_resources(),
            "tensor_parallel_size": self.spec.tensor_parallel_size,
            "gpu_memory_utilization": self.spec.gpu_memory_utilization,
        }

    def generate(self, prompts: list[list[int]], spec: Any, offsets: list[int]) -> list[Generation]:
        """`fake_reply` of every prompt."""
        return [fake_reply(ids) for ids in prompts]

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """-1 for every token after the first."""
        return [[-1.0] * (len(ids) - 1) for ids in sequences]

    def routes(self, sequences: list[list[int]]) -> list[Any]:
        """The fake serves no model, so none with experts (as vLLM on a dense model)."""
        raise ValueError("the fake engine has no mixture-of-experts layer to route")

    def load_bucket(self, bucket: Any) -> int:
        from megatron_seed.rollout.weight_sync import unflatten_bucket

        if isinstance(bucket, str):
            from safetensors.torch import load_file

            pairs = list(load_file(bucket).items())
        else:
            pairs = unflatten_bucket(bucket)
        self.weights.update({n: t.clone() for n, t in pairs})
        self._log("replay")
        return len(pairs)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.init_info = dict(init_info)
        self._log("init")

    def get_init_info(self) -> dict[str, Any]:
        return getattr(self, "init_info", {})

    def shutdown_weight_transfer_engine(self) -> None:
        self._log("shutdown")

    def start_weight_update(self) -> None:
        if "weights" in self.asleep:
            raise RuntimeError("engine weights are asleep: wake(['weights']) before a sync")
        self.updating = True
        self._log("start")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        import ray

        from megatron_seed.rollout.weight_sync import unflatten_bucket

        if self.first and self.slot in self.kwargs.get("fake_stall", {}):
            time.sleep(self.kwargs["fake_stall"][self.slot])
        if self.first and self.slot in self.kwargs.get("fake_fail", []):
            raise RuntimeError("reload failed: parameters left on the meta device")
        data = update_info["data"]
        bucket = data if not isinstance(data, ray.ObjectRef) else ray.get(data)
        self.weights.update({n: t.clone() for n, t in unflatten_bucket(bucket)})
        self._log("update")

    def finish_weight_update(self) -> None:
        self.updating = False
        self._log("finish")

    def weights_dtype(self) -> str:
        return "float32"

    def get_weights(self) -> dict[str, torch.Tensor]:
        return self.weights

    def weight_checksum(self) -> float:
        return float(sum(t.double().sum() for t in self.weights.values()))

    def reseed(self, seed: int) -> None:
        self._log(f"reseed:{seed}")

    def sleep(self, level: int = 1) -> None:
        self.asleep = {"weights", "kv_cache"}
        self._log(f"sleep:{level}")

    def wake(self, tags: list[str] | None = None) -> None:
        tags = list(tags or ["weights", "kv_cache"])
        self.asleep -= set(tags)
        self._log("wake:" + "+".join(tags))

    def advance(
        self,
        requests: list[tuple[Any, list[int], Any, int]],
        linger_s: float = 0.0,
        until_done: list[Any] | None = None,
    ) -> list[tuple[Any, Any]]:
        """The streaming call (`VLLMEngine.advance`) with instant replies: every request is
        answered in the order it came, one per call (the oldest first; with `until_done`,
        every waiting one up to the last of those keys), with a generation
        derived from its prompt (`fake_reply`). `fake_die_after` ({slot: n}): the first
        incarnation of that slot exits during its n-th call (a crashed engine)."""
        self.calls = getattr(self, "calls", 0) + 1
        self.waiting = [*getattr(self, "waiting", []), *requests]
        die = self.kwargs.get("fake_die_after", {}).get(str(self.slot))
        if self.first and die is not None and self.calls >= int(die):
            os._exit(1)
        wait = set(until_done or ()) & {key for key, *_ in self.waiting}
        answered = []
        while self.waiting and (wait or not answered):
            key, ids, _, _ = self.waiting.pop(0)
            wait.discard(key)
            self._log(f"answer:{key}")
            answered.append((key, fake_reply(ids)))
        return answered

    def usage(self) -> dict[str, float]:
        return {"busy_s": 0.0, "cpu_s": time.process_time()}


def fake_reply(ids: list[int]) -> Generation:
    """A deterministic generation for a prompt: 2 tokens from its length and sum."""
    tokens = [len(ids) % 251, sum(ids) % 251]
    return Generation(tokens, [-1.0, -2.0], f"{tokens[0]} {tokens[1]}", "stop")
