"""`seed compare`: methods side by side, same budget, over seeds.

    seed compare [--methods seed grpo ...] [--seeds 0 1 2] [--env NAME] [--out DIR]
                 [--size full|quick|evidence | --quick]            # the tiny world (default)
                 --model DIR --games DIR [--recipe NAME] [--updates N]   # a model of yours
                 [--stage1-tasks N] [--eval-episodes N] [--skill-library DIR]
    seed compare --merge DIR ... [--out DIR]

Each (method, seed) is one `compare.job` in its own folder; the base model (and its
evaluation), the tasks and the family skill library of a seed are shared by the methods, so
they start from the same place and see the same tasks, skills and evaluation draws. The
methods are `megatron_seed.methods`' (every row of the paper's Table 1, its Table-2
ablations, seed-replay); the baselines start from the base model, SEED from its own Stage-1
SFT. A method evaluated with skills adds its starred row.

Without `--model` the comparison runs in the test bed's tiny world (`seed run`'s job: its
generated games and tiny base policy per seed, its recipes and sizes: `--size full` (the
default), `quick` (`--quick`: the smaller one) or `evidence` (ALFWorld: quick's world with 24
training games and sampled held-out games, docs/results.md "Power")). With `--model` it runs
from that HF folder on the tasks of `--games` (train, seen and unseen splits) with
`--recipe`'s config (default: the config's defaults).

The side-by-side table goes to OUT/compare.md and OUT/compare.json (`compare.report`);
re-running resumes. `--merge DIR ...` runs nothing and writes one table from earlier
comparisons' compare.json (seeds run apart, e.g. one per machine).
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from envs.spec import DEFAULT_ENV, ENV_HELP
from megatron_seed import recipes
from megatron_seed.compare.job import apply_method, run_method_job
from megatron_seed.compare.report import (
    fixed_curve,
    merge_summaries,
    phase_seconds,
    skill_rows,
    success_curve,
    write_summary,
)
from megatron_seed.config import ConfigError, SeedConfig, assignments
from megatron_seed.errors import CommandError, output_dir, positive
from megatron_seed.methods import METHODS
from megatron_seed.models.checks import validate_base_model
from megatron_seed.pipeline.commands_eval import env_spec, env_tasks

# the tiny world's job (games, base policy, sizes), reached only when no --model is named
TINY_WORLD_JOB = "megatron_seed.testbed.default_job:run_default_job"
# the tiny world's sizes (`testbed.profiles.SIZES`; a unit test keeps the two the same)
TINY_WORLD_SIZES = ("full", "quick", "evidence")
SPLITS = ("train", "seen", "unseen")


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of one job that `seed compare` shares with `seed run`."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--size",
        choices=TINY_WORLD_SIZES,
        default=None,
        help="the tiny world's size: full (the default), quick (about 5 minutes) or evidence "
        "(ALFWorld: quick with 24 training games, held-out games sampled 4 times each)",
    )
    size.add_argument(
        "--quick", dest="size", action="store_const", const="quick", help="--size quick"
    )
    parser.add_argument(
        "--updates",
        type=positive,
        default=None,
        help="Stage-2 updates (default: the recipe's; the tiny world's: 12 quick and "
        "evidence, 48 full)",
    )
    parser.add_argument(
        "--eval-episodes",
        type=positive,
        default=None,
        help="sampled evaluation episodes per training task (default: the environment's at "
        "this size, ALFWorld's 8; seed compare --model: 4)",
    )
    parser.add_argument(
        "--skill-library", default=None, help="a family library folder (default: built)"
    )
    parser.add_argument(
        "--curve-every",
        type=int,
        default=0,
        metavar="N",
        help="every N Stage-2 updates, evaluate the policy on the training games with the "
        "final evaluation's draws: a learning curve on fixed games (0: none)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="config fields over the recipe and the method, e.g. optim.lr=1e-4 "
        "rollout.tasks_per_update=4 (any SeedConfig field; recorded in the report)",
    )


def check_skill_library(path: str | None) -> None:
    """``--skill-library``, if given, loaded before any work (`skills.library.library_flag`)."""
    if path is not None:
        from megatron_seed.skills.library import library_flag

        library_flag(path)


def job_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``--set``'s nested changes, checked against the config's fields before anything
    runs (a one-line `CommandError` for an unknown field or a bad value)."""
    try:
        changes = assignments(args.settings)
        SeedConfig().with_changes(changes)
    except ConfigError as err:
        raise CommandError(str(err)) from None
    owned = {"seed": "--seed(s)", "updates": "--updates"}
    if clash := [k for k in owned if k in changes] + (
        ["env.name"] if "name" in changes.get("env", {}) else []
    ):
        flag = owned.get(clash[0], "--env")
        raise CommandError(f"--set {clash[0]}: give it with {flag}, which names every job by it")
    if args.curve_every < 0:
        raise CommandError(f"--curve-every must be at least 0, got {args.curve_every}")
    return changes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    add_job_arguments(parser)
    parser.add_argument("--env", default=DEFAULT_ENV, help=ENV_HELP)
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="one job per method and seed"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["seed", "grpo"],
        choices=list(METHODS),
        metavar="METHOD",
        help="any of: " + ", ".join(METHODS) + " (megatron_seed/methods.py; default: seed grpo)",
    )
    parser.add_argument(
        "--model", default=None, help="base HF checkpoint + tokenizer (default: the tiny world)"
    )
    parser.add_argument("--games", default=None, help="with --model: task folder (3 splits)")
    parser.add_argument("--recipe", default=None, help="with --model: a recipes.py recipe")
    parser.add_argument(
        "--stage1-tasks", type=positive, default=None, help="with --model (default: all train)"
    )
    parser.add_argument("--out", default=None, help="default runs/compare[-ENV]")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="run nothing: merge the compare.json of earlier comparisons (each its own "
        "seeds, e.g. one seed per machine) into one table in --out",
    )


