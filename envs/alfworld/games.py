"""Offline ALFWorld game generator.

Writes solvable games in alfworld's own game-folder format (the json_2.1.1 layout:
``<split>/<task>-<Obj>-None-<Recep>-<scene>/trial_*/{traj_data.json, initial_state.pddl,
game.tw-pddl}``) using only what the `alfworld` package ships: the PDDL domain
(``alfred.pddl``), the grammar (``alfred.twl2``), the 120 scene layouts
(``gen/layouts/FloorPlan*-{objects,openable}.json``), the object/receptacle constants
(``gen/constants.py``) and the goal templates (``gen/goal_library.py``).

Where it departs from ALFWorld's own data (which came from AI2-THOR simulations):

- Rooms are small on purpose: a sampled subset of the scene's receptacles (``n_receptacles``)
  and a few distractor objects (``n_distractors``). Receptacle ids and their navigation points
  are the scene's real ones; object ids carry made-up coordinates.
- Lamps (``DeskLamp``/``FloorLamp``) are placed on a lamp-holding receptacle of the scene.
- Splits: ``train`` and ``seen`` draw from ALFWorld's train scenes, ``unseen`` from its test
  scenes; object-receptacle (or object-lamp) pairings are partitioned by a fixed hash so that
  pairings used by ``unseen`` never occur in ``train``/``seen``.

Every game is played by the PDDL planner (its plan is stored as ``walkthrough``, alfworld's
own field; a game is kept only if that plan wins when replayed in the engine) and by
alfworld's handcoded expert (``handcoded_walkthrough``, kept when it wins within 100 steps:
it explores like a player and can take longer than the 30-step episode budget).

The generator is split by concern: ``envs.alfworld.scenes`` reads alfworld's shipped files
(tables, scene layouts, constants, scene pools), ``envs.alfworld.tasks`` samples a task and
writes its PDDL, and this module writes and plays the games. It re-exports the public names
of the other two, so ``envs.alfworld.games`` stays the one import for callers.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from envs.alfworld import textgen_memo
from envs.alfworld.scenes import (
    _SCENES,
    FAMILIES,
    SPLIT_DIRS,
    TASK_TYPE_TO_FAMILY,
    GameGenerationError,
    Scene,
    _alfworld_paths,
    load_scene,
    pairing_is_unseen,
    scene_pool,
)
from envs.alfworld.tasks import (
    RoomSize,
    TaskSpec,
    _traj_data,
    build_problem,
    describe,
    sample_task,
)

__all__ = [
    "FAMILIES",
    "SPLIT_DIRS",
    "TASK_TYPE_TO_FAMILY",
    "GameGenerationError",
    "RoomSize",
    "Scene",
    "TaskSpec",
    "build_problem",
    "describe",
    "generate_games",
    "load_scene",
    "pairing_is_unseen",
    "sample_task",
    "scene_pool",
    "write_game",
]


def _play(gamefile: str, expert: str, max_steps: int = 100) -> tuple[list[str], bool]:
    """Play a game with alfworld's expert (``planner`` or ``handcoded``) on its wrappers."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredInfos,
    )
    from textworld.envs import PddlEnv

    textgen_memo.install()  # each template parsed once per process, not at every step
    infos = textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])
    env = AlfredExpert(AlfredInfos(AlfredDemangler(PddlEnv(infos))), expert_type=expert)
    env.load(gamefile)
    state = env.reset()
    if expert == "planner":
        plan = list(state["extra.expert_plan"])
        for command in plan:
            state, _, done = env.step(command)
        return plan, bool(state["won"])
    plan: list[str] = []
    done = False
    while not done and len(plan) < max_steps:
        command = state["extra.expert_plan"][0]
        state, _, done = env.step(command)
        plan.append(command)
    return plan, bool(state["won"])


