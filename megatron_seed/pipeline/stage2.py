"""Stage 2 of SEED: self-evolving on-policy distillation (the paper's Algorithm 1).

Every trainer rank runs `run_stage2`; rank 0 also owns the rollout side (the vLLM fleet and
the env workers, both Ray actors) and broadcasts each update's trajectories to the others.
One update, as named phases (each timed as `time/<phase>`):

    sync      theta_old := theta; stream the trainer's weights into every engine
    rollout   B tasks x N episodes with theta_old (the fleet) against the env workers
    analyze   the same fleet turns each finished episode into a hindsight skill s
    train     old/ref/teacher log-probs, SEED loss, Adam step (`SeedTrainer.train_step`)
    evaluate  (every `eval_every` updates) greedy episodes without skills

Metrics go to OUT/metrics.jsonl (+ TensorBoard), trajectories to OUT/trajectories/, and
checkpoints to OUT/checkpoints/ every `save_every` updates; a killed run resumes from the
latest complete checkpoint (weights, optimizer, step, data position, RNG).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_seed.config import SeedConfig
from megatron_seed.data import TrajectoryRecord, write_jsonl
from megatron_seed.pipeline.metrics import MetricsLog, PhaseTimer, rollout_metrics


@dataclass
class Stage2Job:
    """Everything one Stage-2 run needs (picklable: it crosses process boundaries)."""

    model_dir: str  # HF checkpoint + tokenizer (theta_sft, also the KL reference)
    games: list[str]  # training game folders
    out_dir: str
    cfg: SeedConfig = field(default_factory=SeedConfig)
    num_engines: int = 2
    env_workers: int = 2
    ray_address: str | None = None
    eval_games: list[str] = field(default_factory=list)
    eval_every: int = 0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    sync_bucket_bytes: int = 64 << 20
    # game -> skill: a static offline library used instead of on-policy skills (ablation)
    skill_library: dict[str, str] | None = None
    # a running fleet to connect to (`Fleet.address`) instead of starting one; its engines
    # hold other weights, so theta is synced before the first rollout
    fleet_address: Any = None


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class TaskSampler:
    """Tasks per update from a seeded shuffle of the games; `position` is resumable."""

    def __init__(self, games: list[str], seed: int) -> None:
        if not games:
            raise ValueError("no training games")
        self.order = list(games)
        random.Random(seed).shuffle(self.order)

    def take(self, position: int, n: int) -> list[str]:
        """The n games starting at `position` (wrapping around)."""
        return [self.order[(position + i) % len(self.order)] for i in range(n)]


class RolloutSide:
    """Rank 0's handles: fleet, env pool, agent loop, analyzer, metrics log."""

    def __init__(self, job: Stage2Job, tokenizer: Any, fleet: Any = None, pool: Any = None) -> None:
        import ray

        from megatron_seed.rollout.agent_loop import AgentLoop

        if (fleet is None or pool is None) and not ray.is_initialized():
            ray.init(address=job.ray_address, include_dashboard=False, log_to_driver=False)
        if fleet is None:
            from megatron_seed.rollout.fleet import Fleet

            if job.fleet_address is not None:
                fleet = Fleet.connect(job.fleet_address)  # close() leaves its engines running
            else:
                fleet = Fleet(job.model_dir, job.num_engines, engine_kwargs=job.engine_kwargs)
        if pool is None:
            from envs.workers import EnvPool

            pool = EnvPool(num_workers=job.env_workers, max_steps=job.cfg.rollout.max_steps)
        self.job, self.tokenizer, self.fleet, self.pool = job, tokenizer, fleet, pool
        self.loop = AgentLoop(fleet, pool, tokenizer, job.cfg.rollout)
        self.log = MetricsLog(job.out_dir)
        self.sampler = TaskSampler(job.games, job.cfg.seed)

    def tasks(self, position: int, n: int) -> list:
        """Task objects for n games from `position`."""
        from envs.alfworld_env import game_family
        from megatron_seed.rollout.agent_loop import Task

        games = self.sampler.take(position, n)
        return [Task(Path(g).name, str(g), game_family(g)) for g in games]

    def sampling(self, greedy: bool = False) -> Any:
        """Sampling parameters for actions."""
        from megatron_seed.rollout.engine import SamplingSpec

        r = self.job.cfg.rollout
        return SamplingSpec(
            temperature=0.0 if greedy else r.temperature,
            top_p=1.0 if greedy else r.top_p,
            max_tokens=r.max_response_tokens,
        )

    def close(self) -> None:
        """Stop the actors."""
        for obj in (self.pool, self.fleet):
            with contextlib.suppress(Exception):
                obj.close()


def _analyze(side: RolloutSide, records: list[TrajectoryRecord]) -> dict[str, float]:
    """Hindsight skills from the same fleet weights (fills record.skill / skill_valid)."""
    from megatron_seed.rollout.analyzer import analyze_records

    cfg = side.job.cfg.skill
    context = side.job.engine_kwargs.get("max_model_len")
    limit = None if context is None else context - cfg.max_tokens
    return analyze_records(side.fleet, side.tokenizer, records, cfg, max_prompt_tokens=limit)


def library_skills(records: list[TrajectoryRecord], library: dict[str, str]) -> dict[str, float]:
    """The ``static-skills`` ablation's analyze phase: each trajectory's skill is its game's
    entry in a fixed library (fills record.skill / skill_valid; no analyzer call)."""
    for record in records:
        record.skill = library.get(record.game)
        record.skill_valid = record.skill is not None
    valid = sum(r.skill_valid for r in records)
    return {"skill/n": float(len(records)), "skill/valid_rate": valid / max(1, len(records))}


