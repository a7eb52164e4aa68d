"""The default job: SEED end to end on one CPU machine (`seed run [--size S] [--env NAME]`).

The tiny world's games and base policy are made here; the phases from `library` on are one
`megatron_seed.compare.job` (each resumable: a finished phase is recorded in
OUT/progress.json and skipped on a rerun; Stage 2 resumes from its own checkpoints):

  games    the environment's tasks generated offline: train / seen / unseen (OUT/games, or a
           shared folder; `games/done` marks a finished set)
  base     the tiny base policy (tokenizer + Qwen2, behaviour cloning; cached): the job's
           training games are among the cloned ones (see `base_policy`); with `--model`,
           the user's pretrained model instead (nothing built; the job folder records it)
  collect  Stage 1: K0 rollouts per task of the base policy, no skills
  annotate Stage 1: the environment's oracle analyzer -> skills; invalid ones dropped
  sft      Stage 1: NLL on the skill answers -> theta_sft (actor and analyzer)
  stage2   Stage 2: SEED (or GRPO) updates with the fleet and the Megatron trainer
  evaluate episodes without skills: sampled (the rollout temperature, fixed seed) on the
           training games; greedy on seen and unseen games (EVIDENCE: sampled too)
  report   OUT/report.md (Table-1 layout), OUT/curves.png, OUT/eval.json

`--algo` picks the method (`megatron_seed.methods`): SEED, or any row of the paper's Table 1
(vanilla, skill-prompt, grpo, skill-grpo, opsd, opsd-paper, grpo-opsd, skill-sd, rlsd, sdar)
or of its Table 2 (no-sft, no-opd, static-skills), or seed-replay (SEED with analyzer
replay). Methods that read a family skill library get one written from Stage-1 annotations of
the base policy (`library` phase: K0 rollouts, the oracle analyzer, per family a success's
and a failure's skill; shared by the methods of a seed in `seed compare`), or the user's
folder (`--skill-library`). Methods that train nothing are the base evaluated as it is (with
the library's skill for Skill-Prompt*).

`job_config` is the job's recipe (`megatron_seed.recipes`: `default`, `default-quick`; it
states only what differs from the paper's defaults, and why) for one method, seed and
environment. The environment (`--env`: alfworld, search, sokoban, webshop) brings its
rollout budgets (under the recipe) and, from `testbed.profiles`, its sizes and the tiny
policy's limits. ALFWorld's sizes: FULL (all six families, 16 training games, a base cloned
on those 16 games until it wins some of them), QUICK (Pick only, 6 training games, a base cloned on those 6 games alone: too
little compute for it to play unseen games) and EVIDENCE (QUICK with 24 training games, all
cloned, and 24 seen and 24 unseen games sampled 4 times each).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from envs.spec import get_env
from megatron_seed.compare.job import (
    Phases,
    apply_method,
    method_of,
    method_phases,
    run_method_job,
)
from megatron_seed.config import SeedConfig
from megatron_seed.testbed import ENV
from megatron_seed.testbed.profiles import ALFWORLD, JobSize, profile

FULL = ALFWORLD.full  # ALFWorld's sizes (`testbed.profiles` has every environment's)
QUICK = ALFWORLD.quick


def job_config(
    size: JobSize,
    algo: str = "seed",
    seed: int = 0,
    env: str = ENV,
    updates: int | None = None,
    settings: dict[str, Any] | None = None,
    recipe: str | None = None,
) -> SeedConfig:
    """The default job's config: its recipe (`megatron_seed.recipes`; ``recipe``, else the
    size's) over the environment's rollout budgets, for this method and seed (the
    environment's `testbed.profiles` rollout settings on top); ``updates``: Stage-2 updates
    instead of the recipe's; ``settings``: nested config changes applied last (`seed run
    --set`)."""
    from megatron_seed import recipes

    cfg = recipes.on_env(recipes.get(recipe or size.recipe).config, get_env(env).rollout)
    if updates is not None:
        cfg = cfg.with_changes({"updates": updates})
    cfg = apply_method(cfg, algo)
    rollout = dataclasses.replace(cfg.rollout, **profile(env).rollout)
    env_cfg = dataclasses.replace(cfg.env, name=env)
    cfg = dataclasses.replace(cfg, rollout=rollout, env=env_cfg, seed=seed)
    return cfg.with_changes(settings) if settings else cfg


def job_size(env: str, size: str) -> JobSize:
    """``env``'s job size called ``size``; a one-line error for an unknown environment or a
    size it lacks (only ALFWorld has ``evidence``)."""
    return profile(env).size(size)


def _games(root: Path, size: JobSize, seed: int, env_name: str) -> dict[str, list[str]]:
    """The job's games (generated once; ``root/done`` marks a finished set)."""
    from megatron_seed.progress import LiveBar

    env = get_env(env_name)
    if not (root / "done").is_file():
        if root.exists():
            shutil.rmtree(root)  # a generation that died
        # the task options the base policy is built for (ALFWorld: small rooms)
        options = profile(env_name).generate_options(size.families)
        for split, n in (("train", size.n_train), ("seen", size.n_eval), ("unseen", size.n_eval)):
            with LiveBar(n, f"games: {split}") as bar:
                env.generate_tasks(root, split, n, seed, **options)
                bar.update(n)
        (root / "done").write_text("")
    return {s: [str(g) for g in env.list_tasks(root, s)] for s in ("train", "seen", "unseen")}


def run_default_job(
    out_dir: str | Path,
    size: str = "full",
    seed: int = 0,
    algo: str = "seed",
    base_dir: str | Path | None = None,
    games_dir: str | Path | None = None,
    env: str = ENV,
    library_dir: str | Path | None = None,
    user_library: str | Path | None = None,
    updates: int | None = None,
    eval_episodes: int | None = None,
    settings: dict[str, Any] | None = None,
    curve_every: int = 0,
    model: str | Path | None = None,
    recipe: str | None = None,
) -> dict[str, Any]:
    """Run (or resume) the whole job on ``env`` at size ``size`` (`testbed.profiles`: full,
    quick, evidence); returns the evaluations and facts of the report. ``updates``: Stage-2
    updates instead of the recipe's; ``eval_episodes``: sampled evaluation episodes per
    training game instead of the size's; ``settings``: config changes over the recipe and the
    method (`seed run --set`); ``curve_every``: a fixed-game learning curve point every that
    many Stage-2 updates (`seed run --curve-every`).

    ``base_dir`` / ``games_dir`` / ``library_dir`` (default under ``out_dir``): where the base
    policy (with its cached evaluation), the games and the family skill library built from
    Stage-1 annotations live, so that several jobs (``seed compare``) can share them.
    ``user_library``: a family library folder to use instead of building one.
    ``model``: a pretrained HF model folder to start from instead of the tiny base policy
    (checked by the caller, `models.checks.validate_base_model`), with ``recipe``'s Stage 1 and
    Stage 2; its evaluation is cached under ``base_dir`` as the base policy's is.
    """
    from megatron_seed.testbed.base_policy import build_base_policy, read_manifest

    method_of(algo)  # an unknown name fails before anything runs
    sizing = job_size(env, size)  # so does a size the environment lacks
    if eval_episodes is not None:
        sizing = dataclasses.replace(sizing, train_eval_episodes=eval_episodes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = job_config(sizing, algo, seed, env, updates, settings, recipe)
    own = method_phases(method_of(algo), user_library is not None)
    phases = Phases(["games", "base policy", *own])
    phases.start("games")
    games_root = Path(games_dir or out / "games")
    games = _games(games_root, sizing, seed, env)
    print(
        f"[games] train {len(games['train'])}, seen {len(games['seen'])}, "
        f"unseen {len(games['unseen'])}"
    )
    base_root = Path(base_dir or out / "base")
    facts: dict[str, Any] = {"environment": env, "size": sizing.name, "algorithm": algo}
    facts["seed"] = seed
    if settings:
        facts["settings"] = settings
    phases.start("base policy")
    if model is not None:
        base = Path(model)
        base_root.mkdir(parents=True, exist_ok=True)  # the base's cached evaluation
        facts |= {"base_model": str(base), "recipe": recipe}
    else:
        # the Stage-2 training games are among the base policy's behaviour-cloning games
        base = build_base_policy(
            base_root, size=size, seed=seed, games_dir=games_root, measure=False, env=env
        )
        facts["base_policy"] = _base_facts(read_manifest(base_root))
    return run_method_job(
        out, base, games, cfg, algo, stage1_tasks=sizing.stage1_tasks,
        train_eval_episodes=sizing.train_eval_episodes,
        heldout_episodes=sizing.heldout_episodes, facts=facts, base_root=base_root,
        library_dir=library_dir, user_library=user_library, title=profile(env).title,
        phases=phases, curve_every=curve_every, own_base=model is not None,
    )  # fmt: skip


def _base_facts(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the report says about the base policy's build."""
    train = manifest.get("train", {})
    return {
        "games": len(manifest.get("games", {}).get("train", [])),
        "demonstrations": manifest.get("demos"),
        "analysis_examples": train.get("analysis_examples"),
        "bc_nll_last": train.get("nll_last10"),
        "build_seconds": manifest.get("timings_s", {}).get("build"),
    }
