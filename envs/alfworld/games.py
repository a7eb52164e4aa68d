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
"""

from __future__ import annotations

import json
import os
import random
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# family -> ALFWorld task type (the paper's six families)
FAMILIES: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick2": "pick_two_obj_and_place",
}
TASK_TYPE_TO_FAMILY: dict[str, str] = {v: k for k, v in FAMILIES.items()}
SPLIT_DIRS: dict[str, str] = {"train": "train", "seen": "valid_seen", "unseen": "valid_unseen"}

# receptacle a state-change family needs, and which the target must not start in
_TOOL_RECEPTACLE = {"clean": "SinkBasin", "heat": "Microwave", "cool": "Fridge"}
_TOOL_PROPERTY = {"clean": "Cleanable", "heat": "Heatable", "cool": "Coolable"}
_LAMPS = ("DeskLamp", "FloorLamp")
_LAMP_HOLDERS = {"Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand"}
# one pairing in this many is reserved for the unseen split
_UNSEEN_PAIR_MODULUS = 4


class GameGenerationError(ValueError):
    """A game could not be generated (bad arguments or no feasible task)."""


@dataclass(frozen=True)
class RoomSize:
    """Room-size knob: receptacles in the room and distractor objects placed in it."""

    n_receptacles: int = 5
    n_distractors: int = 2

    def __post_init__(self) -> None:
        if self.n_receptacles < 3 or self.n_distractors < 0:
            raise GameGenerationError(
                f"room size needs n_receptacles >= 3 and n_distractors >= 0, got {self}"
            )


@dataclass
class Scene:
    """One ALFWorld scene layout: receptacle ids -> (type, location), object types present."""

    num: int
    receptacles: dict[str, tuple[str, tuple[int, int, int, int]]]
    object_types: list[str]

    def receptacle_types(self) -> set[str]:
        return {t for t, _ in self.receptacles.values()}


@dataclass
class TaskSpec:
    """A sampled game before it is written: task, room content and placements."""

    family: str
    scene: int
    object_target: str
    parent_target: str  # "" for look
    toggle_target: str  # "" unless look
    receptacles: dict[str, tuple[str, tuple[int, int, int, int]]]
    objects: dict[str, tuple[str, str]]  # object id -> (type, receptacle id)
    agent_location: tuple[int, int, int, int]
    goal_desc: str
    seed_key: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def task_type(self) -> str:
        return FAMILIES[self.family]


def _alfworld_paths() -> tuple[Path, Path, Path]:
    import alfworld.gen.constants as constants
    import alfworld.info

    layouts = Path(constants.__file__).parent / "layouts"
    return Path(alfworld.info.ALFRED_PDDL_PATH), Path(alfworld.info.ALFRED_TWL2_PATH), layouts


def _constants():
    import alfworld.gen.constants as constants

    return constants


def _receptacle_type(receptacle_id: str) -> str:
    parts = receptacle_id.split("|")
    return parts[-1] if len(parts) > 4 else parts[0]


def load_scene(num: int) -> Scene:
    """Read scene ``FloorPlan<num>`` from alfworld's shipped layouts."""
    _, _, layouts = _alfworld_paths()
    constants = _constants()
    objects_path = layouts / f"FloorPlan{num}-objects.json"
    points_path = layouts / f"FloorPlan{num}-openable.json"
    if not objects_path.exists() or not points_path.exists():
        raise GameGenerationError(f"alfworld ships no layout for scene FloorPlan{num}")
    points = json.loads(points_path.read_text())
    receptacles: dict[str, tuple[str, tuple[int, int, int, int]]] = {}
    used: set[tuple[int, int, int, int]] = set()
    for rid in sorted(points):
        rtype = _receptacle_type(rid)
        if rtype not in constants.RECEPTACLES or rtype in constants.MOVABLE_RECEPTACLES_SET:
            continue
        x, z, rot, horizon = points[rid]
        loc = (round(x / constants.AGENT_STEP_SIZE), round(z / constants.AGENT_STEP_SIZE))
        loc4 = (loc[0], loc[1], round(rot / 90) % 4, round(horizon))
        # Two receptacles reached from one point would share one "go to" command; keep the
        # locations distinct (the horizon field is unused by the text engine).
        while loc4 in used:
            loc4 = (loc4[0], loc4[1], loc4[2], loc4[3] + 1)
        used.add(loc4)
        receptacles[rid] = (rtype, loc4)
    object_types = sorted(set(json.loads(objects_path.read_text())))
    return Scene(num=num, receptacles=receptacles, object_types=object_types)


