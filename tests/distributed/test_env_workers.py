"""Env workers in Ray actors on the real ALFWorld engine: prefetch, max steps, failures."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("alfworld")

from envs.alfworld.env import expert_plan  # noqa: E402
from envs.alfworld.games import generate_games  # noqa: E402
from envs.api import EpisodeStatus  # noqa: E402
from envs.workers import EnvPool  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tempfile.mkdtemp(prefix="ray_envs_", dir="/tmp"),
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("pool_games")
    return generate_games(root, "train", n=6, seed=11)  # one per family


def _play_plans(pool: EnvPool, ids: list[int], plans: dict[int, list[str]], start: int = 0):
    """Step every episode along its plan from ``start``; returns the last result of each."""
    last = {}
    step = start
    while True:
        actions = {i: plans[i][step] for i in ids if step < len(plans[i]) and i not in last}
        if not actions:
            return last
        for i, result in pool.step(actions).items():
            if result.done:
                last[i] = result
        step += 1


def test_pool_plays_expert_plans_with_prefetched_resets(ray_cluster, games: list[Path]) -> None:
    pool = EnvPool(num_workers=2, max_steps=30)
    try:
        episode_games = [str(g) for g in games] * 2
        pool.prefetch(episode_games)
        time.sleep(0.5)
        first = pool.reset(episode_games)
        # (prefetch makes this reset cheap; its speed is measured in envs/alfworld/bench.py)
        assert [r.status for r in first] == [EpisodeStatus.RUNNING] * 12
        assert all(r.info["task"] and "Your task is to" not in r.observation for r in first)
        assert {pool.worker_of(r.episode_id) for r in first} == {0, 1}
        plans = {r.episode_id: expert_plan(g) for r, g in zip(first, episode_games, strict=True)}
        last = _play_plans(pool, list(plans), plans)
        assert len(last) == 12
        assert all(r.status is EpisodeStatus.WON and r.reward == 1.0 for r in last.values())
        assert pool.restarts == 0
    finally:
        pool.close()


def test_max_steps_and_bad_input_in_the_pool(ray_cluster, games: list[Path], tmp_path) -> None:
    pool = EnvPool(num_workers=2, max_steps=30)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "game.tw-pddl").write_text(json.dumps({"pddl_domain": "(define"}))
    try:
        results = pool.reset([str(games[0]), str(broken), str(games[1])])
        assert results[1].status is EpisodeStatus.ERROR and "lacks" in results[1].error
        ids = [results[0].episode_id, results[2].episode_id]
        for step in range(1, 31):
            out = pool.step({ids[0]: "look", ids[1]: "x" * 10_000 + "\x00\x1b"})
            assert out[ids[1]].observation == "Nothing happens."
            assert out[ids[0]].done == (step == 30)
        assert out[ids[0]].status is EpisodeStatus.TRUNCATED and not out[ids[0]].won
        again = pool.step({ids[0]: "look"})
        assert again[ids[0]].status is EpisodeStatus.ERROR
    finally:
        pool.close()


@pytest.mark.parametrize("how", ["crash", "sigkill", "hang"])
def test_failed_worker_loses_nothing(ray_cluster, games: list[Path], how: str) -> None:
    pool = EnvPool(num_workers=2, max_steps=30, step_timeout_s=3.0, reset_timeout_s=60.0)
    try:
        first = pool.reset([str(g) for g in games])
        plans = {r.episode_id: expert_plan(g) for r, g in zip(first, games, strict=True)}
        ids = list(plans)
        for step in range(2):
            pool.step({i: plans[i][step] for i in ids})
        victims = [i for i in ids if pool.worker_of(i) == 0]
        assert victims and len(victims) < len(ids)
        worker = pool.workers[0]
        if how == "crash":
            worker.crash.remote()
        elif how == "sigkill":
            os.kill(ray.get(worker.pid.remote()), signal.SIGKILL)
        else:
            worker.hang.remote(60)
        time.sleep(0.5)
        out = pool.step({i: plans[i][2] for i in ids if len(plans[i]) > 2})
        # a hung worker is replaced at the step timeout (3 s), not waited for (60 s)
        assert pool.restarts >= 1
        for i, result in out.items():
            if i in victims and not result.done:
                assert result.status is EpisodeStatus.RECOVERED, result
            assert result.status is not EpisodeStatus.ERROR, result
        last = {i: r for i, r in out.items() if r.done}
        last.update(_play_plans(pool, [i for i in ids if i not in last], plans, start=3))
        assert sorted(last) == sorted(ids)
        assert all(r.status is EpisodeStatus.WON for r in last.values())
    finally:
        pool.close()
