"""Sokoban rooms: gym-sokoban's own room generator, written as replayable task files.

Rooms are 6x6 with one box, verl-agent's text setting (``env.sokoban.dim_room=[6,6]``,
``num_boxes=1``). They come from gym-sokoban 0.0.6's ``room_utils.generate_room`` (random
walk topology, random placement, reverse play from the solved state), loaded straight from
the installed package's file so that ``gym_sokoban/__init__.py`` (which imports the
unmaintained ``gym`` and ``pkg_resources``) never runs. That generator draws from Python's
``random`` and numpy's global RNG; each room seeds both with its own sub-seed and restores
their states afterwards. verl-agent uses its own copy of ``room_utils`` with a shorter
reverse play (``search_depth=30``); this is the original (a 300-step reverse search).

Splits (``SPLIT_SETTINGS``):
- ``train`` and ``seen``: gym-sokoban's default walk for a 6x6 room (``num_steps =
  int(1.7 * (6 + 6)) = 20``, ``p_change_directions = 0.35``), from disjoint seeds (a room's
  RNG seed is ``3 * h + 0`` for train and ``3 * h + 1`` for seen, so no seed is shared);
- ``unseen``: other generator settings (``num_steps = 30``, ``p_change_directions = 0.7``),
  seeds ``3 * h + 2``: a longer, more winding walk carves more floor (~13.5 free cells of
  the 4x4 interior against ~10.7; 18% of rooms fully open against 3%) and leaves the box
  further from its target (mean optimal plan 4.5 moves against 3.2), so rooms are
  structurally different.

A 6x6 room has a 4x4 interior, so the room space is small: different seeds often give the
same room (~25% of train draws repeat an earlier one). Rooms are therefore also made
disjoint by content: a room's ``bucket`` (a hash of its codes, modulo 4) is 0 for seen, 1
for unseen and 2-3 for train, and a split skips a room outside its buckets or already
written. So no room is in two splits, and none is twice in one split.

A room is kept only if it is not solved at the start and the BFS (``envs.sokoban.solver``)
solves it within ``MAX_PLAN_MOVES`` (15, the episode's step budget). Families by the length
of the optimal plan (thresholds chosen so that a train batch splits roughly in thirds: 200
train rooms of seed 0 are 27% / 39% / 35%, seen 27% / 38% / 36%, unseen 17% / 32% / 51%):
``short`` = 1 move, ``medium`` = 2-4 moves, ``long`` = 5 or more moves.

A task file ``root/<split>/<family>/<id>.json`` holds ``room_fixed`` and ``room_state``
(gym-sokoban's codes: 0 wall, 1 floor, 2 target, 3 box on target, 4 box, 5 player), the
``box_mapping``, the generator settings, the sub-seed and the BFS-optimal ``plan``. Room
``i`` depends only on (split, seed, settings) and the rooms before it: the first sub-seed
of its own stream (seed, i, attempt) whose room passes the filters; so ``n`` rooms are the
first ``n`` of any larger batch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from envs.api import check_types
from envs.sokoban.grid import Room, RoomFormatError, State, from_codes
from envs.sokoban.solver import solve

SPLITS: tuple[str, ...] = ("train", "seen", "unseen")
ROOM_DIM = (6, 6)
NUM_BOXES = 1
MAX_PLAN_MOVES = 15  # the episode's step budget (verl-agent: max_steps 15 for Sokoban)
MAX_ATTEMPTS = 2000  # sub-seeds tried for one room before failing loud
BUCKETS = 4  # room-content buckets: seen 0, unseen 1, train 2-3
_SPLIT_BUCKETS = {"train": (2, 3), "seen": (0,), "unseen": (1,)}

FAMILIES: tuple[str, ...] = ("short", "medium", "long")
FAMILY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("short", "Short (1 move)"),
    ("medium", "Medium (2-4)"),
    ("long", "Long (5-15)"),
)
_SPLIT_OFFSET = {"train": 0, "seen": 1, "unseen": 2}


class RoomGenerationError(ValueError):
    """Bad generation arguments, or a generator that keeps failing (one-line message)."""


@dataclass(frozen=True)
class GeneratorSettings:
    """Arguments of gym-sokoban's ``generate_room`` (besides the fixed 6x6 size, 1 box)."""

    num_steps: int = 20  # gym-sokoban's default for 6x6: int(1.7 * (6 + 6))
    p_change_directions: float = 0.35  # generate_room's default
    tries: int = 4  # generate_room's default

    def check(self) -> None:
        """Fail loud on values the generator cannot use."""
        if self.num_steps < 1:
            raise RoomGenerationError(f"num_steps must be >= 1, got {self.num_steps}")
        if not 0.0 <= self.p_change_directions <= 1.0:
            raise RoomGenerationError(
                f"p_change_directions must be in [0, 1], got {self.p_change_directions}"
            )
        if self.tries < 1:
            raise RoomGenerationError(f"tries must be >= 1, got {self.tries}")