def _pickupable() -> set[str]:
    constants = _constants()
    items = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values())
    return {o for o in items if not o.endswith("Sliced")}


def pairing_is_unseen(obj: str, partner: str) -> bool:
    """Whether the (object, receptacle-or-lamp) pairing is reserved for the unseen split."""
    key = f"{obj.lower()}|{partner.lower()}".encode()
    return zlib.crc32(key) % _UNSEEN_PAIR_MODULUS == 0


def _fmt_coord(rng: random.Random) -> str:
    value = rng.uniform(-3.0, 3.0)
    return f"{value:+06.2f}"


def _object_id(otype: str, rng: random.Random, taken: set[str]) -> str:
    while True:
        oid = f"{otype}|{_fmt_coord(rng)}|{_fmt_coord(rng)}|{_fmt_coord(rng)}"
        if oid not in taken:
            taken.add(oid)
            return oid


def _can_hold(rtype: str, otype: str) -> bool:
    return otype in _constants().VAL_RECEPTACLE_OBJECTS.get(rtype, set())


def _candidates(family: str, scene: Scene, split: str) -> list[tuple[str, str]]:
    """Feasible (object, parent-or-lamp) pairs of a family in a scene for a split."""
    constants = _constants()
    rtypes = scene.receptacle_types()
    objs = [o for o in scene.object_types if o in _pickupable()]
    want_unseen = split == "unseen"
    pairs: list[tuple[str, str]] = []
    if family == "look":
        holders = rtypes & _LAMP_HOLDERS
        lamps = [lamp for lamp in _LAMPS if lamp in scene.object_types]
        if not holders:
            return []
        pairs = [(o, lamp) for o in objs for lamp in lamps if any(_can_hold(r, o) for r in rtypes)]
    else:
        tool = _TOOL_RECEPTACLE.get(family)
        if tool is not None and tool not in rtypes:
            return []
        for o in objs:
            if tool is not None and o not in constants.VAL_ACTION_OBJECTS[_TOOL_PROPERTY[family]]:
                continue
            for r in sorted(rtypes):
                if r == tool or not _can_hold(r, o):
                    continue
                # the target must start somewhere other than the goal receptacle type
                sources = [t for t in rtypes if t != r and t != tool and _can_hold(t, o)]
                if sources:
                    pairs.append((o, r))
    return [p for p in pairs if pairing_is_unseen(*p) == want_unseen]


def _goal_desc(family: str, obj: str, recep: str, toggle: str, rng: random.Random) -> str:
    import alfworld.gen.goal_library as glib

    template = rng.choice(glib.gdict[FAMILIES[family]]["templates"])
    return template.format(obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep="")


