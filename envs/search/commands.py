"""``seed games --env search``: write search-QA tasks offline.

Generated: ``seed games --env search --split train|seen|unseen --n N --seed S --out DIR
[--corpus-size P] [--max-hops H] [--families nq,hotpotqa,...]`` writes ``DIR/corpus.jsonl``
(once, shared by the splits) and ``DIR/<split>/<data_source>/<qid>.json``.

Official: ``seed games --env search --from-parquet FILE.parquet (--corpus wiki.jsonl |
--retriever-url URL) --split S --out DIR [--n N]`` converts Search-R1's parquet rows.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from envs.search.corpus import DATA_SOURCES
from envs.search.official import convert_parquet
from envs.search.tasks import DEFAULT_CORPUS_SIZE, DEFAULT_MAX_HOPS, SPLITS, generate_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``seed games --env search``."""
    parser.add_argument("--out", required=True, help="task folder")
    parser.add_argument("--split", required=True, help=f"{'/'.join(SPLITS)} (any name for parquet)")
    parser.add_argument("--n", type=int, default=None, help="number of tasks (parquet: all rows)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator")
    parser.add_argument("--corpus-size", type=int, default=DEFAULT_CORPUS_SIZE,
                        help="passages in the generated corpus")  # fmt: skip
    parser.add_argument("--max-hops", type=int, default=DEFAULT_MAX_HOPS,
                        help="longest MuSiQue chain (4 needs an episode budget of 5 steps)")  # fmt: skip
    parser.add_argument("--families", default=",".join(DATA_SOURCES),
                        help="comma-separated data sources to generate")  # fmt: skip
    parser.add_argument("--from-parquet", default=None, help="Search-R1 parquet file to convert")
    parser.add_argument(
        "--corpus", default=None, help="with --from-parquet: a wiki-18 JSONL corpus"
    )
    parser.add_argument("--retriever-url", default=None,
                        help="with --from-parquet: a retrieval server's /retrieve URL")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Generate or convert the tasks; bad input raises a ValueError (TaskError,
    RetrieverError)."""
    start = time.perf_counter()
    out = Path(args.out)
    if args.from_parquet:
        paths = convert_parquet(
            args.from_parquet, out, args.split, args.n, args.corpus, args.retriever_url
        )
    else:
        if args.corpus or args.retriever_url:
            raise ValueError("--corpus and --retriever-url go with --from-parquet")
        if args.n is None:
            raise ValueError("--n is required to generate tasks")
        families = [f.strip() for f in args.families.split(",") if f.strip()]
        paths = generate_tasks(
            out, args.split, args.n, args.seed, corpus_size=args.corpus_size,
            max_hops=args.max_hops, families=families,
        )  # fmt: skip
    counts = collections.Counter(p.parent.name for p in paths)
    seconds = time.perf_counter() - start
    print(f"wrote {len(paths)} {args.split} tasks to {out}/{args.split} in {seconds:.1f}s")
    for source, count in sorted(counts.items()):
        print(f"  {source}: {count}")
    return 0
