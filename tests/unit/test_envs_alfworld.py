"""ALFWorld games, adapter and prompt on the real engine (alfworld + TextWorld PDDL)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("textworld")

from envs.alfworld.env import (
    AlfWorldEnv,
    GameFormatError,
    expert_plan,
    find_games,
    game_family,
)
from envs.alfworld.games import (
    FAMILIES,
    GameGenerationError,
    RoomSize,
    generate_games,
    pairing_is_unseen,
    scene_pool,
)
from envs.alfworld.prompt import (
    TASK_PREFIX,
    format_reward,
    parse_action,
    render_first_observation,
    render_step_observation,
    render_window_prompt,
)

SPLITS = ("train", "seen", "unseen")


@pytest.fixture(scope="module")
def games_root(alfworld_games: Path) -> Path:
    """The session's games: six per split, one of each family (`tests/fixtures.py`)."""
    return alfworld_games


@pytest.fixture(scope="module")
def all_games(games_root: Path) -> dict[str, list[Path]]:
    return {split: find_games(games_root, split) for split in SPLITS}


def _meta(game: Path) -> dict:
    return json.loads((game / "traj_data.json").read_text())


def test_every_split_has_all_six_families(all_games: dict[str, list[Path]]) -> None:
    for split, games in all_games.items():
        assert len(games) == 6, split
        assert {game_family(g) for g in games} == set(FAMILIES), split


def test_unseen_uses_other_scenes_and_pairings(all_games: dict[str, list[Path]]) -> None:
    def pairing(game: Path) -> tuple[str, str]:
        p = _meta(game)["pddl_params"]
        return p["object_target"], p["parent_target"] or p["toggle_target"]

    train_scenes = {_meta(g)["scene"]["scene_num"] for g in all_games["train"] + all_games["seen"]}
    unseen_scenes = {_meta(g)["scene"]["scene_num"] for g in all_games["unseen"]}
    assert not train_scenes & unseen_scenes
    assert unseen_scenes <= set(scene_pool("unseen"))
    train_pairs = {pairing(g) for g in all_games["train"] + all_games["seen"]}
    unseen_pairs = {pairing(g) for g in all_games["unseen"]}
    assert not train_pairs & unseen_pairs
    assert all(pairing_is_unseen(*p) for p in unseen_pairs)
    # seen differs from train (same scene pool, other random stream)
    train_problems = {(g / "initial_state.pddl").read_text() for g in all_games["train"]}
    assert not train_problems & {(g / "initial_state.pddl").read_text() for g in all_games["seen"]}


def test_generation_is_deterministic(tmp_path: Path, all_games: dict[str, list[Path]]) -> None:
    again = generate_games(tmp_path, "train", n=2, seed=7)
    originals = {g.name: (g / "initial_state.pddl").read_text() for g in all_games["train"]}
    for game in again:
        assert (game / "initial_state.pddl").read_text() == originals[game.name]


