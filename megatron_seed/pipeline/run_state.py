"""The state the Stage-2 phases share on one rank (`Run`), built by the driver
(`pipeline.stage2`) and handed to its phases only: the helpers beside it (`roles`, `routes`,
`replay`, `one_step_off`) take the parts they use."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from megatron_seed.config import SeedConfig
from megatron_seed.data import TrajectoryRecord
from megatron_seed.pipeline.job import Stage2Job
from megatron_seed.pipeline.roles import Follower, Played


@dataclass
class Run:
    """The state the phases share on one rank."""

    job: Stage2Job
    trainer: Any
    tokenizer: Any
    side: Follower  # this rank's role: the `Leader` on rank 0
    hf_config: dict[str, Any]
    need_sync: bool  # the engines do not hold theta yet
    probe: Any = None  # TokenBatch [1, n] the refit check scores after every sync
    replay_pool: list[TrajectoryRecord] = field(default_factory=list)  # analyzer replay
    # one-step-off: the next update's rollout and analysis, running in `ahead_pool`
    ahead: Future[Played] | None = None
    ahead_pool: ThreadPoolExecutor | None = None

    @property
    def cfg(self) -> SeedConfig:
        return self.job.cfg

    @property
    def step(self) -> int:
        return self.trainer.state.step
