"""Text Sokoban: rooms from gym-sokoban's generator, the env against gym-sokoban's own
SokobanEnv, the BFS against a brute force, prompts, parser, expert demos, oracle and CLI."""

from __future__ import annotations

import importlib.util
import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("gym_sokoban") is None:  # gym itself is imported by one test only
    pytest.skip("gym-sokoban is not installed", allow_module_level=True)

from envs.sokoban import FAMILY_COLUMNS, spec
from envs.sokoban.env import SokobanEnv
from envs.sokoban.expert import (
    Demo,
    DemoSettings,
    eval_hints,
    game_demos,
    plan_hint,
    random_reply,
    reply_text,
)
from envs.sokoban.grid import MOVES, from_codes, solved, to_codes
from envs.sokoban.oracle import ORACLE, analyze_record
from envs.sokoban.prompt import TASK_MARKER, compact_grid, parse_action, prompt_style
from envs.sokoban.rooms import (
    FAMILIES,
    MAX_PLAN_MOVES,
    SPLIT_SETTINGS,
    SPLITS,
    family_of_length,
    generate_room,
    list_tasks,
    load_task,
    room_bucket,
    room_key,
    task_family,
)
from envs.sokoban.solver import solve
from megatron_seed.data.records import Status, TrajectoryRecord, Turn
from megatron_seed.skills.oracle import OracleAnalyzer
from megatron_seed.skills.parse import ValidationRules, parse_reply

REPO = Path(__file__).resolve().parents[2]
N_PER_SPLIT = 24
GYM_ACTION = {"up": 1, "down": 2, "left": 3, "right": 4}  # gym-sokoban's push(-or-move) ids


@pytest.fixture(scope="session")
def rooms_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sokoban_rooms")
    for split in SPLITS:
        spec().generate_tasks(root, split, N_PER_SPLIT, 3)
    return root


@pytest.fixture(scope="session")
def tasks(rooms_root: Path) -> dict[str, list[Path]]:
    return {split: list_tasks(rooms_root, split) for split in SPLITS}


