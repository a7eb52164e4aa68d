"""``seed games``: write ALFWorld games offline (all six families, expert plans included)."""

from __future__ import annotations

import argparse
import collections
import time

from envs.alfworld.games import FAMILIES, SPLIT_DIRS, RoomSize, generate_games


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``seed games``."""
    parser.add_argument("--out", required=True, help="output folder (json_2.1.1 layout)")
    parser.add_argument("--split", required=True, choices=sorted(SPLIT_DIRS), help="which split")
    parser.add_argument("--n", type=int, required=True, help="number of games")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator")
    parser.add_argument(
        "--receptacles",
        type=int,
        default=RoomSize.n_receptacles,
        help="receptacles per room (room size)",
    )
    parser.add_argument(
        "--distractors",
        type=int,
        default=RoomSize.n_distractors,
        help="distractor objects per room",
    )
    parser.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help=f"comma-separated subset of {','.join(FAMILIES)}",
    )


def run(args: argparse.Namespace) -> int:
    """Generate the games; bad input raises `GameGenerationError` (a ValueError)."""
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    start = time.perf_counter()
    room = RoomSize(args.receptacles, args.distractors)
    folders = generate_games(args.out, args.split, args.n, args.seed, room, families)
    counts = collections.Counter(f.parent.name.split("-")[0] for f in folders)
    seconds = time.perf_counter() - start
    print(
        f"wrote {len(folders)} {args.split} games to {args.out}/{SPLIT_DIRS[args.split]} "
        f"in {seconds:.1f}s"
    )
    for task_type, count in sorted(counts.items()):
        print(f"  {task_type}: {count}")
    return 0