def _sync(trainer: Any, side: RolloutSide | None, job: Stage2Job) -> dict[str, float]:
    """Stream theta into every engine (a collective over trainer ranks; rank 0 sends)."""
    from megatron_seed.models.convert import export_hf_weights

    stream = export_hf_weights(trainer.model.module, trainer.spec, dtype=torch.float32)
    if side is None:
        for _ in stream:
            pass
        return {}
    stats = side.fleet.update_weights(
        ((k, v.cpu()) for k, v in stream), bucket_bytes=job.sync_bucket_bytes
    )
    return {"sync/bytes": float(stats.bytes), "sync/seconds": stats.seconds}


def _evaluate(side: RolloutSide, games: list[str]) -> dict[str, float]:
    """Greedy episodes on `games`, no skill: success overall and per family."""
    from envs.alfworld_env import game_family
    from megatron_seed.rollout.agent_loop import Task

    tasks = [Task(Path(g).name, str(g), game_family(g)) for g in games]
    records, _ = side.loop.run(tasks, 1, side.sampling(greedy=True), update=-1)
    out = rollout_metrics(records, "eval")
    for fam in sorted({r.family for r in records}):
        rs = [r for r in records if r.family == fam]
        out[f"eval/success_{fam}"] = sum(r.won for r in rs) / len(rs)
    return out


def run_stage2(job: Stage2Job, fleet: Any = None, pool: Any = None) -> list[dict[str, Any]]:
    """The Stage-2 loop on this rank; returns the metrics rows written (rank 0) or []."""
    from transformers import AutoTokenizer

    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.batch import build_policy_batch
    from megatron_seed.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from megatron_seed.train.trainer import SeedTrainer

    cfg = job.cfg
    init_parallel(cfg.parallel.tp, cfg.parallel.pp, cfg.seed)
    out = Path(job.out_dir)
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    trainer = SeedTrainer(cfg, job.model_dir)
    ckpt_root = out / "checkpoints"
    resumed = latest_checkpoint(ckpt_root)
    if resumed is not None:
        load_checkpoint(trainer, resumed)
    side = RolloutSide(job, tokenizer, fleet, pool) if _rank() == 0 else None
    if side is not None:
        side.log.truncate_after(trainer.state.step)
        (out / "trajectories").mkdir(parents=True, exist_ok=True)
        cfg.save(out / "config.json")
    hf_config = json.loads((Path(job.model_dir) / "config.json").read_text())
    rows = []
    # fresh engines start from model_dir; a resumed run or a shared fleet needs theta first
    need_sync = resumed is not None or job.fleet_address is not None
    try:
        while trainer.state.step < cfg.updates:
            timer = PhaseTimer()
            metrics: dict[str, Any] = {}
            if need_sync:
                with timer.time("sync"):
                    metrics.update(_sync(trainer, side, job))
            records = None
            if side is not None:
                tasks = side.tasks(trainer.state.data_position, cfg.rollout.tasks_per_update)
                with timer.time("rollout"):
                    records, rstats = side.loop.run(
                        tasks, cfg.rollout.group_size, side.sampling(), update=trainer.state.step
                    )
                metrics.update(rollout_metrics(records))
                metrics.update(
                    {f"rollout/{k}": float(v) for k, v in dataclasses.asdict(rstats).items()}
                )
                if cfg.algo.use_opd:
                    with timer.time("analyze"):
                        if job.skill_library is not None:
                            metrics.update(library_skills(records, job.skill_library))
                        else:
                            metrics.update(_analyze(side, records))
                write_jsonl(
                    records, out / "trajectories" / f"update_{trainer.state.step:05d}.jsonl"
                )
            records = _broadcast(records)
            with timer.time("train"):
                pb = build_policy_batch(records, tokenizer, cfg.skill.insert_at, cfg.algo.use_opd)
                metrics.update({f"train/{k}": v for k, v in trainer.train_step(pb).items()})
            trainer.state.data_position += cfg.rollout.tasks_per_update
            with timer.time("sync"):
                metrics.update(_sync(trainer, side, job))
            need_sync = False
            if side is not None and job.eval_every and trainer.state.step % job.eval_every == 0:
                with timer.time("evaluate"):
                    metrics.update(_evaluate(side, job.eval_games))
            if cfg.save_every and trainer.state.step % cfg.save_every == 0:
                with timer.time("checkpoint"):
                    save_checkpoint(trainer, ckpt_root, hf_config, job.model_dir)
            metrics.update(timer.metrics())
            if side is not None:
                side.log.write(trainer.state.step, metrics)
                rows.append({"step": trainer.state.step, **metrics})
                print(_summary(trainer.state.step, cfg.updates, metrics), flush=True)
        _export_final(trainer, out / "final_hf", hf_config, job.model_dir)
    finally:
        if side is not None and fleet is None:
            side.close()
    return rows


def _export_final(trainer: Any, path: Path, hf_config: dict, tokenizer_dir: str) -> None:
    """The trained policy as a HF folder (for evaluation and serving); a collective."""
    from megatron_seed.models.convert import export_hf_weights, save_hf_checkpoint

    stream = export_hf_weights(trainer.model.module, trainer.spec)
    if _rank() == 0:
        save_hf_checkpoint(stream, path, hf_config, tokenizer_from=tokenizer_dir)
    else:
        for _ in stream:
            pass


def _summary(step: int, total: int, m: dict[str, Any]) -> str:
    keys = [
        ("success", "rollout/success"),
        ("len", "rollout/episode_length"),
        ("loss", "train/loss/total"),
        ("opd", "train/loss/opd"),
        ("gate", "train/opd/gate_mean"),
        ("skill_valid", "skill/valid_rate"),
        ("s", "time/update"),
    ]
    parts = [f"{name}={m[k]:.4g}" for name, k in keys if k in m]
    return f"[update {step}/{total}] " + " ".join(parts)