def _write_room(path: Path, rows: list[str], plan: list[str] | None = None) -> Path:
    """A task file from a picture: # wall, _ floor, O target, X box, √ box on target, P, S."""
    fixed_code = {"#": 0, "_": 1, "O": 2, "X": 1, "√": 2, "P": 1, "S": 2}
    state_code = {"#": 0, "_": 1, "O": 2, "X": 4, "√": 3, "P": 5, "S": 5}
    room_fixed = [[fixed_code[ch] for ch in row] for row in rows]
    room_state = [[state_code[ch] for ch in row] for row in rows]
    room, start = from_codes(room_fixed, room_state)
    data = {
        "room_fixed": room_fixed,
        "room_state": room_state,
        "plan": plan if plan is not None else (solve(room, start) or []),
        "family": "hand",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _grid(rows: list[str]) -> str:
    return "\n".join("".join(f" {ch} \t" for ch in row) for row in rows)


# ---- rooms --------------------------------------------------------------------------------


def test_every_split_has_valid_rooms_and_families(tasks: dict[str, list[Path]]) -> None:
    for split, paths in tasks.items():
        assert len(paths) == N_PER_SPLIT, split
        for path in paths:
            task = load_task(path)
            assert task.data["split"] == split and task.data["room"] == {
                "dim": [6, 6],
                "num_boxes": 1,
            }
            assert len(task.room.targets) == len(task.start.boxes) == 1
            assert not solved(task.room, task.start)
            assert 1 <= len(task.plan) <= MAX_PLAN_MOVES
            assert task_family(path) == family_of_length(len(task.plan)) == task.data["family"]
        assert {task_family(p) for p in paths} <= set(FAMILIES)
    assert [f for f, _ in FAMILY_COLUMNS] == list(FAMILIES)
    assert family_of_length(1) == "short" and family_of_length(4) == "medium"
    assert family_of_length(5) == "long"


def test_splits_have_disjoint_seeds_and_rooms(tasks: dict[str, list[Path]]) -> None:
    data = {s: [load_task(p).data for p in paths] for s, paths in tasks.items()}
    seeds = {s: {d["room_seed"] for d in ds} for s, ds in data.items()}
    assert {x % 3 for x in seeds["train"]} == {0} and {x % 3 for x in seeds["seen"]} == {1}
    assert {x % 3 for x in seeds["unseen"]} == {2}
    rooms = {
        s: {json.dumps([d["room_fixed"], d["room_state"]]) for d in ds} for s, ds in data.items()
    }
    assert all(len(rooms[s]) == N_PER_SPLIT for s in SPLITS)  # no room twice in a split
    buckets = {s: {room_bucket(room_key(d)) for d in ds} for s, ds in data.items()}
    assert buckets == {"train": {2, 3}, "seen": {0}, "unseen": {1}}
    assert not rooms["train"] & rooms["seen"] and not rooms["train"] & rooms["unseen"]
    assert not rooms["seen"] & rooms["unseen"]
    # train and seen share the generator settings; unseen does not
    assert {json.dumps(d["settings"]) for d in data["train"] + data["seen"]} == {
        json.dumps({"num_steps": 20, "p_change_directions": 0.35, "tries": 4})
    }
    assert data["unseen"][0]["settings"] == {
        "num_steps": 30,
        "p_change_directions": 0.7,
        "tries": 4,
    }


def test_generation_is_reproducible(tmp_path: Path) -> None:
    a = spec().generate_tasks(tmp_path / "a", "unseen", 6, 11)
    b = spec().generate_tasks(tmp_path / "b", "unseen", 6, 11)
    assert [p.relative_to(tmp_path / "a") for p in a] == [p.relative_to(tmp_path / "b") for p in b]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    c = spec().generate_tasks(tmp_path / "c", "unseen", 6, 12)
    assert [load_task(p).data["room_state"] for p in a] != [
        load_task(p).data["room_state"] for p in c
    ]
    # n rooms are the first n of a larger batch; options change the rooms
    longer = spec().generate_tasks(tmp_path / "d", "unseen", 8, 11)
    assert [p.read_bytes() for p in longer[:6]] == [p.read_bytes() for p in a]
    wide = spec().generate_tasks(tmp_path / "e", "unseen", 6, 11, num_steps=12)
    assert json.loads(wide[0].read_text())["settings"]["num_steps"] == 12


def test_room_replays_from_its_seed_and_keeps_global_rngs(tasks: dict[str, list[Path]]) -> None:
    import numpy as np

    data = load_task(tasks["seen"][0]).data
    random.seed(5)
    np.random.seed(5)
    before = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    arrays = generate_room(SPLIT_SETTINGS["seen"], data["room_seed"])
    assert (random.random(), np.random.random()) == before
    assert arrays["room_fixed"] == data["room_fixed"]
    assert arrays["room_state"] == data["room_state"]


def test_generator_is_loaded_without_gym(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from envs.sokoban import spec\n"
        "s = spec()\n"
        "assert not any(m in sys.modules for m in ('gym', 'gym_sokoban', 'numpy')), 'spec'\n"
        f"s.generate_tasks({str(tmp_path)!r}, 'train', 2, 0)\n"
        "print(sorted(m for m in ('gym', 'gym_sokoban', 'pkg_resources') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]" and "Gym has been unmaintained" not in proc.stderr


def test_list_tasks_and_family(
    rooms_root: Path, tasks: dict[str, list[Path]], tmp_path: Path
) -> None:
    every = spec().list_tasks(rooms_root, None)
    assert every == sorted(every) and len(every) == 3 * N_PER_SPLIT
    assert set(every) == {p for paths in tasks.values() for p in paths}
    assert spec().family(str(tasks["train"][0])) == tasks["train"][0].parent.name
    with pytest.raises(ValueError, match="unknown split"):
        spec().list_tasks(rooms_root, "valid")
    with pytest.raises(ValueError, match="no Sokoban task folder"):
        spec().list_tasks(tmp_path, "seen")


# ---- the environment ------------------------------------------------------------------------


def test_env_hand_computed_push_and_win(tmp_path: Path) -> None:
    rows = ["######", "#_PXO#", "#____#", "#____#", "#____#", "######"]
    env = SokobanEnv(max_steps=15)
    obs, info = env.reset(_write_room(tmp_path / "r.json", rows))
    assert obs == _grid(rows)
    assert info["won"] is False and info["task"] == "push the box (X) onto the target (O)"
    assert info["admissible_actions"] == ["up", "down", "left", "right"]
    obs, reward, done, info = env.step("up")  # a wall: nothing moves, still -0.1
    assert (obs, reward, done, info["moved_player"]) == (_grid(rows), -0.1, False, False)
    obs, reward, done, info = env.step("right")  # the box onto the target
    assert obs == _grid(["######", "#__P√#", "#____#", "#____#", "#____#", "######"])
    assert reward == -0.1 + 1 + 10 and done and info["won"] and info["moved_box"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("left")


def test_env_blocked_pushes_off_target_and_player_on_target(tmp_path: Path) -> None:
    # two boxes: one on its target (√), one free; a box against a box or a wall stays put
    rows = ["######", "#P√X_#", "#_O__#", "#____#", "#____#", "######"]
    env = SokobanEnv()
    env.reset(_write_room(tmp_path / "two.json", rows))
    obs, reward, done, _ = env.step("right")  # box into box: no effect
    assert (obs, reward, done) == (_grid(rows), -0.1, False)
    env.step("down")
    obs, reward, done, _ = env.step("right")  # onto the target (row 2): S
    assert obs == _grid(["######", "#_√X_#", "#_S__#", "#____#", "#____#", "######"])
    assert reward == -0.1
    obs, reward, done, _ = env.step("up")  # push the box up into the wall: no effect
    assert reward == -0.1 and obs.splitlines()[2] == " # \t _ \t S \t _ \t _ \t # \t"
    env2 = SokobanEnv()
    env2.reset(
        _write_room(
            tmp_path / "off.json", ["######", "#P√__#", "#_O_X#", "#____#", "#____#", "######"]
        )
    )
    obs, reward, done, _ = env2.step("right")  # pushes the box off its target: -1
    assert reward == pytest.approx(-1.1) and reward == -0.1 + -1.0 and not done
    assert obs.splitlines()[1] == " # \t _ \t S \t X \t _ \t # \t"


def test_env_invalid_action_and_step_budget(tmp_path: Path) -> None:
    rows = ["######", "#_PXO#", "#____#", "#____#", "#____#", "######"]
    env = SokobanEnv(max_steps=3)
    env.reset(_write_room(tmp_path / "r.json", rows))
    obs, reward, done, info = env.step("jump <b>")
    assert obs.splitlines()[0] == (
        "Invalid action 'jump <b>': choose up, down, left or right. The room is unchanged:"
    )
    assert obs.split("\n", 1)[1] == _grid(rows) and reward == -0.1 and not done
    assert info["invalid"] is True and info["steps"] == 1
    assert env.step(" Left ")[3]["moved_player"]  # normalised, not invalid
    obs, reward, done, info = env.step("left")  # a wall, the third and last step
    assert done and not info["won"] and info["steps"] == 3 and reward == -0.1


def _gym_env(task_path: Path, max_steps: int):
    """gym-sokoban's own SokobanEnv holding the task file's room, as its reset() leaves it."""
    import numpy as np
    from gym_sokoban.envs.sokoban_env import SokobanEnv as GymSokobanEnv

    data = json.loads(task_path.read_text())
    state = np.array(data["room_state"])
    boxes = int(((state == 3) | (state == 4)).sum())
    gym = GymSokobanEnv(dim_room=(6, 6), max_steps=max_steps, num_boxes=boxes, reset=False)
    gym.room_fixed = np.array(data["room_fixed"])
    gym.room_state = state
    gym.box_mapping = {tuple(t): tuple(b) for t, b in data["box_mapping"]}
    gym.player_position = np.argwhere(gym.room_state == 5)[0]
    gym.num_env_steps = gym.reward_last = gym.boxes_on_target = 0
    return gym


def _two_box_rooms(folder: Path, count: int) -> list[Path]:
    """Rooms with two boxes from gym-sokoban's generator (both boxes off target), so that
    the +1 / -1 shaping of a box entering and leaving a target is compared too."""
    import numpy as np

    from envs.sokoban.rooms import room_utils

    paths: list[Path] = []
    for seed in range(200):
        if len(paths) == count:
            break
        random.seed(seed)
        np.random.seed(seed)
        try:
            fixed, state, mapping = room_utils().generate_room((6, 6), 0.35, 20, 2, 4, False)
        except (RuntimeError, RuntimeWarning):
            continue
        if ((fixed == 2) & (state == 4)).any():  # gym marks a never-moved box 4 on its target
            continue
        data = {
            "room_fixed": fixed.astype(int).tolist(),
            "room_state": state.astype(int).tolist(),
            "box_mapping": [[list(map(int, t)), list(map(int, b))] for t, b in mapping.items()],
            "plan": [],
        }
        path = folder / f"two_{seed}.json"
        path.write_text(json.dumps(data))
        paths.append(path)
    return paths


def test_env_matches_gym_sokoban(tasks: dict[str, list[Path]], tmp_path: Path) -> None:
    """Move sequences (half BFS moves, half random, some invalid: gym's no-op 0) on generated
    rooms: every reward, done and state equal gym-sokoban's own SokobanEnv's."""
    rng = random.Random(0)
    rooms = tasks["train"][:6] + tasks["unseen"][:6] + _two_box_rooms(tmp_path, 4)
    sequences = compared = 0
    rewards: set[float] = set()
    for path in rooms:
        for _ in range(5):
            gym, ours = _gym_env(path, 15), SokobanEnv(max_steps=15)
            ours.reset(path)
            sequences += 1
            for _ in range(15):
                assert ours.room is not None and ours.state is not None
                plan = solve(ours.room, ours.state, max_moves=15) or []
                if plan and rng.random() < 0.5:
                    text = plan[0]
                else:
                    text = rng.choice([*MOVES] * 6 + ["stay"])
                _, g_reward, g_done, _ = gym.step(GYM_ACTION.get(text, 0), "tiny_rgb_array")
                _, reward, done, info = ours.step(text)
                assert to_codes(ours.room, ours.state) == gym.room_state.astype(int).tolist()
                assert (reward, done) == (g_reward, g_done), (path, text)
                assert info["won"] == gym._check_if_all_boxes_on_target()
                rewards.add(round(reward, 6))
                compared += 1
                if done:
                    break
        if load_task(path).plan:  # the stored optimal plan wins in gym-sokoban too
            gym = _gym_env(path, 15)
            results = [gym.step(GYM_ACTION[m], "tiny_rgb_array") for m in load_task(path).plan]
            assert results[-1][2] and results[-1][1] == pytest.approx(10.9)
            assert all(not r[2] for r in results[:-1])
    assert sequences >= 50 and len(rooms) >= 10 and compared > 500
    assert {-0.1, 0.9, -1.1, 10.9} <= rewards  # every kind of shaped reward was compared
    print(
        f"\ngym-sokoban parity: {sequences} sequences, {compared} steps, rewards {sorted(rewards)}"
    )


# ---- solver ---------------------------------------------------------------------------------


def _brute_force_length(rows: list[list[int]], state: list[list[int]], limit: int) -> int | None:
    """The shortest solving sequence by enumerating every sequence, on raw codes."""
    deltas = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

    def play(seq: tuple[str, ...]) -> bool:
        boxes = {(r, c) for r, row in enumerate(state) for c, v in enumerate(row) if v in (3, 4)}
        (player,) = [(r, c) for r, row in enumerate(state) for c, v in enumerate(row) if v == 5]
        for move in seq:
            dr, dc = deltas[move]
            ahead = (player[0] + dr, player[1] + dc)
            if rows[ahead[0]][ahead[1]] == 0:
                continue
            if ahead in boxes:
                behind = (ahead[0] + dr, ahead[1] + dc)
                if rows[behind[0]][behind[1]] == 0 or behind in boxes:
                    continue
                boxes = (boxes - {ahead}) | {behind}
            player = ahead
            if all(rows[b[0]][b[1]] == 2 for b in boxes):
                return True
        return False

    for length in range(1, limit + 1):
        if any(play(seq) for seq in itertools.product(MOVES, repeat=length)):
            return length
    return None


def test_bfs_is_optimal_against_brute_force(tasks: dict[str, list[Path]], tmp_path: Path) -> None:
    small = [p for s in SPLITS for p in tasks[s] if len(load_task(p).plan) <= 5][:10]
    assert len(small) >= 8
    for path in small:
        task = load_task(path)
        plan = solve(task.room, task.start)
        assert plan is not None and plan == task.plan
        length = _brute_force_length(task.data["room_fixed"], task.data["room_state"], len(plan))
        assert length == len(plan), path
        env = SokobanEnv()
        env.reset(path)
        outcomes = [env.step(m) for m in plan]
        assert outcomes[-1][3]["won"] and not any(o[2] for o in outcomes[:-1])
    # no plan at all: the box sits in a corner; an already solved room: the empty plan
    stuck = load_task(
        _write_room(
            tmp_path / "s.json", ["######", "#X___#", "#_P_O#", "#____#", "#____#", "######"], []
        )
    )
    assert solve(stuck.room, stuck.start) is None
    done = load_task(
        _write_room(
            tmp_path / "d.json", ["######", "#√P__#", "#____#", "#____#", "#____#", "######"], []
        )
    )
    assert solve(done.room, done.start) == []
    far = load_task(tasks["unseen"][0])
    assert solve(far.room, far.start, max_moves=len(far.plan) - 1) is None


def test_expert_plan_wins_every_task(tasks: dict[str, list[Path]]) -> None:
    s = spec()
    won = total = 0
    for paths in tasks.values():
        for path in paths:
            env = s.make_env(15)
            env.reset(str(path))
            plan = s.expert_plan(str(path))
            assert plan and all(m in MOVES for m in plan)
            for move in plan:
                _, reward, done, info = env.step(move)
            total += 1
            won += int(done and info["won"] and reward == pytest.approx(10.9))
    print(f"\nexpert win rate: {won}/{total}")
    assert won == total == 3 * N_PER_SPLIT


def test_random_policy_win_rate(tasks: dict[str, list[Path]]) -> None:
    rng = random.Random(1)
    wins: dict[str, list[int]] = {f: [] for f in FAMILIES}
    env = spec().make_env(15)
    for _ in range(3):
        for path in (p for s in SPLITS for p in tasks[s]):
            obs, info = env.reset(str(path))
            done = False
            while not done:
                action, valid = parse_action(
                    random_reply(info["task"], obs, info["admissible_actions"], rng)
                )
                assert valid
                obs, _, done, info = env.step(action)
            wins[task_family(path)].append(int(info["won"]))
    episodes = sum(len(w) for w in wins.values())
    rate = sum(sum(w) for w in wins.values()) / episodes
    by_family = {f: round(sum(w) / len(w), 2) for f, w in wins.items() if w}
    print(f"\nrandom policy: win rate {rate:.3f} over {episodes} episodes; {by_family}")
    assert episodes >= 200
    assert 0.05 < rate < 0.40  # measured ~0.2 (1-move rooms ~0.7, 5+-move rooms ~0.03)
    assert by_family["short"] > by_family["long"]


# ---- prompts and parser ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<action>up</action>", ("up", True)),
        ("<think>go</think>\n<action> Down </action>", ("down", True)),
        ("<ACTION>LEFT</ACTION>", ("left", True)),
        ("<action>left</action> then <action>right.</action>", ("right", True)),
        ("right", (None, False)),
        ("<action>north</action>", (None, False)),
        ("<action>move up</action>", (None, False)),
        ("<action></action>", (None, False)),
        ("<action>up", (None, False)),
        ("", (None, False)),
    ],
)
def test_parse_action(reply: str, expected: tuple[str | None, bool]) -> None:
    assert parse_action(reply) == expected
    assert spec().parse_action(reply) == expected


def _marker_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(TASK_MARKER)]


