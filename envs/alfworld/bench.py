"""Benchmark the ALFWorld env workers: steps/s for parallel episodes, reset cost vs room size.

    .venv/bin/python -m envs.alfworld.bench --episodes 64 --workers 2 --out /tmp/bench_envs.json

Steps/s: ``--episodes`` episodes over ``--workers`` Ray workers; resets are prefetched, then
every episode takes random admissible actions until done (max 30 steps) -- the env side of a
rollout with an instant policy. Reset cost: load+reset of one game per room size, mean of
``--reset-repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def bench_pool(games: list[str], episodes: int, workers: int, seed: int) -> dict:
    import ray

    from envs.workers import EnvPool

    pool = EnvPool("alfworld", num_workers=workers, max_steps=30)
    rng = random.Random(seed)
    episode_games = [games[i % len(games)] for i in range(episodes)]
    t0 = time.perf_counter()
    pool.prefetch(episode_games)
    # wait for the prefetch queue to drain, as it would during a policy's first generation
    ray.get([w.pid.remote() for w in pool.workers])
    prefetch_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    results = pool.reset(episode_games)
    reset_s = time.perf_counter() - t1
    live = {r.episode_id: r.info["admissible_actions"] for r in results}
    steps = wins = 0
    t2 = time.perf_counter()
    while live:
        out = pool.step({i: rng.choice(adm) for i, adm in live.items()})
        steps += len(out)
        for i, r in out.items():
            if r.done:
                wins += r.won
                del live[i]
            else:
                live[i] = r.info["admissible_actions"]
    step_s = time.perf_counter() - t2
    pool.close()
    return {
        "episodes": episodes,
        "workers": workers,
        "prefetch_s": round(prefetch_s, 2),
        "reset_after_prefetch_s": round(reset_s, 3),
        "env_steps": steps,
        "step_phase_s": round(step_s, 2),
        "steps_per_s": round(steps / step_s, 1),
        "random_policy_win_rate": round(wins / episodes, 3),
    }


def bench_reset(root: Path, sizes: list[tuple[int, int]], repeats: int) -> list[dict]:
    from envs.alfworld.env import AlfWorldEnv
    from envs.alfworld.games import RoomSize, generate_games

    env = AlfWorldEnv()
    rows = []
    for n_rec, n_dis in sizes:
        folders = generate_games(root / f"r{n_rec}", "train", 6, 5, RoomSize(n_rec, n_dis))
        times, step_times = [], []
        for folder in folders:
            for _ in range(repeats):
                t0 = time.perf_counter()
                _, info = env.reset(folder)
                times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                env.step(info["admissible_actions"][0])
                step_times.append(time.perf_counter() - t0)
        rows.append(
            {
                "receptacles": n_rec,
                "distractors": n_dis,
                "reset_ms_mean": round(1000 * statistics.mean(times), 1),
                "reset_ms_max": round(1000 * max(times), 1),
                "step_ms_mean": round(1000 * statistics.mean(step_times), 1),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--games", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reset-repeats", type=int, default=3)
    parser.add_argument("--sizes", default="5:2,10:5,20:10,40:20")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    import ray

    from envs.alfworld.games import generate_games

    root = Path(tempfile.mkdtemp(prefix="bench_envs_"))
    games = [str(g) for g in generate_games(root / "pool", "train", args.games, args.seed)]
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    ray.init(
        num_cpus=os.cpu_count() or 2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tempfile.mkdtemp(prefix="ray_bench_", dir="/tmp"),
    )
    try:
        pool = bench_pool(games, args.episodes, args.workers, args.seed)
    finally:
        ray.shutdown()
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes.split(",")]
    resets = bench_reset(root, sizes, args.reset_repeats)
    result = {"cpus": os.cpu_count(), "pool": pool, "reset_vs_room_size": resets}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
