"""One rollout session: the fleet, the env pool and the agent loop a phase plays with.

Stage 1's collection, Stage 2's rollouts and the evaluation all play episodes the same way:
a vLLM fleet (started here, or borrowed: a running `Fleet`, or one reached by its address)
against Ray env workers of one environment, through `AgentLoop`. A session owns what it
started and closes only that.

    with RolloutSession(cfg, model_dir, env) as session:
        played = session.play(session.tasks(games), group_size, session.sampling())
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from envs.api import EnvSpec
from envs.spec import get_env
from megatron_seed.config import SeedConfig
from megatron_seed.data import check_chat_template
from megatron_seed.rollout.agent_loop import AgentLoop, PlayResult, Task, make_tasks
from megatron_seed.rollout.engine import EngineSpec
from megatron_seed.startup import use_own_ray_token


def engine_spec(cfg: SeedConfig, model_dir: str | Path) -> EngineSpec:
    """The engines of `cfg.fleet` for this model (context capped by the model)."""
    import json

    import torch

    hf = json.loads((Path(model_dir) / "config.json").read_text())
    context = min(cfg.fleet.max_model_len, int(hf.get("max_position_embeddings", 1 << 30)))
    spec = EngineSpec(
        max_model_len=context, tensor_parallel_size=cfg.fleet.engine_tp, dtype=fleet_dtype(cfg)
    )
    if torch.cuda.is_available():  # the KV cache: what the utilisation leaves of each GPU
        return replace(
            spec,
            gpu_memory_utilization=cfg.fleet.gpu_memory_utilization,
            enable_sleep_mode=cfg.fleet.colocate,
        )
    return replace(spec, kv_cache_bytes=cfg.fleet.kv_cache_bytes)


def fleet_dtype(cfg: SeedConfig) -> str:
    """The engines' weight dtype, what every sync sends: the trainer's precision on GPUs
    (bf16 by default), float32 on the CPU (parity)."""
    import torch

    if not torch.cuda.is_available():
        return "float32"
    return "bfloat16" if cfg.parallel.precision == "bf16" else "float32"


def init_ray(cfg: SeedConfig, address: str | None = None) -> None:
    """Join the Ray cluster at `address` (or `RAY_ADDRESS`), else start one on this machine.

    A Ray started here on a machine without CUDA gets the fleet's GPUs as logical GPUs:
    engines that reserve GPUs (a launched CPU job's placement slots) then schedule exactly
    as they would on GPU nodes. On CUDA it gets the fleet's devices only (`fleet_devices`):
    the raylet, started by `ray.init`, inherits `CUDA_VISIBLE_DEVICES` from this process
    for that call."""
    import os

    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,  # not Ray's "Started a local Ray instance." lines
    }
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:  # a new cluster: its token in the environment, not the home folder
        use_own_ray_token()
    gpus = math.ceil(cfg.fleet.engines * cfg.fleet.gpus_per_engine)
    if address is None and gpus > 0:
        import torch

        if not torch.cuda.is_available():
            kwargs["num_gpus"] = gpus
        else:
            trainer = 0 if cfg.fleet.colocate else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            devices = fleet_devices(
                os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), trainer, gpus
            )
            with _environ(CUDA_VISIBLE_DEVICES=",".join(devices)):
                ray.init(address=None, num_gpus=gpus, **kwargs)
            return
    ray.init(address=address, **kwargs)
    if address is not None:  # a launched job: where its Ray nodes run, when it is asked
        from megatron_seed import provenance

        provenance.record_ray_nodes()


def fleet_devices(visible: str | None, device_count: int, first: int, count: int) -> list[str]:
    """The CUDA devices of a fleet Ray started on this node: `count` of them from the
    `first`-th of this process's visible devices (`visible`: its `CUDA_VISIBLE_DEVICES`, or
    None for all `device_count`). Trainer ranks hold the first devices (local rank = device),
    so the fleet starts after them; colocated engines share them (`first=0`)."""
    devices = visible.split(",") if visible else [str(i) for i in range(device_count)]
    if first + count > len(devices):
        raise ValueError(
            f"the fleet needs {count} GPU(s) after the trainer's {first}, but this node has "
            f"{len(devices)} visible"
        )
    return devices[first : first + count]


@contextlib.contextmanager
def _environ(**values: str) -> Any:
    """Set environment variables for the block, then restore them."""
    import os

    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_fleet(cfg: SeedConfig, model_dir: str | Path, replay_dir: str | None = None) -> Any:
    """A `Fleet` of `cfg.fleet`'s engines serving `model_dir` (needs `ray.init()`);
    `replay_dir`: where `fleet.replay="disk"` keeps the last synced weights."""
    from megatron_seed.rollout.fleet import Fleet, FleetSpec

    f = cfg.fleet
    spec = FleetSpec(
        engines=f.engines,
        engine=engine_spec(cfg, model_dir),
        max_restarts=f.max_restarts,
        gpus_per_engine=f.gpus_per_engine,
        transport=f.transport,
        sync_timeout_s=f.sync_timeout_s,
        replay=f.replay,
        replay_dir=replay_dir,
    )
    return Fleet(str(model_dir), spec)


def _placement(fleet: Any, pool: Any) -> str:
    """'engines on n1, n2; env workers on n1, n2' (what runs where, for the log)."""
    import ray

    engines = fleet.placement() if hasattr(fleet, "placement") else []
    workers = getattr(pool, "workers", [])
    envs = ray.get([w.node.remote() for w in workers]) if workers else []
    return f"engines on {', '.join(engines) or '?'}; env workers on {', '.join(envs) or '?'}"


class RolloutSession:
    """A fleet (own or borrowed) + an env pool + the agent loop, for one phase.

    fleet: a running `Fleet` to use (left running); fleet_address: a `Fleet.address` to
    connect to (its engines hold other weights: load or sync before playing); neither:
    start `cfg.fleet`'s engines on `model_dir`. pool: a running `EnvPool` to use.
    replay_dir: where `fleet.replay="disk"` keeps the last synced weights.
    """

    def __init__(
        self,
        cfg: SeedConfig,
        model_dir: str | Path,
        env: EnvSpec | None = None,
        *,
        tokenizer: Any = None,
        fleet: Any = None,
        fleet_address: Any = None,
        pool: Any = None,
        ray_address: str | None = None,
        replay_dir: str | None = None,
    ) -> None:
        from envs.workers import EnvPool

        self.cfg = cfg
        self.env = env or get_env(cfg.env.name)
        init_ray(cfg, ray_address)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        check_chat_template(tokenizer)  # before any engine starts
        self.tokenizer = tokenizer
        self._owned: list[Any] = []
        if fleet is None and fleet_address is not None:
            from megatron_seed.rollout.fleet import Fleet

            # the owner's transport, deadlines and replay copy; close() leaves it running
            fleet = Fleet.connect(fleet_address)
            self._owned.append(fleet)
        elif fleet is None:
            fleet = start_fleet(cfg, model_dir, replay_dir)
            self._owned.append(fleet)
        if pool is None:
            e = cfg.env
            pool = EnvPool(
                self.env.name,
                num_workers=e.workers,
                max_steps=cfg.rollout.max_steps,
                step_timeout_s=e.step_timeout_s,
                reset_timeout_s=e.reset_timeout_s,
            )
            self._owned.append(pool)
        self.fleet, self.pool = fleet, pool
        self.placement = _placement(fleet, pool)
        self.context = engine_spec(cfg, model_dir).max_model_len
        self.loop = AgentLoop(fleet, pool, tokenizer, cfg.rollout, self.env)

    def tasks(self, games: list[str], skills: Mapping[str, str] | None = None) -> list[Task]:
        """Task objects of this environment for `games`; with `skills` ({game: skill}),
        each plays with its game's skill inserted by H (skills in the rollout prompts)."""
        return make_tasks(self.env, games, skills)

    def sampling(self, greedy: bool = False, seed: int | None = None) -> Any:
        """Sampling parameters for actions (the rollout config's, or greedy)."""
        from megatron_seed.rollout.engine import SamplingSpec

        r = self.cfg.rollout
        return SamplingSpec(
            temperature=0.0 if greedy else r.temperature,
            top_p=1.0 if greedy else r.top_p,
            max_tokens=r.max_response_tokens,
            seed=seed,
        )

    def play(
        self,
        tasks: list[Task],
        group_size: int,
        spec: Any,
        update: int = 0,
        on_done: Callable[[int], None] | None = None,
    ) -> PlayResult:
        """`group_size` episodes of every task (``on_done``: `AgentLoop.run`'s progress)."""
        return self.loop.run(tasks, group_size, spec, update=update, on_done=on_done)

    def play_overlapped(
        self,
        tasks: list[Task],
        group_size: int,
        spec: Any,
        update: int = 0,
        analysis: Any = None,
    ) -> PlayResult:
        """`group_size` episodes of every task, advancing independently, each selected
        episode analysed as it ends (`rollout.overlap.play_overlapped`)."""
        from megatron_seed.rollout.overlap import FleetStream, play_overlapped

        stream = FleetStream(self.fleet)
        return play_overlapped(self.loop, stream, tasks, group_size, spec, update, analysis)

    def usage(self) -> dict[str, Any]:
        """So far: each engine's and env worker's busy and CPU seconds (`Fleet.usage`,
        `EnvPool.usage`), and this machine's busy and idle CPU seconds over all its cores
        (psutil, which vLLM installs)."""
        import psutil

        times = psutil.cpu_times()
        idle = times.idle + getattr(times, "iowait", 0.0)
        # Linux counts guest time inside user and nice already
        guest = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        machine = {"busy_s": sum(times) - idle - guest, "idle_s": idle}
        return {"engine": self.fleet.usage(), "env": self.pool.usage(), "machine": machine}

    def analyzer_prompt_limit(self) -> int:
        """The longest analyzer prompt the engines' context leaves room for."""
        return self.context - self.cfg.skill.max_tokens

    def close(self) -> None:
        """Stop what this session started (a borrowed fleet or pool keeps running)."""
        for obj in reversed(self._owned):
            with contextlib.suppress(Exception):
                obj.close()
        self._owned = []

    def __enter__(self) -> RolloutSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