def run(args: argparse.Namespace) -> int:
    """Run every (method, seed) job (or `--merge` earlier ones), then write the side-by-side
    table."""
    out = output_dir(
        args.out or ("runs/compare" + ("" if args.env == DEFAULT_ENV else f"-{args.env}"))
    )
    size = _size_name(args)
    if args.merge:
        if args.settings:
            raise CommandError(
                "--merge runs nothing: --set does not apply (each input keeps its own)"
            )
        merged = merge_summaries([Path(p) for p in args.merge])
        seeds = merged["seeds"] or args.merge
        summary = (merged["results"], merged["seconds"], merged["skills"])
        curves, settings, fixed = merged["curves"], merged["settings"], merged["fixed_curves"]
        size = merged["size"] or size  # what the inputs ran (older ones do not say)
        return write_summary(
            out, *summary, args.env, size, seeds, curves, settings=settings, fixed=fixed
        )
    settings = job_settings(args)
    check_skill_library(args.skill_library)
    job = _named_model_job(args, settings) if args.model else _tiny_world_job(args, settings)
    results: dict[str, list[dict]] = {}
    seconds: dict[str, list[dict[str, float]]] = {}
    skills: dict[str, list[list[dict[str, float]]]] = {}
    curves: dict[str, list[list[float]]] = {}  # per method, per seed: success per update
    fixed: dict[str, list[list[list[float]]]] = {}  # per method, per seed: [update, success]
    baseline: list[dict] = []
    stage1: dict[int, dict] = {}
    for seed in args.seeds:
        for method in args.methods:
            evals = job(out, method, seed)["evaluations"]
            for label, result in evals.items():
                if label == "Stage-1 SFT":  # one per seed: SEED's start (same for each method)
                    stage1.setdefault(seed, result)
                elif label != "Base (Vanilla)":
                    results.setdefault(label, []).append(result)
            metrics = out / f"{method}-seed{seed}" / "stage2" / "metrics.jsonl"
            if metrics.is_file():
                seconds.setdefault(METHODS[method].label, []).append(phase_seconds(metrics))
                skills.setdefault(METHODS[method].label, []).append(skill_rows(metrics))
                curves.setdefault(METHODS[method].label, []).append(success_curve(metrics))
                if args.curve_every:
                    fixed.setdefault(METHODS[method].label, []).append(fixed_curve(metrics))
            if method == args.methods[0]:
                baseline.append(evals["Base (Vanilla)"])
    first = {"Base (Vanilla)": baseline}
    if len(stage1) == len(args.seeds):
        first["Stage-1 SFT"] = [stage1[s] for s in args.seeds]
    results = {**first, **results}
    seeds = list(args.seeds)
    return write_summary(
        out, results, seconds, skills, args.env, size, seeds, curves, settings=args.settings,
        fixed=fixed,
    )  # fmt: skip


