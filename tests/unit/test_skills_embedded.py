"""Embedded analyzer on episodes played in real generated ALFWorld games; `seed annotate --embedded`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("textworld")

from envs.alfworld.env import AlfWorldEnv, expert_plan, find_games, game_family
from envs.alfworld.oracle import ORACLE, analyze_record, game_facts, replay
from envs.alfworld.prompt import (
    SYSTEM_PROMPT,
    render_first_observation,
    render_step_observation,
    render_window_prompt,
)
from megatron_seed.config import SkillConfig
from megatron_seed.data.records import Status, TrajectoryRecord, Turn, write_jsonl
from megatron_seed.skills.oracle import OracleAnalyzer
from megatron_seed.skills.parse import analysis_metrics, analyze_with_retries

NO_ACTION = "<no action>"  # a reply without an <action> tag


def play(
    game: Path,
    actions: list[str],
    max_steps: int = 30,
    history: str = "full",
    env: AlfWorldEnv | None = None,
) -> TrajectoryRecord:
    """A record of `actions` played in `game` on the real engine (rendered as the actor sees it)."""
    env = env or AlfWorldEnv()
    env.max_steps = max_steps
    obs, info = env.reset(game)
    task, adm = info["task"], info["admissible_actions"]
    first, past = obs, []
    user = render_first_observation(task, obs, adm)
    turns, won, done = [], False, False
    for step, action in enumerate(actions):
        reply = (
            "I am not sure."
            if action == NO_ACTION
            else f"<think>go</think><action>{action}</action>"
        )
        executed = reply if action == NO_ACTION else action
        turns.append(Turn(user, reply, [7, 2], [-0.3, -0.1], observation=obs, admissible=adm,
                          executed=executed, valid=action != NO_ACTION))  # fmt: skip
        past.append((obs if step else first, action))
        obs, _, done, info = env.step(executed)
        won, adm = info["won"], info["admissible_actions"]
        if history == "full":
            user = render_step_observation(step + 1, obs, adm)
        else:
            user = render_window_prompt(task, past[-2:], obs, step + 1, adm)
        if done:
            break
    return TrajectoryRecord(
        task_id=Path(game).name, group_id="g", game=str(game), family=game_family(game), turns=turns,
        reward=float(won), won=won, status=Status.MAX_STEPS if done and not won else Status.OK,
        env="alfworld", history_mode=history, system_prompt=SYSTEM_PROMPT,
        task_marker="Your task is to:", goal=task, final_observation=obs,
    )  # fmt: skip


def _policies(plan: list[str], family: str = "") -> dict[str, tuple[list[str], int]]:
    """Scripted policies: name -> (actions, step budget)."""
    gos = [a for a in plan if a.startswith("go to ")]
    no_change = [a for a in plan if a.split()[0] not in ("clean", "heat", "cool", "use")]
    far = gos[-1]
    policies = {
        "expert": (plan, 30),
        "detour": ([far, "look", far, "inventory", *plan], 30),
        "rejected": (["take spoon 9 from shelf 9", *no_change, *(gos[:2] * 10)], 12),
    }
    if family in ("pick", "clean"):
        policies["no_action"] = ([NO_ACTION, NO_ACTION, *gos[:1] * 10], 8)
    return policies


@pytest.fixture(scope="module")
def episodes(alfworld_games: Path) -> dict[tuple[str, str], TrajectoryRecord]:
    root = alfworld_games  # the session's games (`tests/fixtures.py`): one per family
    out = {}
    env = AlfWorldEnv()
    for game in find_games(root, "train"):
        family = game_family(game)
        for name, (actions, budget) in _policies(expert_plan(game), family).items():
            out[(family, name)] = play(game, actions, max_steps=budget, env=env)
    return out


def test_every_embedded_skill_passes_validation(episodes: dict) -> None:
    records = list(episodes.values())
    results = analyze_with_retries(OracleAnalyzer(ORACLE), records, SkillConfig())
    metrics = analysis_metrics(results)
    assert metrics["analyze/valid_rate"] == 1.0, [r.error for r in results if not r.valid]
    assert metrics["analyze/retries_mean"] == 0.0
    # skills vary with the trajectory: one distinct skill per distinct episode
    distinct_episodes = {(*(t.action for t in r.turns), r.game) for r in records}
    assert len({r.skill for r in results}) == len(distinct_episodes)


def test_success_skills_are_workflows_of_the_game(episodes: dict) -> None:
    for (family, name), record in episodes.items():
        if not record.won:
            continue
        facts = game_facts(record)
        skill = analyze_record(record)["skill"]
        assert skill.startswith(f"Workflow: to {facts.goal}, "), skill
        take = next(a for a in facts.expert_plan if a.startswith("take "))
        assert take in skill and facts.object_target in skill
        if family in ("clean", "heat", "cool"):
            assert f"only then place it in the {facts.parent_target}" in skill
        if name == "detour":
            assert "extra steps" in skill or "suffice" in skill
        if name == "rejected":  # pick, pick2 and look win without the skipped state change
            assert (
                "Note that 'take spoon 9 from shelf 9' at step 1 did nothing because you were at"
                in skill
            )


def test_failure_skills_name_the_mistake_and_the_fix(episodes: dict) -> None:
    for (family, name), record in episodes.items():
        if record.won:
            continue
        skill = analyze_record(record)["skill"]
        assert skill.startswith("Avoid "), skill
        assert "step budget ran out" in skill
        assert "Instead, starting from" in skill  # the rest of the expert plan
        if name == "rejected" and family in ("clean", "heat", "cool"):
            verb = {"clean": "cleaning", "heat": "heating", "cool": "cooling"}[family]
            assert skill.startswith(f"Avoid moving the {game_facts(record).object_target} 1 to the")
            assert f"before {verb} it" in skill
        if name == "rejected":
            assert (
                "'take spoon 9 from shelf 9' gave \"Nothing happens.\" because you were at the starting point, not at shelf 9"
                in skill
            )
            assert "Fix: go to shelf 9 before taking from it." in skill
        if name == "no_action":
            assert "replies without one admissible action inside <action></action>: 2 of 8" in skill


def test_replay_tracks_location_holding_and_state(episodes: dict) -> None:
    record = next(r for (f, n), r in episodes.items() if f == "clean" and n == "expert")
    rep = replay(record)
    facts = game_facts(record)
    take = next(s for s in rep.steps if s.action and s.action.startswith("take "))
    assert take.location == take.action.split(" from ")[1] and take.holding is None
    obj = take.action.split(" from ")[0][5:]
    assert rep.states[obj] == {"clean"}
    move = rep.steps[-1]
    assert move.action.startswith(f"move {obj} to {facts.parent_target}") and move.holding == obj


def test_facts_from_meta_alone_match_facts_from_the_game_folder(episodes: dict) -> None:
    for record in list(episodes.values())[:8]:
        facts = game_facts(record)
        detached = dataclasses.replace(
            record,
            game="somewhere/else",
            meta={**record.meta, "expert_plan": facts.expert_plan, "object_target": facts.object_target,
                  "parent_target": facts.parent_target, "toggle_target": facts.toggle_target},
        )  # fmt: skip
        assert game_facts(detached) == facts
        assert analyze_record(detached) == analyze_record(record)
    # without any facts the skill still comes from the trajectory alone
    bare = dataclasses.replace(record, game="", meta={})
    assert analyze_record(bare)["skill"]


def test_windowed_records_get_the_same_skill(episodes: dict) -> None:
    record = episodes[("heat", "rejected")]
    plan = expert_plan(record.game)
    actions, budget = _policies(plan)["rejected"]
    windowed = play(Path(record.game), actions, max_steps=budget, history="window")
    assert analyze_record(windowed) == analyze_record(record)


def test_seed_annotate_embedded_end_to_end(episodes: dict, tmp_path: Path, capsys) -> None:
    from megatron_seed.cli import main

    src = tmp_path / "traj.jsonl"
    write_jsonl(episodes.values(), src)
    out = tmp_path / "ann"
    assert main(["annotate", "--in", str(src), "--out", str(out), "--embedded"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["acceptance_rate"] == 1.0 and summary["accepted"] == len(episodes)
    assert "accepted (100.0%)" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "sft.jsonl").read_text().splitlines()]
    assert len(rows) == len(episodes)
    assert json.loads(rows[0]["response"])["skill"] == rows[0]["skill"]
    assert (
        rows[0]["messages"][0]["role"] == "user"
        and "## Episode" in rows[0]["messages"][0]["content"]
    )
    annotated = [json.loads(line) for line in (out / "annotated.jsonl").read_text().splitlines()]
    assert all(a["analysis"]["valid"] and a["skill"] for a in annotated)
    # user errors are one line, exit code 2
    assert (
        main(["annotate", "--in", str(tmp_path / "missing.jsonl"), "--out", str(out), "--embedded"])
        == 2
    )
    assert main(["annotate", "--in", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no trajectory file" in err and "give --base-url and --model" in err