def test_games_load_with_alfworlds_own_env(games_root: Path) -> None:
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    config = {
        "env": {
            "goal_desc_human_anns_prob": 0,
            "task_types": [1, 2, 3, 4, 5, 6],
            "domain_randomization": False,
            "expert_type": "handcoded",
        },
        "dataset": {
            "data_path": str(games_root / "valid_unseen"),
            "eval_id_data_path": str(games_root / "valid_seen"),
            "eval_ood_data_path": str(games_root / "valid_unseen"),
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": 30}},
    }
    # "train" mode is the one where alfworld's wrappers also compute the expert plan
    alf = AlfredTWEnv(config, train_eval="train")
    assert alf.num_games == 6
    env = alf.init_env(batch_size=2)
    obs, infos = env.reset()
    assert all("Your task is to: " in o for o in obs)
    assert infos["won"] == [False, False]
    # the expert the wrappers compute wins from here
    for _ in range(40):
        obs, _, dones, infos = env.step([plan[0] for plan in infos["extra.expert_plan"]])
        if all(dones):
            break
    assert infos["won"] == [True, True]
    env.close()


def _play(env: AlfWorldEnv, game: Path, actions: list[str]) -> tuple[bool, int]:
    env.reset(game)
    for n, action in enumerate(actions, start=1):
        _, reward, done, info = env.step(action)
        if done:
            assert reward == float(info["won"])
            return info["won"], n
    return False, len(actions)


def test_planner_plan_wins_every_game(all_games: dict[str, list[Path]]) -> None:
    env = AlfWorldEnv(max_steps=30)
    handcoded = 0
    for split, games in all_games.items():
        for game in games:
            plan = expert_plan(game, "planner")
            assert len(plan) <= 30
            assert _play(env, game, plan) == (True, len(plan)), game
            # a plan that stops one step short must not win (the goal is not trivially true)
            assert _play(env, game, plan[:-1])[0] is False, game
            if split != "train":  # checked at generation too; replay one split to save time
                continue
            try:
                long_plan = expert_plan(game, "handcoded")
            except GameFormatError:
                continue
            handcoded += 1
            assert _play(AlfWorldEnv(max_steps=200), game, long_plan) == (True, len(long_plan))
    assert handcoded >= 5  # alfworld's own expert solves nearly all of them


def test_random_policy_wins_rarely(all_games: dict[str, list[Path]]) -> None:
    rng = random.Random(0)
    env = AlfWorldEnv(max_steps=30)
    wins = episodes = 0
    for games in all_games.values():
        for game in games:  # one game per family
            _, info = env.reset(game)
            done = False
            while not done:
                _, _, done, info = env.step(rng.choice(info["admissible_actions"]))
            wins += info["won"]
            episodes += 1
    assert episodes == 18
    assert wins / episodes < 0.25, wins


def test_observations_come_from_the_engine(all_games: dict[str, list[Path]]) -> None:
    env = AlfWorldEnv()
    game = all_games["train"][0]
    obs, info = env.reset(game)
    assert obs.startswith("You are in the middle of a room. Looking quickly around you, you see")
    assert info["task"] and TASK_PREFIX not in obs  # the goal travels in info["task"]
    assert info["task"].startswith(("put", "look", "examine", "find", "clean", "heat", "cool"))
    assert "help" not in info["admissible_actions"] and "look" in info["admissible_actions"]
    go = next(a for a in info["admissible_actions"] if a.startswith("go to "))
    obs, reward, done, info = env.step(go)
    assert obs.startswith(f"You arrive at {go[len('go to ') :]}.")
    assert (reward, done, info["won"], info["step"]) == (0.0, False, False, 1)
    obs, *_ = env.step("dance with the fridge")
    assert obs == "Nothing happens."


def test_bad_actions_get_nothing_happens(all_games: dict[str, list[Path]]) -> None:
    env = AlfWorldEnv()
    _, info = env.reset(all_games["seen"][0])
    go = next(a for a in info["admissible_actions"] if a.startswith("go to "))
    obs, _, done, info = env.step("x" * 10_000)
    assert obs == "Nothing happens." and not done and info["step"] == 1
    obs, *_ = env.step("\x00\x1b[2J\x07\u200b")
    assert obs == "Nothing happens."
    # control characters inside a real command are stripped, not fatal
    obs, *_ = env.step(go.replace(" ", "\x00 ", 1) + "\r\n")
    assert obs.startswith("You arrive at")


def test_max_steps_truncates(all_games: dict[str, list[Path]]) -> None:
    env = AlfWorldEnv(max_steps=3)
    env.reset(all_games["train"][1])
    results = [env.step("look") for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]
    assert results[-1][3]["truncated"] and not results[-1][3]["won"]
    with pytest.raises(RuntimeError):
        env.step("look")


def test_malformed_games_raise_clear_errors(
    tmp_path: Path, all_games: dict[str, list[Path]]
) -> None:
    env = AlfWorldEnv()
    with pytest.raises(GameFormatError, match=r"no game\.tw-pddl"):
        env.reset(tmp_path)
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "game.tw-pddl").write_text("{not json")
    with pytest.raises(GameFormatError, match="not JSON"):
        env.reset(bad_json)
    good = all_games["train"][0]
    broken = tmp_path / "broken_problem"
    broken.mkdir()
    data = json.loads((good / "game.tw-pddl").read_text())
    data["pddl_problem"] = data["pddl_problem"][: len(data["pddl_problem"]) // 2]
    (broken / "game.tw-pddl").write_text(json.dumps(data))
    with pytest.raises(GameFormatError, match="alfworld cannot load"):
        env.reset(broken)
    unknown = tmp_path / "unknown_task"
    unknown.mkdir()
    (unknown / "game.tw-pddl").write_text((good / "game.tw-pddl").read_text())
    meta = _meta(good)
    meta["task_type"] = "juggle_three_apples"
    (unknown / "traj_data.json").write_text(json.dumps(meta))
    with pytest.raises(GameFormatError, match="unknown task type"):
        env.reset(unknown)
    # the env still plays a good game afterwards
    obs, _ = env.reset(good)
    assert obs


def test_generator_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(GameGenerationError, match="unknown task family"):
        generate_games(tmp_path, "train", 1, 0, families=["juggle"])
    with pytest.raises(GameGenerationError, match="unknown split"):
        generate_games(tmp_path, "test", 1, 0)
    with pytest.raises(GameGenerationError, match="room size"):
        RoomSize(n_receptacles=1)


def test_room_size_knob(tmp_path: Path) -> None:
    small = generate_games(tmp_path / "s", "train", 1, 3, RoomSize(3, 0), ["pick"])[0]
    large = generate_games(tmp_path / "l", "train", 1, 3, RoomSize(12, 6), ["pick"])[0]
    small_meta, large_meta = _meta(small)["seed_generator"], _meta(large)["seed_generator"]
    assert small_meta["n_receptacles"] == 3 and small_meta["n_objects"] == 1
    assert large_meta["n_receptacles"] == 12 and large_meta["n_objects"] == 7


def test_seed_games_cli(tmp_path: Path) -> None:
    from megatron_seed.cli import main

    assert (
        main(["games", "--out", str(tmp_path), "--split", "seen", "--n", "2", "--seed", "1"]) == 0
    )
    assert len(find_games(tmp_path, "seen")) == 2
    assert main(["games", "--out", str(tmp_path), "--split", "seen", "--n", "0"]) == 2
    bad = ["games", "--out", str(tmp_path), "--split", "seen", "--n", "1", "--families", "x"]
    assert main(bad) == 2


# ---- prompt -------------------------------------------------------------------------------


def _task_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(TASK_PREFIX)]