def write_game(
    spec: TaskSpec, split: str, out_root: Path, index: int, handcoded: bool = True
) -> Path:
    """Write one game folder and its expert plans; returns the folder.

    ``handcoded=False`` skips alfworld's handcoded expert (half the cost; the folder then has
    no ``handcoded_walkthrough``). Raises GameGenerationError when an expert plan does not
    win (the folder is removed).
    """
    pddl_path, grammar_path, _ = _alfworld_paths()
    name = f"{spec.task_type}-{spec.object_target}-None-"
    name += f"{spec.parent_target or spec.toggle_target}-{spec.scene}"
    folder = out_root / SPLIT_DIRS[split] / name / f"trial_{spec.seed_key}"
    folder.mkdir(parents=True, exist_ok=True)
    problem = build_problem(spec)
    grammar = grammar_path.read_text().replace("UNKNOWN GOAL", spec.goal_desc)
    (folder / "initial_state.pddl").write_text(problem)
    (folder / "traj_data.json").write_text(json.dumps(_traj_data(spec, split), indent=1))
    gamedata = {
        "pddl_domain": pddl_path.read_text(),
        "grammar": grammar,
        "pddl_problem": problem,
        "solvable": None,
        "walkthrough": None,
    }
    gamefile = folder / "game.tw-pddl"
    gamefile.write_text(json.dumps(gamedata))
    try:
        planner_plan, planner_won = _play(str(gamefile), "planner")
        handcoded_plan, handcoded_won = (
            _play(str(gamefile), "handcoded") if handcoded else (None, False)
        )
    except Exception as err:  # the engine rejected the problem: a generator bug, fail loud
        _remove(folder)
        raise GameGenerationError(f"engine rejected generated game {folder}: {err}") from err
    if not planner_won:
        _remove(folder)
        raise GameGenerationError(f"the planner's plan does not win {folder.name}")
    # alfworld's handcoded expert explores like a player would; it is kept when it wins
    gamedata.update(
        solvable=True,
        walkthrough=planner_plan,
        handcoded_walkthrough=handcoded_plan if handcoded_won else None,
    )
    gamefile.write_text(json.dumps(gamedata))
    return folder


def _remove(folder: Path) -> None:
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def generate_games(
    out: str | os.PathLike,
    split: str,
    n: int,
    seed: int,
    room: RoomSize | tuple[int, int] | None = None,
    families: list[str] | None = None,
    *,
    handcoded: bool = True,
    workers: int = 1,
    first_index: int = 0,
) -> list[Path]:
    """Write ``n`` games of ``split`` under ``out`` (families round-robin); returns folders.

    Game ``i`` depends only on (split, seed, first_index + i, room, family), so ``workers``
    processes write exactly the games one process would. ``handcoded``: see ``write_game``.
    ``room``: a `RoomSize` or its (receptacles, distractors).
    """
    room = RoomSize(*room) if isinstance(room, tuple) else room or RoomSize()
    families = families or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise GameGenerationError(
            f"unknown task family {unknown[0]!r}; choose from {list(FAMILIES)}"
        )
    if n < 1:
        raise GameGenerationError(f"--n must be >= 1, got {n}")
    scene_pool(split)  # fail loud on an unknown split before any work
    jobs = [
        (str(out), split, seed, first_index + i, room, families[i % len(families)], handcoded)
        for i in range(n)
    ]
    if workers <= 1 or n < 2 * workers:
        return [_generate_one(*job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # safe next to Ray and torch threads
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(_generate_one, *zip(*jobs, strict=True), chunksize=4))


def _generate_one(
    out: str, split: str, seed: int, index: int, room: RoomSize, family: str, handcoded: bool
) -> Path:
    """Game ``index`` of ``split``: the first sampled task whose plans win."""
    rng = random.Random(f"{split}:{seed}:{index}")  # seen and train never share a stream
    for attempt in range(200):
        num = rng.choice(scene_pool(split))
        if num not in _SCENES:  # read each scene's layout files once per process
            _SCENES[num] = load_scene(num)
        scene = _SCENES[num]
        key = f"{split}_{seed}_{index:05d}"
        spec = sample_task(family, scene, split, rng, room, key)
        if spec is None:
            continue
        try:
            return write_game(spec, split, Path(out), index, handcoded)
        except GameGenerationError:
            if attempt >= 5:
                raise
    raise GameGenerationError(f"no scene of split {split!r} can host family {family!r}")
