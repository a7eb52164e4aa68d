"""``seed games --env webshop``: write WebShop goals offline.

Generated: ``seed games --env webshop --split train|seen|unseen --n N --seed S --out DIR
[--targets-per-type T]`` writes the catalogue (``DIR/items.json``, ``DIR/items_attrs.json``,
``DIR/shop.json``; shared by the splits) and ``DIR/<split>/<category>/<goal_id>.json``.

Official: ``seed games --env webshop --from-official DATA_DIR --split train|seen|unseen|all
--out DIR [--n N]`` converts the original's item, attribute and human-instruction files.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from envs.webshop.official import convert_official
from envs.webshop.tasks import DEFAULT_TARGETS_PER_TYPE, SPLITS, generate_tasks, task_family


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``seed games --env webshop``."""
    parser.add_argument("--out", required=True, help="task folder")
    parser.add_argument("--split", required=True, help=f"{'/'.join(SPLITS)} (official: also all)")
    parser.add_argument("--n", type=int, default=None, help="number of goals (official: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator")
    parser.add_argument("--targets-per-type", type=int, default=DEFAULT_TARGETS_PER_TYPE,
                        help="target products per product type (5 products each)")  # fmt: skip
    parser.add_argument("--from-official", default=None,
                        help="folder with WebShop's items, attributes and human instructions")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Generate or convert the goals; bad input raises a ValueError (TaskError, ShopError)."""
    start = time.perf_counter()
    out = Path(args.out)
    if args.from_official:
        paths = convert_official(args.from_official, out, args.split, args.n, args.seed)
    else:
        if args.n is None:
            raise ValueError("--n is required to generate goals")
        paths = generate_tasks(out, args.split, args.n, args.seed, args.targets_per_type)
    counts = collections.Counter(task_family(p) for p in paths)
    seconds = time.perf_counter() - start
    print(f"wrote {len(paths)} {args.split} goals to {out / args.split} in {seconds:.1f}s")
    for category, count in sorted(counts.items()):
        print(f"  {category}: {count}")
    return 0