def test_prompts_have_one_task_line(tasks: dict[str, list[Path]]) -> None:
    s = spec()
    assert s.task_marker == TASK_MARKER != "Your task is " + "to"
    env = s.make_env(15)
    obs, info = env.reset(str(tasks["train"][0]))
    goal, adm = info["task"], info["admissible_actions"]
    nxt = env.step("up")[0]
    for style in ("paper", "compact"):
        p = s.prompts(style)
        first = p.first(goal, obs, adm)
        assert len(_marker_lines(first)) == 1, style
        assert len(_marker_lines(p.window(goal, [(obs, "up")], nxt, 1, adm))) == 1
        assert p.window(goal, [], obs, 0, adm) == first
        assert _marker_lines(p.step(1, nxt, adm)) == []
    paper = s.prompts("paper")
    first = paper.first(goal, obs, adm)
    assert paper.system_prompt is None and obs in first
    assert "- Box on Target (`√`): A box successfully placed on a target." in first
    assert 'Your admissible actions are ["up", "down", "left", "right"].' in first
    assert "<think> </think>" in first and "<action> </action>" in first
    window = paper.window(goal, [(obs, "up")], nxt, 1, adm)
    assert f"[Observation 1: '{obs}', Action 1: 'up']" in window and "step 2" in window
    compact = s.prompts("compact")
    assert "\n" not in compact.system_prompt and compact.step_lists_admissible is False
    rows = obs.splitlines()
    assert compact.first(goal, obs, adm) == (
        "Your goal is to push the box (X) onto the target (O).\n"
        + "\n".join(r.replace(" ", "").replace("\t", "") for r in rows)
    )
    assert compact.step(1, nxt, adm) == compact_grid(nxt) and len(compact_grid(nxt)) == 41
    print(f"\ncompact first prompt: {len(compact.first(goal, obs, adm))} chars; paper {len(first)}")
    with pytest.raises(ValueError, match="unknown prompt style"):
        prompt_style("verbose")


