"""The rollout fleet: E `VLLMEngine`s, one per Ray actor, with weight sync and restarts.

`client` (the `Fleet`), `spec` (its `FleetSpec`), `actor` (the `EngineActor` surface and the vLLM
actor), `sync` (vLLM's weight-sync client with deadlines), `replay` (the last synced
weights a restarted engine loads), `placement` (placement groups, engine starts). Needs
`ray.init()` first; another process reaches a fleet with `Fleet.connect(fleet.address)`.
"""

from megatron_seed.rollout.fleet.actor import EngineActor, VLLMEngineActor, engine_env
from megatron_seed.rollout.fleet.client import (
    NAMESPACE,
    Fleet,
    FleetAddress,
    RunningFleet,
    SyncStats,
)
from megatron_seed.rollout.fleet.errors import FleetError, WeightSyncError
from megatron_seed.rollout.fleet.spec import FleetSpec
from megatron_seed.rollout.fleet.sync import packed_bytes

__all__ = [
    "NAMESPACE",
    "EngineActor",
    "Fleet",
    "FleetAddress",
    "FleetError",
    "FleetSpec",
    "RunningFleet",
    "SyncStats",
    "VLLMEngineActor",
    "WeightSyncError",
    "engine_env",
    "packed_bytes",
]
