"""``seed games --env sokoban``: write Sokoban rooms offline (gym-sokoban's generator)."""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from envs.sokoban.rooms import generate_rooms, task_family


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``seed games --env sokoban``."""
    parser.add_argument("--out", required=True, help="output folder (<out>/<split>/<family>/)")
    parser.add_argument("--split", required=True, help="train, seen or unseen")
    parser.add_argument("--n", type=int, required=True, help="number of rooms")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator")
    parser.add_argument(
        "--num-steps",
        type=int,
        default=None,
        help="random-walk steps of the room generator (default: the split's, 20 or 40)",
    )
    parser.add_argument(
        "--p-change-directions",
        type=float,
        default=None,
        help="the walk's turn probability (default: the split's, 0.35 or 0.7)",
    )


def run(args: argparse.Namespace) -> int:
    """Generate the rooms; bad input raises `RoomGenerationError` (a ValueError)."""
    start = time.perf_counter()
    out = Path(args.out)
    paths = generate_rooms(
        out,
        args.split,
        args.n,
        args.seed,
        num_steps=args.num_steps,
        p_change_directions=args.p_change_directions,
    )
    counts = collections.Counter(task_family(p) for p in paths)
    seconds = time.perf_counter() - start
    print(f"wrote {len(paths)} {args.split} rooms to {out / args.split} in {seconds:.1f}s")
    for family, count in sorted(counts.items()):
        print(f"  {family}: {count}")
    return 0