# ---- demos ----------------------------------------------------------------------------------


def _replay(demo: Demo) -> tuple[list[str], bool, str]:
    env = SokobanEnv(max_steps=15)
    obs, info = env.reset(demo.game)
    seen = [obs]
    for action in demo.actions:
        obs, _, _, info = env.step(action)
        seen.append(obs)
    return seen[:-1], bool(info["won"]), seen[-1]


def test_demos_are_deterministic_and_win(tasks: dict[str, list[Path]]) -> None:
    settings = DemoSettings(
        noisy_per_game=2,
        hinted_per_game=1,
        mistake_prob=0.4,
        max_mistakes=2,
        max_demo_steps=15,
        seed=4,
        search=False,
    )
    games = [str(p) for s in SPLITS for p in tasks[s][:8]]
    first = [game_demos(g, i, settings) for i, g in enumerate(games)]
    again = [game_demos(g, i, settings) for i, g in enumerate(games)]
    assert first == again
    mistakes = 0
    for game, demos in zip(games, first, strict=True):
        assert len(demos) == 3 and [d.hint is None for d in demos] == [True, True, False]
        for demo in demos:
            assert demo.won and len(demo.actions) <= settings.max_demo_steps
            assert len(demo.observations) == len(demo.admissible) == len(demo.actions)
            assert demo.mistakes <= settings.max_mistakes
            observations, won, final = _replay(demo)  # played in the real env
            assert (observations, won, final) == (demo.observations, True, demo.final_observation)
            mistakes += demo.mistakes
        plan = load_task(game).plan
        assert demos[2].actions == plan and demos[2].mistakes == 0
        assert ", ".join(plan) in demos[2].hint and len(demos[2].hint.split()) >= 10
    assert mistakes > 0  # the noisy demos do make (and recover from) mistakes
    hints = eval_hints(games[:3])
    assert hints[games[0]] == plan_hint(load_task(games[0]).plan)
    assert hints[games[0]].startswith("Plan: ") and "opposite" in hints[games[0]]
    for move in MOVES:
        assert parse_action(reply_text(move)) == (move, True)


