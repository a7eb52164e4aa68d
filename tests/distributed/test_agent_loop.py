"""The agent loop against real ALFWorld games in Ray env workers, with scripted engines."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from envs.spec import get_env
from megatron_seed.config import RolloutConfig
from megatron_seed.data import Status
from megatron_seed.data.sequences import build_sequences
from megatron_seed.rollout.agent_loop import AgentLoop, Task
from tests.scripted import ScriptedEngine, expert_policy, random_policy

ALFWORLD = get_env("alfworld")

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pool():
    from envs.workers import EnvPool

    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_loop_"))
    pool = EnvPool(num_workers=2, max_steps=12)
    yield pool
    pool.close()
    ray.shutdown()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from envs.alfworld.env import expert_plan, game_family
    from envs.alfworld.games import generate_games

    games = generate_games(tmp_path_factory.mktemp("games"), "train", n=6, seed=3)
    return [
        Task(f"t{i}", str(g), game_family(g), meta={"plan": expert_plan(g)})
        for i, g in enumerate(games)
    ]


def _loop(engine, pool, tokenizer) -> AgentLoop:
    """ALFWorld episodes of at most 12 steps, prompts never cut."""
    return AgentLoop(
        engine, pool, tokenizer, RolloutConfig(max_steps=12, max_prompt_tokens=100_000), ALFWORLD
    )


def test_expert_engine_wins_and_records_align(pool, tasks, tiny_tokenizer):
    engine = ScriptedEngine(
        tiny_tokenizer, expert_policy({t.task_id: t.meta["plan"] for t in tasks})
    )
    loop = _loop(engine, pool, tiny_tokenizer)
    ended: list[int] = []  # per turn, the episodes it ended (`seed eval`'s progress bar)
    played = loop.run(tasks, group_size=2, spec=None, on_done=ended.append)
    records, stats = played.records, played.stats
    assert len(records) == 12 and stats.episodes == 12
    assert sum(ended) == 12 and len(ended) == max(len(r.turns) for r in records)
    assert ended[len(records[0].turns) - 1] >= 2  # an episode ends on its plan's last step
    assert all(r.won and r.reward == 1.0 and r.status is Status.OK for r in records)
    for r in records:
        assert len(r.turns) == len(r.meta["plan"])
        assert r.group_id.endswith(r.task_id)
        assert "Your task is to: " in r.turns[0].user and r.goal in r.turns[0].user
        # the environment's facts: what it said, what it listed, what was executed
        assert [t.executed for t in r.turns] == r.meta["plan"] and all(t.valid for t in r.turns)
        assert all(t.executed in t.admissible for t in r.turns)
        assert r.turns[0].observation.startswith("You are in the middle of a room")
        assert r.final_observation and r.invalid_actions == 0 and r.env == "alfworld"
        assert r.turns[1].observation in r.turns[1].user  # rendered from the env's text
        (pair,) = build_sequences(r, tiny_tokenizer, "task_line", with_teacher=False)
        assert pair.student.action_ids() == [i for t in r.turns for i in t.action_ids]
    assert stats.invalid_actions == 0


def test_random_engine_rarely_wins_and_hits_the_step_budget(pool, tasks, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, random_policy(seed=1))
    loop = _loop(engine, pool, tiny_tokenizer)
    records = loop.run(tasks, group_size=1, spec=None).records
    assert sum(r.won for r in records) <= 2
    losers = [r for r in records if not r.won]
    assert losers and all(r.status is Status.MAX_STEPS and len(r.turns) == 12 for r in losers)


def test_prompt_budget_truncates(pool, tasks, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, random_policy(seed=2))
    cfg = RolloutConfig(max_steps=12, max_prompt_tokens=700)
    records = (
        AgentLoop(engine, pool, tiny_tokenizer, cfg, ALFWORLD)
        .run(tasks[:2], group_size=1, spec=None)
        .records
    )
    assert all(r.status is Status.TRUNCATED and 0 < len(r.turns) < 12 for r in records)


def test_window_mode_prompts_hold_the_history(pool, tasks, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, random_policy(seed=3))
    cfg = RolloutConfig(
        max_steps=4, max_prompt_tokens=100_000, history_mode="window", history_window=2
    )
    (record,) = (
        AgentLoop(engine, pool, tiny_tokenizer, cfg, ALFWORLD)
        .run(tasks[:1], group_size=1, spec=None)
        .records
    )
    assert record.history_mode == "window" and len(record.turns) == 4
    assert all(t.user.count("Your task is to: ") == 1 for t in record.turns)
    assert (
        "[Observation 2:" in record.turns[3].user and "[Observation 1:" not in record.turns[3].user
    )
    pairs = build_sequences(record, tiny_tokenizer, "task_line", with_teacher=False)
    assert len(pairs) == 4