def _size_name(args: argparse.Namespace) -> str:
    """The size the report names: the tiny world's, or the recipe's."""
    if args.model:
        return f"recipe {args.recipe or 'defaults'}"
    return tiny_world_size(args)


def tiny_world_size(args: argparse.Namespace) -> str:
    """The tiny world's size of ``--size`` / ``--quick`` (full without either)."""
    return args.size or "full"


def _tiny_world_job(args: argparse.Namespace, settings: dict[str, Any]) -> Any:
    """(out, method, seed) -> one job of the tiny world (`seed run`'s), sharing the seed's
    base policy, games and library folders between methods."""
    if args.games or args.recipe or args.stage1_tasks:
        raise CommandError("--games, --recipe and --stage1-tasks need --model DIR")
    module_name, name = TINY_WORLD_JOB.split(":")
    module = importlib.import_module(module_name)
    run_default_job = getattr(module, name)
    size = tiny_world_size(args)
    try:
        module.job_size(args.env, size)  # an environment without that size fails here
    except ValueError as err:
        raise CommandError(str(err)) from None

    def job(out: Path, method: str, seed: int) -> dict[str, Any]:
        return run_default_job(
            out / f"{method}-seed{seed}",
            size=size,
            seed=seed,
            algo=method,
            base_dir=out / f"base-seed{seed}",
            games_dir=out / f"games-seed{seed}",
            env=args.env,
            library_dir=out / f"library-seed{seed}",
            user_library=args.skill_library,
            updates=args.updates,
            eval_episodes=args.eval_episodes,
            settings=settings,
            curve_every=args.curve_every,
        )

    return job


def _named_model_job(args: argparse.Namespace, settings: dict[str, Any]) -> Any:
    """(out, method, seed) -> one job from ``--model`` on the tasks of ``--games``."""
    if args.size:
        raise CommandError("--size / --quick size the tiny world; with --model use --recipe")
    if not args.games:
        raise CommandError("--model needs --games DIR (a task folder with train, seen, unseen)")
    validate_base_model(args.model)
    env = env_spec(args.env)
    games = {split: env_tasks(env, args.games, split) for split in SPLITS}
    if empty := [s for s in SPLITS if not games[s]]:
        raise CommandError(f"--games {args.games}: no tasks in split(s) {', '.join(empty)}")
    base_cfg = recipes.on_env(_recipe_config(args), env.rollout)  # the env's budgets under it

    def job(out: Path, method: str, seed: int) -> dict[str, Any]:
        cfg = apply_method(base_cfg, method).with_changes({"env": {"name": args.env}})
        cfg = cfg.with_changes({"seed": seed}).with_changes(settings)
        facts: dict[str, Any] = {"environment": args.env, "size": _size_name(args)}
        facts |= {"algorithm": method, "seed": seed, "base_model": str(args.model)}
        facts |= {"settings": settings} if settings else {}
        return run_method_job(
            out / f"{method}-seed{seed}",
            Path(args.model),
            games,
            cfg,
            method,
            stage1_tasks=args.stage1_tasks or len(games["train"]),
            train_eval_episodes=args.eval_episodes or 4,
            facts=facts,
            base_root=out / f"base-seed{seed}",
            library_dir=out / f"library-seed{seed}",
            user_library=args.skill_library,
            curve_every=args.curve_every,
            own_base=True,
        )

    return job


PRETRAINED_RECIPE = "pretrained-cpu"  # `seed run --model`'s recipe unless --recipe names one


def named_recipe(name: str) -> recipes.Recipe:
    """The recipe called ``name``; a one-line `CommandError` naming the known ones."""
    try:
        return recipes.get(name)
    except KeyError as err:
        raise CommandError(str(err).strip("'\"")) from None


def _recipe_config(args: argparse.Namespace) -> SeedConfig:
    """``--recipe``'s config (the defaults without one) with ``--updates``."""
    cfg = named_recipe(args.recipe).config if args.recipe else SeedConfig()
    try:
        return cfg.with_changes({"updates": args.updates}) if args.updates else cfg
    except ValueError as err:
        raise CommandError(f"bad --updates: {err}") from None