# ---- oracle ---------------------------------------------------------------------------------


def _record(game: Path, replies: list[str], max_steps: int = 15) -> TrajectoryRecord:
    """A record of an episode played in the env with these replies (as the agent loop does)."""
    env = SokobanEnv(max_steps=max_steps)
    obs, info = env.reset(game)
    first_prompt = prompt_style("compact").first(info["task"], obs, None)
    turns, done, won = [], False, False
    for i, reply in enumerate(replies):
        action, valid = parse_action(reply)
        executed = action if action is not None else reply
        turns.append(
            Turn(
                first_prompt if i == 0 else obs,
                reply,
                [1],
                [0.0],
                observation=obs,
                executed=executed,
                valid=valid,
            )
        )
        obs, _, done, info = env.step(executed)
        won = bool(info["won"])
        if done:
            break
    status = Status.MAX_STEPS if not won and len(turns) >= max_steps else Status.OK
    return TrajectoryRecord(
        task_id=game.stem, group_id="g", game=str(game), family=task_family(game), turns=turns,
        reward=0.0, won=won, status=status, env="sokoban",
        task_marker=TASK_MARKER, goal=info["task"], final_observation=obs,
    )  # fmt: skip


def _valid_skill(record: TrajectoryRecord) -> str:
    (gen,) = OracleAnalyzer(ORACLE)([_request(record)])
    assert gen.error is None, gen.error
    parsed = parse_reply(gen.text, ValidationRules(), record.turns[0].user)
    assert parsed.valid, parsed.error
    assert parsed.skill is not None and 10 <= len(parsed.skill.split()) <= 80
    return parsed.skill


