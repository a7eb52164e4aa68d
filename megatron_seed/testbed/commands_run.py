"""`seed run [--size full|quick|evidence | --quick] [--env NAME] [--out DIR] [--seed S]
[--algo A] [--updates N] [--eval-episodes N] [--model DIR [--recipe R]]`: the default job.

`--env`: alfworld (default), search (search-based QA), sokoban or webshop; each brings its task
generator, base policy and sizes (`testbed.profiles`; `--size evidence`: ALFWorld only).
`--algo`: seed (default) or any method of `megatron_seed.methods` (the paper's Table 1 rows,
its Table 2 ablations, seed-replay). `--model`: a pretrained model folder instead of the tiny
base policy, trained with `--recipe` (default `pretrained-cpu`) on the size's games.

Everything goes under one output folder; re-running the same command resumes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from megatron_seed.compare.commands import (
    PRETRAINED_RECIPE,
    add_job_arguments,
    check_skill_library,
    job_settings,
    named_recipe,
    tiny_world_size,
)
from megatron_seed.errors import CommandError, output_dir
from megatron_seed.methods import METHODS
from megatron_seed.models.checks import validate_base_model
from megatron_seed.testbed import ENV
from megatron_seed.testbed.profiles import PROFILES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    add_job_arguments(parser)
    parser.add_argument(
        "--env", choices=sorted(PROFILES), default=ENV, help="the environment the job plays"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default runs/default[-SIZE]; other envs: runs/ENV[-SIZE]; no "
        "suffix for full)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the games, the base policy and training"
    )
    parser.add_argument(
        "--algo", choices=list(METHODS), default="seed", help="the method (Table 1 and ablations)"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="start from this pretrained HF model folder instead of the tiny world's base "
        "policy (e.g. tools/fetch_smollm2.sh's SmolLM2-135M-Instruct); the size still picks "
        "the games and evaluation episodes (default folder: runs/default[-SIZE]-MODELNAME)",
    )
    parser.add_argument(
        "--recipe",
        default=None,
        help=f"with --model: the recipes.py recipe of Stage 1 and Stage 2 (default "
        f"{PRETRAINED_RECIPE})",
    )


def run(args: argparse.Namespace) -> int:
    """Run or resume the default job."""
    from megatron_seed.testbed.default_job import job_size, run_default_job

    size = tiny_world_size(args)
    try:
        job_size(args.env, size)  # a size the environment lacks fails before anything runs
    except ValueError as err:
        raise CommandError(str(err)) from None
    check_skill_library(args.skill_library)
    if args.recipe and not args.model:
        raise CommandError("--recipe is for --model; the tiny world's sizes bring their own")
    recipe = None
    if args.model:
        validate_base_model(args.model)  # before any game is generated
        recipe = named_recipe(args.recipe or PRETRAINED_RECIPE).name
    default = PROFILES[args.env].run_dir + ("" if size == "full" else f"-{size}")
    default += f"-{Path(args.model).resolve().name}" if args.model else ""
    out = output_dir(args.out or default)
    run_default_job(
        out,
        size=size,
        seed=args.seed,
        algo=args.algo,
        env=args.env,
        user_library=args.skill_library,
        updates=args.updates,
        eval_episodes=args.eval_episodes,
        settings=job_settings(args),
        curve_every=args.curve_every,
        model=args.model,
        recipe=recipe,
    )
    return 0
