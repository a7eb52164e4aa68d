"""A Stage-2 run's inputs (`Stage2Job`) and the checks they must pass before any compute."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_seed.config import SeedConfig


@dataclass
class Stage2Job:
    """Everything one Stage-2 run needs (picklable: it crosses process boundaries).

    The fleet, env workers and environment are `cfg.fleet` and `cfg.env`."""

    model_dir: str  # HF checkpoint + tokenizer (theta_sft, also the KL reference)
    games: list[str]  # training tasks (for ALFWorld, game folders)
    out_dir: str
    cfg: SeedConfig = field(default_factory=SeedConfig)
    ray_address: str | None = None
    eval_games: list[str] = field(default_factory=list)
    eval_every: int = 0
    # the evaluation's episodes: 0 one greedy episode per game; N > 0, N sampled episodes
    # per game at the rollout temperature, the engines' streams restarted at eval_seed each
    # time, so every evaluation of the run draws alike (a learning curve on fixed games)
    eval_episodes: int = 0
    eval_seed: int = 1234
    # game -> skill for every training game: the fixed skills of `cfg.skill.teacher_source`
    # (library, stage1_library, expert_plan; `skills.library`), also the rollout prompts'
    # when `cfg.skill.rollout_skill`
    skill_library: dict[str, str] | None = None
    # Stage-1 annotations (JSONL) whose accepted skills analyzer replay draws from
    # (`cfg.algo.replay_weight` > 0)
    replay_data: str | None = None
    # a running fleet to connect to (`Fleet.address`) instead of starting one; its engines
    # hold other weights, so theta is synced before the first rollout
    fleet_address: Any = None


def check_job(job: Stage2Job) -> None:
    """Fail loud before any compute: a method's fixed skills must cover every training game,
    analyzer replay needs its Stage-1 examples, and the experts' options need experts."""
    skill = job.cfg.skill
    fixed = job.cfg.algo.use_opd and skill.teacher_source != "analyzer"
    if fixed or skill.rollout_skill:
        need = f"skill.teacher_source={skill.teacher_source!r}" if fixed else "skill.rollout_skill"
        if job.skill_library is None:
            raise ValueError(f"{need} needs a skill library (--skill-library)")
        missing = [g for g in job.games if g not in job.skill_library]
        # the Stage-1 library may lack games whose Stage-1 skills all failed (no teacher)
        if missing and (skill.rollout_skill or skill.teacher_source != "stage1_library"):
            raise ValueError(
                f"the skill library has no skill for {len(missing)} games, e.g. {missing[0]}"
            )
    if job.cfg.algo.replay_weight and not job.replay_data:
        raise ValueError("algo.replay_weight > 0 needs Stage-1 annotations (--replay-data)")
    algo = job.cfg.algo
    if algo.routing_replay or algo.moe_aux_loss:
        from megatron_seed.models.qwen import QwenSpec

        if not QwenSpec.from_pretrained(job.model_dir).is_moe:
            what = "algo.routing_replay" if algo.routing_replay else "algo.moe_aux_loss"
            raise ValueError(f"{what} is for mixture-of-experts models: {job.model_dir} has none")


def check_resume(job: Stage2Job) -> None:
    """The checkpoint a rerun of the job resumes from (OUT/checkpoints/latest), if any, is
    whole and holds this job's model at its layout (`train.checkpoint.check_checkpoint`);
    `CommandError` or `ValueError` otherwise. Called once per process by the commands that
    start Stage 2, before any rank loads it."""
    from megatron_seed.models.qwen import QwenSpec
    from megatron_seed.train.checkpoint import check_checkpoint, latest_checkpoint

    resumed = latest_checkpoint(Path(job.out_dir) / "checkpoints")
    if resumed is None:
        return
    par = job.cfg.parallel
    if check_checkpoint(resumed, par.tp, par.pp, par.ep) != QwenSpec.from_pretrained(job.model_dir):
        raise ValueError(f"{resumed} is a checkpoint of another model than {job.model_dir}")
