"""Sampling an offline ALFWorld task and writing its PDDL.

``sample_task`` picks a task of a family in a scene (object, receptacle or lamp, room content
and placements) as a ``TaskSpec``; ``build_problem`` writes its PDDL problem
(``initial_state.pddl``) and ``_traj_data`` its ``traj_data.json``, both in alfworld's
conventions. The scene side lives in ``envs.alfworld.scenes``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from envs.alfworld.scenes import (
    FAMILIES,
    SPLIT_DIRS,
    GameGenerationError,
    Scene,
    _can_hold,
    _constants,
    _pickupable,
    pairing_is_unseen,
)

# receptacle a state-change family needs, and which the target must not start in
_TOOL_RECEPTACLE = {"clean": "SinkBasin", "heat": "Microwave", "cool": "Fridge"}
_TOOL_PROPERTY = {"clean": "Cleanable", "heat": "Heatable", "cool": "Coolable"}
_LAMPS = ("DeskLamp", "FloorLamp")
_LAMP_HOLDERS = {"Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand"}


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


def _fmt_coord(rng: random.Random) -> str:
    value = rng.uniform(-3.0, 3.0)
    return f"{value:+06.2f}"


def _object_id(otype: str, rng: random.Random, taken: set[str]) -> str:
    while True:
        oid = f"{otype}|{_fmt_coord(rng)}|{_fmt_coord(rng)}|{_fmt_coord(rng)}"
        if oid not in taken:
            taken.add(oid)
            return oid


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


def describe(spec: TaskSpec) -> dict[str, Any]:
    """A JSON-friendly view of a spec (for logs and tests)."""
    return asdict(spec)