def sample_task(
    family: str, scene: Scene, split: str, rng: random.Random, room: RoomSize, seed_key: str
) -> TaskSpec | None:
    """Sample one game of ``family`` in ``scene``; None if the scene cannot host it."""
    pairs = _candidates(family, scene, split)
    if not pairs:
        return None
    obj, partner = rng.choice(sorted(pairs))
    by_type: dict[str, list[str]] = {}
    for rid, (rtype, _) in scene.receptacles.items():
        by_type.setdefault(rtype, []).append(rid)
    chosen: list[str] = []

    def add(rid: str) -> None:
        if rid not in chosen:
            chosen.append(rid)

    parent, toggle = ("", partner) if family == "look" else (partner, "")
    if family == "look":
        holder_types = sorted(set(by_type) & _LAMP_HOLDERS)
        lamp_holder = rng.choice(by_type[rng.choice(holder_types)])
        add(lamp_holder)
        forbidden_source_types: set[str] = set()
    else:
        add(rng.choice(by_type[parent]))
        forbidden_source_types = {parent}
        tool = _TOOL_RECEPTACLE.get(family)
        if tool is not None:
            add(rng.choice(by_type[tool]))
            forbidden_source_types.add(tool)
    sources = [
        rid
        for rid, (rtype, _) in scene.receptacles.items()
        if rtype not in forbidden_source_types and _can_hold(rtype, obj)
    ]
    if not sources:
        return None
    n_targets = 2 if family == "pick2" else 1
    target_homes = [rng.choice(sources) for _ in range(n_targets)]
    for rid in target_homes:
        add(rid)
    others = sorted(set(scene.receptacles) - set(chosen))
    rng.shuffle(others)
    while len(chosen) < max(room.n_receptacles, len(chosen)) and others:
        add(others.pop())
    receptacles = {rid: scene.receptacles[rid] for rid in chosen}

    taken: set[str] = set()
    objects: dict[str, tuple[str, str]] = {}
    for rid in target_homes:
        objects[_object_id(obj, rng, taken)] = (obj, rid)
    if family == "look":
        objects[_object_id(toggle, rng, taken)] = (toggle, lamp_holder)
    distractor_types = [
        o
        for o in scene.object_types
        if o in _pickupable() and o != obj and any(_can_hold(t, o) for t, _ in receptacles.values())
    ]
    for _ in range(room.n_distractors):
        if not distractor_types:
            break
        dtype = rng.choice(distractor_types)
        homes = [rid for rid, (t, _) in receptacles.items() if _can_hold(t, dtype)]
        objects[_object_id(dtype, rng, taken)] = (dtype, rng.choice(homes))

    used_locs = {loc for _, loc in receptacles.values()}
    while True:
        agent = (rng.randint(-12, 12), rng.randint(-12, 12), rng.randint(0, 3), 30)
        if agent not in used_locs:
            break
    return TaskSpec(
        family=family,
        scene=scene.num,
        object_target=obj,
        parent_target=parent,
        toggle_target=toggle,
        receptacles=receptacles,
        objects=objects,
        agent_location=agent,
        goal_desc=_goal_desc(family, obj, parent, toggle, rng),
        seed_key=seed_key,
    )


def _fix_pddl_chars(text: str) -> str:
    # the same character mangling alfworld's generator applies to THOR ids
    for old, new in (
        ("-", "_minus_"),
        ("#", "-"),
        ("|", "_bar_"),
        ("+", "_plus_"),
        (".", "_dot_"),
        (",", "_comma_"),
    ):
        text = text.replace(old, new)
    return text


def _loc_name(loc: tuple[int, int, int, int]) -> str:
    return "loc|{}|{}|{}|{}".format(*loc)


def build_problem(spec: TaskSpec) -> str:
    """The PDDL problem (``initial_state.pddl``) of a sampled game, alfworld's conventions."""
    import alfworld.gen.goal_library as glib

    constants = _constants()
    objs = spec.objects
    otypes = {t for t, _ in objs.values()} | {spec.object_target}
    if spec.toggle_target:
        otypes.add(spec.toggle_target)
    rtypes = {t for t, _ in spec.receptacles.values()}
    if spec.parent_target:
        rtypes.add(spec.parent_target)
    locations = [loc for _, loc in spec.receptacles.values()] + [spec.agent_location]

    decl = ["agent1 # agent"]
    decl += [f"{t}Type # otype" for t in sorted(otypes)]
    decl += [f"{t}Type # rtype" for t in sorted(rtypes)]
    decl += [f"{oid} # object" for oid in sorted(objs)]
    decl += [f"{rid} # receptacle" for rid in sorted(spec.receptacles)]
    decl += [f"{_loc_name(loc)} # location" for loc in locations]

    facts = [f"(atLocation agent1 {_loc_name(spec.agent_location)})"]
    for rid, (rtype, loc) in sorted(spec.receptacles.items()):
        facts.append(f"(receptacleType {rid} {rtype}Type)")
        facts.append(f"(receptacleAtLocation {rid} {_loc_name(loc)})")
        if rtype in constants.OPENABLE_CLASS_SET:
            facts.append(f"(openable {rid})")
    for rtype in sorted(rtypes):
        for otype in sorted(otypes):
            if _can_hold(rtype, otype):
                facts.append(f"(canContain {rtype}Type {otype}Type)")
    for oid, (otype, rid) in sorted(objs.items()):
        facts.append(f"(objectType {oid} {otype}Type)")
        facts.append(f"(inReceptacle {oid} {rid})")
        if otype in _LAMPS:
            facts.append(f"(toggleable {oid})")
        else:
            facts.append(f"(pickupable {oid})")
        if otype in constants.MOVABLE_RECEPTACLES_SET:
            facts.append(f"(isReceptacleObject {oid})")
        for prop, pred in (
            ("Cleanable", "cleanable"),
            ("Heatable", "heatable"),
            ("Coolable", "coolable"),
            ("Sliceable", "sliceable"),
        ):
            if otype in constants.VAL_ACTION_OBJECTS[prop]:
                facts.append(f"({pred} {oid})")

    goal = glib.gdict[spec.task_type]["pddl"].format(
        obj=spec.object_target,
        recep=spec.parent_target,
        toggle=spec.toggle_target,
        mrecep="",
    )
    head = f"\n(define (problem plan_{spec.seed_key})\n(:domain alfred)\n(:objects\n"
    body = "\n        ".join(decl) + "\n        )\n"
    init = "(:init\n        " + "\n        ".join(facts) + "\n        )\n"
    return _fix_pddl_chars(head + "        " + body + init) + _fix_pddl_chars(goal)