SPLIT_SETTINGS: dict[str, GeneratorSettings] = {
    "train": GeneratorSettings(),
    "seen": GeneratorSettings(),
    "unseen": GeneratorSettings(num_steps=30, p_change_directions=0.7),
}


def family_of_length(moves: int) -> str:
    """The family of an optimal plan of ``moves`` moves."""
    if moves <= 1:
        return "short"
    if moves <= 4:
        return "medium"
    return "long"


# --------------------------------------------------------------------------- generator

_ROOM_UTILS: ModuleType | None = None


def room_utils() -> ModuleType:
    """gym-sokoban's ``envs/room_utils.py``, loaded from the installed package's file
    without running ``gym_sokoban/__init__.py`` (no gym import)."""
    global _ROOM_UTILS
    if _ROOM_UTILS is None:
        found = importlib.util.find_spec("gym_sokoban")
        if found is None or not found.submodule_search_locations:
            raise RoomGenerationError("gym-sokoban is not installed (pip install gym-sokoban)")
        path = Path(next(iter(found.submodule_search_locations))) / "envs" / "room_utils.py"
        spec = importlib.util.spec_from_file_location("_gym_sokoban_room_utils", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise RoomGenerationError(f"cannot load gym-sokoban's room generator from {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _ROOM_UTILS = module
    return _ROOM_UTILS


def sub_seed(split: str, seed: int, index: int, attempt: int) -> int:
    """The RNG seed of one generation attempt: < 2**32, ``split``-residue modulo 3 (so
    the three splits never share a seed), a hash of (seed, index, attempt) otherwise."""
    digest = hashlib.sha256(f"sokoban:{seed}:{index}:{attempt}".encode()).digest()
    return 3 * (int.from_bytes(digest[:4], "big") >> 2) + _SPLIT_OFFSET[split]


def generate_room(settings: GeneratorSettings, room_seed: int) -> dict[str, Any]:
    """One room of gym-sokoban's generator under ``room_seed``, as lists.

    Seeds Python's ``random`` and numpy's global RNG (the generator uses both) and restores
    their states afterwards. Raises gym-sokoban's own RuntimeError / RuntimeWarning ("Not
    enough free spots", "score == 0") for the caller to move on to the next sub-seed.
    """
    import numpy as np

    utils = room_utils()
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        random.seed(room_seed)
        np.random.seed(room_seed)
        room_fixed, room_state, box_mapping = utils.generate_room(
            dim=ROOM_DIM,
            p_change_directions=settings.p_change_directions,
            num_steps=settings.num_steps,
            num_boxes=NUM_BOXES,
            tries=settings.tries,
            second_player=False,
        )
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return {
        "room_fixed": np.asarray(room_fixed).astype(int).tolist(),
        "room_state": np.asarray(room_state).astype(int).tolist(),
        "box_mapping": [
            [[int(t[0]), int(t[1])], [int(b[0]), int(b[1])]] for t, b in box_mapping.items()
        ],
    }


@dataclass(frozen=True)
class RoomTask:
    """One generated room with its optimal plan (the contents of a task file)."""

    split: str
    index: int
    seed: int
    room_seed: int
    attempt: int
    settings: GeneratorSettings
    room_fixed: list[list[int]]
    room_state: list[list[int]]
    box_mapping: list[list[list[int]]]
    plan: list[str]

    @property
    def family(self) -> str:
        return family_of_length(len(self.plan))

    @property
    def task_id(self) -> str:
        return f"{self.split}_{self.seed}_{self.index:05d}"

    def to_json(self) -> str:
        """The task file's text (sorted keys: same room, same bytes)."""
        data = asdict(self)
        data["family"] = self.family
        data["optimal_moves"] = len(self.plan)
        data["room"] = {"dim": list(ROOM_DIM), "num_boxes": NUM_BOXES}
        return json.dumps(data, sort_keys=True, ensure_ascii=False, indent=1) + "\n"


def room_key(arrays: dict[str, Any]) -> str:
    """A room's identity: its fixed and movable codes."""
    return json.dumps([arrays["room_fixed"], arrays["room_state"]], separators=(",", ":"))


def room_bucket(key: str) -> int:
    """The content bucket of a room (which split may hold it)."""
    return hashlib.sha256(key.encode()).digest()[0] % BUCKETS


def sample_room(
    split: str, seed: int, index: int, settings: GeneratorSettings, taken: set[str]
) -> RoomTask:
    """Room ``index`` of ``split``: the first sub-seed whose room is in the split's bucket,
    not in ``taken`` (rooms already written), not solved, and solvable in 15 moves.
    Adds the room to ``taken``."""
    for attempt in range(MAX_ATTEMPTS):
        room_seed = sub_seed(split, seed, index, attempt)
        try:
            arrays = generate_room(settings, room_seed)
        except (RuntimeError, RuntimeWarning):  # gym-sokoban's own "retry" errors
            continue
        key = room_key(arrays)
        if key in taken or room_bucket(key) not in _SPLIT_BUCKETS[split]:
            continue
        room, state = from_codes(arrays["room_fixed"], arrays["room_state"])
        plan = solve(room, state, max_moves=MAX_PLAN_MOVES)
        if not plan:  # unsolvable within the budget, or already solved
            continue
        taken.add(key)
        return RoomTask(split, index, seed, room_seed, attempt, settings, plan=plan, **arrays)
    raise RoomGenerationError(
        f"no new {split} room {index} in {MAX_ATTEMPTS} sub-seeds (settings {settings}): "
        f"the 6x6 one-box room space is nearly exhausted; ask for fewer rooms"
    )


def generate_rooms(
    root: str | os.PathLike,
    split: str,
    n: int,
    seed: int,
    *,
    num_steps: int | None = None,
    p_change_directions: float | None = None,
) -> list[Path]:
    """Write ``n`` rooms of ``split`` under ``root/<split>/<family>/``; returns their paths.

    ``num_steps`` / ``p_change_directions`` override the split's generator settings. The
    same arguments write byte-identical files (a file of the same name is overwritten).
    """
    if split not in SPLITS:
        raise RoomGenerationError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    if n < 1:
        raise RoomGenerationError(f"--n must be >= 1, got {n}")
    settings = SPLIT_SETTINGS[split]
    if num_steps is not None:
        settings = replace(settings, num_steps=num_steps)
    if p_change_directions is not None:
        settings = replace(settings, p_change_directions=p_change_directions)
    settings.check()
    paths, taken = [], set()
    for index in range(n):
        task = sample_room(split, seed, index, settings, taken)
        path = Path(root) / split / task.family / f"{task.task_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(task.to_json(), encoding="utf-8")
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- task files


@dataclass(frozen=True)
class TaskFile:
    """A task file read back: the room, its start state and the stored optimal plan."""

    path: str
    room: Room
    start: State
    plan: list[str]
    data: dict[str, Any]

    @property
    def family(self) -> str:
        return str(self.data.get("family") or family_of_length(len(self.plan)))


def load_task(path: str | os.PathLike) -> TaskFile:
    """Read a task file; ``RoomFormatError`` (a ValueError) if it is not one."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        room, start = from_codes(data["room_fixed"], data["room_state"])
        plan = [str(m) for m in data["plan"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, IndexError) as err:
        raise RoomFormatError(f"{file} is not a Sokoban task file: {err}") from None
    check_types(file, data, TASK_TYPES)
    return TaskFile(str(file), room, start, plan, data)


# a task file's other fields, as `seed games --env sokoban` writes them
TASK_TYPES: dict[str, type | tuple[type, ...]] = {
    "family": str, "index": int, "attempt": int, "seed": int, "room_seed": int, "split": str,
    "optimal_moves": int, "box_mapping": list, "room": dict, "settings": dict,
}  # fmt: skip


def list_tasks(root: str | os.PathLike, split: str | None = None) -> list[Path]:
    """Task files under ``root/<split>/`` (every split when None), sorted."""
    base = Path(root)
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    folders = [base / split] if split is not None else [base / s for s in SPLITS]
    present = [f for f in folders if f.is_dir()]
    if not present:
        raise ValueError(f"no Sokoban task folder {folders[0] if split else base}/<split>")
    for group in (g for folder in present for g in folder.iterdir() if g.is_dir()):
        if not any(group.glob("*.json")):
            raise RoomFormatError(f"{group}: a family folder without task files")
    tasks = sorted(p for folder in present for p in folder.glob("*/*.json"))
    for task in tasks:  # every room read before any episode
        load_task(task)
    return tasks


def task_family(task: str | os.PathLike) -> str:
    """The family of a task path (its folder's name)."""
    return Path(task).parent.name
