"""`seed run [--size full|quick|evidence | --quick] [--env NAME] [--out DIR] [--seed S]
[--algo A] [--updates N] [--eval-episodes N]`: the default job.

`--env`: alfworld (default), search (search-based QA), sokoban or webshop; each brings its task
generator, base policy and sizes (`testbed.profiles`; `--size evidence`: ALFWorld only).
`--algo`: seed (default) or any method of `megatron_seed.methods` (the paper's Table 1 rows,
its Table 2 ablations, seed-replay).

Everything goes under one output folder; re-running the same command resumes.
"""

from __future__ import annotations

import argparse

from megatron_seed.compare.commands import add_job_arguments, job_settings, tiny_world_size
from megatron_seed.errors import CommandError, output_dir
from megatron_seed.methods import METHODS
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


def run(args: argparse.Namespace) -> int:
    """Run or resume the default job."""
    from megatron_seed.testbed.default_job import job_size, run_default_job

    size = tiny_world_size(args)
    try:
        job_size(args.env, size)  # a size the environment lacks fails before anything runs
    except ValueError as err:
        raise CommandError(str(err)) from None
    default = PROFILES[args.env].run_dir + ("" if size == "full" else f"-{size}")
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
    )
    return 0