def _traj_data(spec: TaskSpec, split: str) -> dict[str, Any]:
    return {
        "task_id": f"trial_{spec.seed_key}",
        "task_type": spec.task_type,
        "split": SPLIT_DIRS[split],
        "pddl_params": {
            "object_target": spec.object_target,
            "parent_target": spec.parent_target,
            "toggle_target": spec.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "scene": {"floor_plan": f"FloorPlan{spec.scene}", "scene_num": spec.scene},
        "turk_annotations": {"anns": [{"task_desc": spec.goal_desc, "high_descs": []}]},
        "seed_generator": {
            "family": spec.family,
            "n_receptacles": len(spec.receptacles),
            "n_objects": len(spec.objects),
            "seed_key": spec.seed_key,
        },
    }


def _play(gamefile: str, expert: str, max_steps: int = 100) -> tuple[list[str], bool]:
    """Play a game with alfworld's expert (``planner`` or ``handcoded``) on its wrappers."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredInfos,
    )
    from textworld.envs import PddlEnv

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


def scene_pool(split: str) -> list[int]:
    """ALFWorld's train scenes for train/seen, its test scenes for unseen."""
    constants = _constants()
    if split not in SPLIT_DIRS:
        raise GameGenerationError(f"unknown split {split!r}; choose from {', '.join(SPLIT_DIRS)}")
    return list(
        constants.TEST_SCENE_NUMBERS if split == "unseen" else constants.TRAIN_SCENE_NUMBERS
    )


def generate_games(
    out: str | os.PathLike,
    split: str,
    n: int,
    seed: int,
    room: RoomSize | None = None,
    families: list[str] | None = None,
    *,
    handcoded: bool = True,
    workers: int = 1,
    first_index: int = 0,
) -> list[Path]:
    """Write ``n`` games of ``split`` under ``out`` (families round-robin); returns folders.

    Game ``i`` depends only on (split, seed, first_index + i, room, family), so ``workers``
    processes write exactly the games one process would. ``handcoded``: see ``write_game``.
    """
    room = room or RoomSize()
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


_SCENES: dict[int, Scene] = {}


def _generate_one(
    out: str, split: str, seed: int, index: int, room: RoomSize, family: str, handcoded: bool
) -> Path:
    """Game ``index`` of ``split``: the first sampled task whose plans win."""
    rng = random.Random(f"{split}:{seed}:{index}")  # seen and train never share a stream
    for attempt in range(200):
        num = rng.choice(scene_pool(split))
        scene = _SCENES.setdefault(num, load_scene(num))
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


def describe(spec: TaskSpec) -> dict[str, Any]:
    """A JSON-friendly view of a spec (for logs and tests)."""
    return asdict(spec)
