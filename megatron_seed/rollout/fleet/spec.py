"""What a `Fleet` is built from: `FleetSpec` (`rollout.session.fleet_spec` makes one of a
`SeedConfig`). Apart from the client so that the placement code reads it without importing
the client that places engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from megatron_seed.rollout.engine import EngineSpec
from megatron_seed.rollout.fleet.replay import _check_replay


@dataclass(frozen=True)
class FleetSpec:
    """What a `Fleet` is built from (`rollout.session.fleet_spec` makes it of a `SeedConfig`).

    engine: every engine's options (its seed, when None, is its slot; its weight transfer
    is `transport`). transport: vLLM's weight-transfer backend, "objstore" (any device),
    "ipc" (engines on the trainer's GPUs) or "nccl" (other GPUs). replay: where the last
    synced weights are kept for restarts ("disk": under `replay_dir`). cpus_per_engine:
    Ray's CPU request per engine (0: engines and a trainer fit on a 2-core machine).
    """

    engines: int = 2
    engine: EngineSpec = field(default_factory=EngineSpec)
    max_restarts: int = 2
    request_timeout_s: float = 600.0
    start_timeout_s: float = 600.0
    threads_per_engine: int = 1
    cpus_per_engine: float = 0.0
    gpus_per_engine: float = 0.0
    transport: Literal["objstore", "ipc", "nccl"] = "objstore"
    sync_timeout_s: float = 60.0
    max_inflight: int = 2  # update_weights calls outstanding per engine
    replay: Literal["memory", "disk", "off"] = "memory"
    replay_dir: str | None = None
    name: str | None = None  # of the state actor (`{name}-state`); None: a fresh one

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if (
            self.max_restarts < 0
            or self.request_timeout_s <= 0
            or self.max_inflight < 1
            or self.sync_timeout_s <= 0
        ):
            raise ValueError(
                "max_restarts >= 0, request_timeout_s > 0, sync_timeout_s > 0 and "
                "max_inflight >= 1 required"
            )
        _check_replay(self.replay, self.replay_dir)