def test_first_prompt_has_one_task_line(all_games: dict[str, list[Path]]) -> None:
    env = AlfWorldEnv()
    obs, info = env.reset(all_games["train"][2])
    prompt = render_first_observation(info["task"], obs, info["admissible_actions"])
    assert _task_lines(prompt) == [f"{TASK_PREFIX}{info['task']}."]
    assert "<action>" in prompt and "'look'" in prompt and "'help'" not in prompt
    assert "Looking quickly around you" in prompt
    step = render_step_observation(1, "You arrive at desk 1.", ["look", "inventory"])
    assert _task_lines(step) == [] and "step 2" in step and "You arrive at desk 1." in step


def test_window_prompt_packs_last_k_pairs() -> None:
    history = [(f"obs {i}", f"act {i}") for i in range(1, 6)]
    prompt = render_window_prompt("put a mug in desk", history[-2:], "now", 5, ["look"])
    assert _task_lines(prompt) == [f"{TASK_PREFIX}put a mug in desk."]
    assert "[Observation 4: 'obs 4', Action 4: 'act 4']" in prompt
    assert "[Observation 5: 'obs 5', Action 5: 'act 5']" in prompt
    assert "obs 3" not in prompt and "already taken 5 step(s)" in prompt
    assert "step 6" in prompt
    first = render_window_prompt("put a mug in desk", [], "start", 0, ["look"])
    assert first == render_first_observation("put a mug in desk", "start", ["look"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>go</think><action>go to desk 1</action>", ("go to desk 1", True)),
        ("<action>look</action> then <action> Go To\tShelf 2 </action>", ("go to shelf 2", True)),
        ("<action>open\x00 drawer 1\x1b</action>", ("open drawer 1", True)),
        ("I will go to desk 1", (None, False)),
        ("<action>   </action>", (None, False)),
        ("<action>go to desk 1", (None, False)),
        ("", (None, False)),
    ],
)
def test_parse_action(text: str, expected: tuple[str | None, bool]) -> None:
    assert parse_action(text) == expected


def test_parse_action_caps_length_and_penalty() -> None:
    action, valid = parse_action("<action>" + "a" * 10_000 + "</action>", max_chars=64)
    assert not valid and action == "a" * 64
    assert format_reward(1.0, valid=True, penalty=0.5) == 1.0
    assert format_reward(0.0, valid=False, penalty=0.5) == -0.5
    assert format_reward(0.0, valid=False) == 0.0


def test_batched_env_and_protocol(all_games: dict[str, list[Path]]) -> None:
    from envs.api import BatchedEnv, Env, EpisodeStatus, sanitize_action

    assert isinstance(AlfWorldEnv(), Env)
    assert sanitize_action("go\tto\x00 desk\u200b 1\n", max_chars=8) == "go to de"
    games = all_games["unseen"][:2]
    batch = BatchedEnv(lambda: AlfWorldEnv(max_steps=30))
    first = batch.reset([str(g) for g in games])
    assert [r.episode_id for r in first] == [0, 1]
    plans = {i: expert_plan(g) for i, g in enumerate(games)}
    statuses = {}
    for step in range(max(len(p) for p in plans.values())):
        actions = {i: p[step] for i, p in plans.items() if step < len(p)}
        for i, result in batch.step(actions).items():
            statuses[i] = result.status
    assert statuses == {0: EpisodeStatus.WON, 1: EpisodeStatus.WON}


def test_the_template_memo_prints_what_textworld_prints(
    all_games: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AlfWorldEnv parses TextWorld's feedback templates once (`envs.alfworld.textgen_memo`);
    a game played with the memo and with TextWorld's own parser prints the same text."""
    from textworld.envs.pddl import textgen

    from envs.alfworld import textgen_memo

    def transcript() -> list:
        env, rng, out = AlfWorldEnv(max_steps=12), random.Random(3), []
        for game in (all_games["train"][0], all_games["unseen"][1]):
            obs, info = env.reset(game)
            out.append((obs, info["task"], info["admissible_actions"]))
            done = False
            while not done:
                obs, reward, done, info = env.step(rng.choice(info["admissible_actions"]))
                out.append((obs, reward, done, info["admissible_actions"]))
        return out

    memoized = transcript()
    assert getattr(textgen._parse_and_convert, "_seed_memo", False)
    monkeypatch.setattr(textgen, "_parse_and_convert", textgen._parse_and_convert.uncached)
    monkeypatch.setattr(textgen_memo, "install", lambda: None)
    assert transcript() == memoized
    assert not getattr(textgen._parse_and_convert, "_seed_memo", False)  # TextWorld's own
    assert len(memoized) == 2 + 24  # both games ran their 12 steps