def _request(record: TrajectoryRecord):
    from megatron_seed.skills.parse import AnalysisRequest

    return AnalysisRequest(0, "t", record, "record", [], [])  # type: ignore[arg-type]


def test_oracle_success_and_failures(tmp_path: Path) -> None:
    rows = ["######", "#____#", "#_X__#", "#_P_O#", "#____#", "######"]
    game = _write_room(tmp_path / "o.json", rows)
    plan = load_task(game).plan
    assert plan == ["left", "up", "right", "right", "up", "right", "down"]  # BFS order
    said = ", ".join(plan)
    # success after a lost turn
    ok = _record(game, ["<action>jump</action>", *map(reply_text, plan)])
    assert ok.won and len(ok.turns) == 8
    skill = _valid_skill(ok)
    assert skill.startswith(f"Plan that worked: {said}. It took 8 steps; the shortest plan is 7")
    assert "The box starts at row 3, column 3, the target is at row 4, column 5" in skill
    assert (
        "stand left of the box to push it right, then stand above the box to push it down" in skill
    )
    # failures: the first mistake, in the order it happened
    cases = {
        ("down", *plan): "Avoid wandering: at step 1 'down' led away from the shortest plan "
        "(7 moves were left before it, 8 after).",
        ("up",): "Avoid dead pushes: at step 1 'up' pushed the box against a wall at row 2, "
        "column 3, from where it can never reach the target.",
        (*plan[:4], "right"): "Avoid useless moves: at step 5 'right' pushed the box at row 3, "
        "column 5 against a wall and had no effect.",
        (*plan[:5], "up", "up"): "Avoid useless moves: at step 6 'up' walked into the wall at "
        "row 1, column 4 and had no effect.",
    }
    for moves, first in cases.items():
        record = _record(game, [reply_text(m) for m in moves], max_steps=len(moves))
        assert not record.won
        skill = _valid_skill(record)
        assert skill.startswith(first), skill
        assert said in skill  # the fix: an optimal plan from the start
    skill = _valid_skill(_record(game, [reply_text(m) for m in (*plan[:5], "up")], max_steps=6))
    assert f"Fix: play {said} (7 moves): the first 5 moves were right, then right, down." in skill
    # a corner
    corner = _write_room(
        tmp_path / "c.json", ["######", "#____#", "#X___#", "#P___#", "#O___#", "######"]
    )
    skill = _valid_skill(_record(corner, [reply_text("up")], max_steps=1))
    assert skill.startswith(
        "Avoid dead pushes: at step 1 'up' pushed the box into a corner at row 2, column 2"
    )
    assert f"Fix: from the start play {', '.join(load_task(corner).plan)} (6 moves)." in skill
    # an invalid reply first, then the budget runs out
    lost = _record(game, ["I go up", *[reply_text("left")] * 3], max_steps=4)
    assert not lost.won and lost.status is Status.MAX_STEPS
    skill = _valid_skill(lost)
    assert skill.startswith("Avoid replies without a move: at step 1")
    assert f"Fix: from the start play {said} (7 moves)." in skill
    assert analyze_record(lost) == analyze_record(lost)  # deterministic
    # a record the oracle cannot read, or one that disagrees with its task file
    bad = TrajectoryRecord(**{**lost.__dict__, "game": str(tmp_path / "missing.json")})
    wrong = TrajectoryRecord(**{**lost.__dict__, "won": True})
    out = OracleAnalyzer(ORACLE)([_request(bad), _request(wrong)])
    assert out[0].error and "missing.json" in out[0].error
    assert out[1].error and "won=True" in out[1].error


