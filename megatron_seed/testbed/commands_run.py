"""`seed run [--quick] [--env NAME] [--out DIR] [--seed S] [--algo A] [--updates N]
[--eval-episodes N]`: the default job.

`--env`: alfworld (default), search (search-based QA), sokoban or webshop; each brings its task
generator, base policy and sizes (`testbed.profiles`). `--algo`: seed (default) or any method
of `megatron_seed.methods` (the paper's Table 1 rows, its Table 2 ablations, seed-replay).

Everything goes under one output folder; re-running the same command resumes.
"""

from __future__ import annotations

import argparse

from megatron_seed.compare.commands import add_job_arguments
from megatron_seed.errors import output_dir
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
        help="output folder (default runs/default[-quick]; other envs: runs/ENV[-quick])",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the games, the base policy and training"
    )
    parser.add_argument(
        "--algo", choices=list(METHODS), default="seed", help="the method (Table 1 and ablations)"
    )


def run(args: argparse.Namespace) -> int:
    """Run or resume the default job."""
    from megatron_seed.testbed.default_job import run_default_job

    default = PROFILES[args.env].run_dir + ("-quick" if args.quick else "")
    out = output_dir(args.out or default)
    run_default_job(
        out,
        quick=args.quick,
        seed=args.seed,
        algo=args.algo,
        env=args.env,
        user_library=args.skill_library,
        updates=args.updates,
        eval_episodes=args.eval_episodes,
    )
    return 0
