"""ALFWorld on the real engine: TextWorld's PDDL environment with alfworld's own wrappers.

``AlfWorldEnv`` plays one game folder (or ``game.tw-pddl`` file) at a time through
``textworld.envs.PddlEnv`` wrapped by alfworld's ``AlfredDemangler`` and ``AlfredInfos``,
exactly as ``alfworld-generate`` and ``AlfredTWEnv`` do. Observations and feedback strings are
the engine's; the only edits: the "-= Welcome to TextWorld, ALFRED! =-" banner is dropped, and
the first observation's "Your task is to: ..." line moves to ``info["task"]`` (the goal).

Official data (json_2.1.1: ``train``, ``valid_seen`` 140, ``valid_unseen`` 134) and games
written by ``seed games`` share one layout, so ``find_games`` lists both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from envs.alfworld import textgen_memo
from envs.alfworld.games import FAMILIES, SPLIT_DIRS, TASK_TYPE_TO_FAMILY
from envs.api import MAX_ACTION_CHARS, sanitize_action

DEFAULT_MAX_STEPS = 30  # the paper's ALFWorld episode budget (Table 5)
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
_TASK_PREFIX = "Your task is to: "


class GameFormatError(ValueError):
    """A game folder or file that alfworld cannot play."""


def resolve_game(game: str | os.PathLike) -> Path:
    """A game folder or its ``game.tw-pddl`` -> the ``game.tw-pddl`` path (checked)."""
    path = Path(game)
    gamefile = path / "game.tw-pddl" if path.is_dir() else path
    if not gamefile.is_file():
        raise GameFormatError(f"no game.tw-pddl at {path}")
    try:
        data = json.loads(gamefile.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise GameFormatError(f"{gamefile} is not JSON: {err}") from err
    missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if k not in data]
    if not isinstance(data, dict) or missing:
        raise GameFormatError(f"{gamefile} lacks {', '.join(missing) or 'a JSON object'}")
    traj = gamefile.parent / "traj_data.json"
    if traj.is_file():
        task_type = json.loads(traj.read_text()).get("task_type")
        if task_type not in TASK_TYPE_TO_FAMILY:
            raise GameFormatError(f"{traj}: unknown task type {task_type!r}")
    return gamefile


def find_games(root: str | os.PathLike, split: str | None = None) -> list[Path]:
    """Solvable games under ``root`` (a json_2.1.1-style folder), sorted.

    ``split`` is ``train``/``seen``/``unseen`` (or the folder names ``valid_seen``/...).
    Skips games marked unsolvable and movable/sliced tasks, as ``AlfredTWEnv`` does.
    """
    base = Path(root)
    if split is not None:
        base = base / SPLIT_DIRS.get(split, split)
    if not base.is_dir():
        raise GameFormatError(f"no game folder {base}")
    # a trial folder without game.tw-pddl is no game (the original json_2.1.1 data has such
    # trials; alfworld's own loader skips them too)
    games = []
    for gamefile in sorted(base.rglob("game.tw-pddl")):
        if "movable" in str(gamefile) or "Sliced" in str(gamefile):
            continue
        if _checked_game(gamefile).get("solvable") is False:
            continue
        games.append(gamefile.parent)
    return games


# what a game folder's two JSON files must hold (the rest is alfworld's and passes)
_FIELDS = {
    "game": {"pddl_domain": str, "pddl_problem": str, "grammar": str},
    # ALFRED's traj_data.json fields the loaders read ("split" is only this project's)
    "traj": {"task_id": str, "task_type": str, "pddl_params": dict, "scene": dict},
}


def _checked_game(gamefile: Path) -> dict:
    """The game file's JSON, checked with its folder's traj_data.json: `GameFormatError`
    naming the file that is cut short, of another JSON type, missing, or lacks a field. A
    game already checked, unchanged since, is not read again (`_CHECKED`)."""
    stamp = _stamp(gamefile)
    if stamp in _CHECKED:
        return _CHECKED[stamp]
    _CHECKED[stamp] = _read_game(gamefile)
    return _CHECKED[stamp]


# (path, size, mtime) of a game file and its traj_data.json -> the game's "solvable" field
_CHECKED: dict[tuple, dict] = {}


def _stamp(gamefile: Path) -> tuple:
    traj = gamefile.parent / "traj_data.json"
    return tuple(
        (str(f), st.st_size, st.st_mtime_ns)
        for f in (gamefile, traj)
        if (st := f.stat() if f.exists() else None) is not None
    )


def _read_game(gamefile: Path) -> dict:
    files = {"game": gamefile, "traj": gamefile.parent / "traj_data.json"}
    data = {}
    for key, path in files.items():
        try:
            data[key] = json.loads(path.read_text())
        except FileNotFoundError:
            raise GameFormatError(f"{path.parent}: no {path.name}") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise GameFormatError(f"{path}: not JSON ({err})") from None
        if not isinstance(data[key], dict):
            raise GameFormatError(f"{path}: a JSON object expected, got {type(data[key]).__name__}")
    for key, fields in _FIELDS.items():
        for field, kind in fields.items():
            if not isinstance(data[key].get(field), kind):
                raise GameFormatError(f"{files[key]}: {field} missing or not a {kind.__name__}")
    if not isinstance(data["traj"].get("split", ""), str):  # `seed games` writes it; ALFRED not
        raise GameFormatError(f"{files['traj']}: split is not a string")
    if not isinstance(data["game"].get("solvable", True), bool):
        raise GameFormatError(f"{gamefile}: solvable is not true or false")
    if data["traj"].get("task_type") not in TASK_TYPE_TO_FAMILY:
        raise GameFormatError(
            f"{files['traj']}: task_type {data['traj'].get('task_type')!r:.40} is none of "
            f"{sorted(TASK_TYPE_TO_FAMILY)}"
        )
    return {"solvable": data["game"].get("solvable")}


def game_family(game: str | os.PathLike) -> str:
    """The task family (pick, look, clean, heat, cool, pick2) of a game folder."""
    gamefile = resolve_game(game)
    task_type = json.loads((gamefile.parent / "traj_data.json").read_text())["task_type"]
    return TASK_TYPE_TO_FAMILY[task_type]


def expert_plan(game: str | os.PathLike, kind: str = "planner") -> list[str]:
    """The stored expert plan of a game: ``planner`` (walkthrough) or ``handcoded``."""
    data = json.loads(resolve_game(game).read_text())
    key = {"planner": "walkthrough", "handcoded": "handcoded_walkthrough"}[kind]
    plan = data.get(key)
    if plan is None:
        raise GameFormatError(f"{game} has no stored {kind} plan")
    return list(plan)


class AlfWorldEnv:
    """One ALFWorld episode at a time on the real engine (implements ``envs.api.Env``)."""

    def __init__(
        self,
        max_steps: int = DEFAULT_MAX_STEPS,
        drop_help: bool = True,
        max_action_chars: int = MAX_ACTION_CHARS,
    ) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv

        textgen_memo.install()  # each template parsed once per process, not at every step
        infos = textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self.max_steps = max_steps
        self.drop_help = drop_help
        self.max_action_chars = max_action_chars
        self._steps = 0
        self._done = True
        self._task = ""
        self._gamefile: Path | None = None
        self._family = ""

    def reset(self, game: str | os.PathLike) -> tuple[str, dict[str, Any]]:
        """Load ``game`` (folder or game.tw-pddl) and start an episode."""
        gamefile = resolve_game(game)
        try:
            self._env.load(str(gamefile))
            state = self._env.reset()
        except Exception as err:  # the engine's own parse/grounding errors
            raise GameFormatError(f"alfworld cannot load {gamefile}: {err}") from err
        self._gamefile = gamefile
        self._steps = 0
        self._done = False
        traj = gamefile.parent / "traj_data.json"
        task_type = json.loads(traj.read_text())["task_type"] if traj.is_file() else ""
        self._family = TASK_TYPE_TO_FAMILY.get(task_type, "")
        text = state.feedback.replace(_BANNER, "").strip()
        self._task = ""
        kept = []
        for line in text.splitlines():
            if line.startswith(_TASK_PREFIX):
                self._task = line[len(_TASK_PREFIX) :].strip().rstrip(".")
            else:
                kept.append(line)
        # the goal travels in info["task"]; the observation is the room
        return "\n".join(kept).strip(), self._info(state, truncated=False)

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One action; invalid text gets the engine's own "Nothing happens."."""
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset()")
        action = sanitize_action(action_text, self.max_action_chars)
        state, _, _ = self._env.step(action)
        self._steps += 1
        won = bool(state["won"])
        truncated = not won and self._steps >= self.max_steps
        self._done = won or truncated
        reward = 1.0 if won else 0.0
        return state.feedback.strip(), reward, self._done, self._info(state, truncated)

    def _info(self, state: Any, truncated: bool) -> dict[str, Any]:
        admissible = list(state["admissible_commands"])
        if self.drop_help:
            admissible = [a for a in admissible if a != "help"]
        return {
            "won": bool(state["won"]),
            "admissible_actions": admissible,
            "task": self._task,
            "family": self._family,
            "gamefile": str(self._gamefile),
            "step": self._steps,
            "truncated": truncated,
        }


__all__ = [
    "DEFAULT_MAX_STEPS",
    "FAMILIES",
    "AlfWorldEnv",
    "GameFormatError",
    "expert_plan",
    "find_games",
    "game_family",
    "resolve_game",
]
