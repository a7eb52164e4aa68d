"""What the offline ALFWorld game generator reads from the `alfworld` package's shipped files.

The family/task-type and split tables, the error the generator raises, the scene layouts
(``gen/layouts/FloorPlan*-{objects,openable}.json``) read into ``Scene``, the object/receptacle
constants (``gen/constants.py``), the split's scene pool, and the fixed hash that reserves
pairings for the unseen split. Sampling tasks lives in ``envs.alfworld.tasks``, writing and
playing games in ``envs.alfworld.games``.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

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

# one pairing in this many is reserved for the unseen split
_UNSEEN_PAIR_MODULUS = 4


class GameGenerationError(ValueError):
    """A game could not be generated (bad arguments or no feasible task)."""


@dataclass
class Scene:
    """One ALFWorld scene layout: receptacle ids -> (type, location), object types present."""

    num: int
    receptacles: dict[str, tuple[str, tuple[int, int, int, int]]]
    object_types: list[str]

    def receptacle_types(self) -> set[str]:
        return {t for t, _ in self.receptacles.values()}


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


def _can_hold(rtype: str, otype: str) -> bool:
    return otype in _constants().VAL_RECEPTACLE_OBJECTS.get(rtype, set())


def scene_pool(split: str) -> list[int]:
    """ALFWorld's train scenes for train/seen, its test scenes for unseen."""
    constants = _constants()
    if split not in SPLIT_DIRS:
        raise GameGenerationError(f"unknown split {split!r}; choose from {', '.join(SPLIT_DIRS)}")
    return list(
        constants.TEST_SCENE_NUMBERS if split == "unseen" else constants.TRAIN_SCENE_NUMBERS
    )


# scenes read so far, by scene number (shared by the games of one process)
_SCENES: dict[int, Scene] = {}