def test_oracle_on_generated_rooms(tasks: dict[str, list[Path]]) -> None:
    rng = random.Random(2)
    kinds = set()
    for path in tasks["unseen"][:12]:
        replies = [random_reply("", "", None, rng) for _ in range(15)]
        record = _record(path, replies)
        skill = _valid_skill(record)
        kinds.add(skill.split(":")[0])
    print(f"\noracle skill kinds on random play: {sorted(kinds)}")
    assert len(kinds) >= 2


# ---- seed games -----------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "megatron_seed.cli", "games", "--env", "sokoban", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_seed_games_cli(tmp_path: Path) -> None:
    proc = _cli("--out", str(tmp_path), "--split", "seen", "--n", "4", "--seed", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote 4 seen rooms to {tmp_path / 'seen'} in ")
    assert len(list_tasks(tmp_path, "seen")) == 4
    out = ["--out", str(tmp_path)]
    for bad in (
        [*out, "--split", "seen", "--n", "0"],
        [*out, "--split", "valid", "--n", "1"],
        [*out, "--split", "seen", "--n", "1", "--p-change-directions", "2"],
    ):
        proc = _cli(*bad)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith("seed games: error: ")
    (tmp_path / "file").write_text("")
    proc = _cli("--out", str(tmp_path / "file"), "--split", "seen", "--n", "1")
    assert proc.returncode == 2 and "is not a folder" in proc.stderr
