"""What environments and the library share; this module imports nothing of the project.

An environment (``envs/<name>/``) speaks `Env` and describes itself with an `EnvSpec`: its
engine, tasks, prompt styles, action parser, rollout budgets and optional plug-ins (expert,
oracle, demonstration players, task command), all typed objects. Its oracle reads finished
episodes through `EpisodeFacts` (a `TrajectoryRecord` is one) and the readers below.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# Longest action text passed to an engine; ALFWorld's longest command is ~60 characters.
MAX_ACTION_CHARS = 256

_WHITESPACE = re.compile(r"\s+")


def one_line(text: str) -> str:
    """Whitespace collapsed to single spaces."""
    return " ".join(text.split())


def sanitize_action(text: str | None, max_chars: int = MAX_ACTION_CHARS) -> str:
    """Drop control characters, collapse whitespace, cap the length.

    Control characters (Unicode category C*, e.g. NUL, ESC, zero-width) are removed; tabs and
    newlines become spaces first so that words stay separated.
    """
    if not text:
        return ""
    text = text.replace("\t", " ").replace("\n", " ").replace("\r", " ")
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("C"))
    return _WHITESPACE.sub(" ", text).strip()[:max_chars]


# ---------------------------------------------------------------------------- episodes


@runtime_checkable
class Env(Protocol):
    """One episode at a time. ``info`` always carries ``won``; where the environment has
    them, ``admissible_actions`` (list[str]) and ``task`` (the goal text)."""

    def reset(self, game: str) -> tuple[str, dict[str, Any]]:
        """Start an episode of ``game``; returns the first observation and info."""
        ...

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one action; returns observation, reward, done, info."""
        ...


class EpisodeStatus(str, enum.Enum):
    """How an episode stands (carried by every StepResult)."""

    RUNNING = "running"
    WON = "won"
    TRUNCATED = "truncated"  # hit max_steps without winning
    RECOVERED = "recovered"  # its worker died; replayed on a fresh worker, still running
    ERROR = "error"  # could not be continued (worker died twice, bad game): reported, done


@dataclass
class StepResult:
    """What one episode returns from a reset or a step."""

    episode_id: int
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    status: EpisodeStatus = EpisodeStatus.RUNNING
    error: str | None = None

    @property
    def won(self) -> bool:
        return bool(self.info.get("won", False))


def status_of(done: bool, info: dict[str, Any]) -> EpisodeStatus:
    """Status from the env's own done/info."""
    if info.get("won"):
        return EpisodeStatus.WON
    if done:
        return EpisodeStatus.TRUNCATED
    return EpisodeStatus.RUNNING


class BatchedEnv:
    """Many episodes in this process, one env per episode (tests, tiny runs)."""

    def __init__(self, make_env: Callable[[], Env]) -> None:
        self._make_env = make_env
        self._envs: dict[int, Env] = {}

    def reset(self, games: Sequence[str]) -> list[StepResult]:
        """Start one episode per game; episode ids are positions in ``games``."""
        self._envs = {}
        results = []
        for episode_id, game in enumerate(games):
            env = self._make_env()
            self._envs[episode_id] = env
            observation, info = env.reset(game)
            results.append(StepResult(episode_id, observation, 0.0, False, info))
        return results

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Step the given episodes; returns their results keyed by episode id."""
        out = {}
        for episode_id, action in actions.items():
            observation, reward, done, info = self._envs[episode_id].step(action)
            out[episode_id] = StepResult(
                episode_id, observation, reward, done, info, status_of(done, info)
            )
        return out


# ---------------------------------------------------------------------------- prompts

History = Sequence[tuple[str, str]]  # an episode's (observation, action) pairs, oldest first
Admissible = Sequence[str] | None  # the admissible actions; None: the environment lists none


class PromptStyle(Protocol):
    """The actor prompt of one style: a system prompt and three renderers."""

    system_prompt: str | None

    def lists_admissible(self, step: int, history_mode: str) -> bool:
        """Whether the prompt before action ``step`` shows the admissible actions."""
        ...

    def first(self, goal: str, observation: str, admissible: Sequence[str] | None) -> str:
        """The first user message (holds the task line)."""
        ...

    def step(self, step: int, observation: str, admissible: Sequence[str] | None) -> str:
        """A later user message of a full-history chat (``step`` actions taken so far)."""
        ...

    def window(
        self, goal: str, history: History, observation: str, step: int, admissible: Admissible
    ) -> str:
        """One user message holding the last k (observation, action) pairs."""
        ...


@dataclass(frozen=True)
class Prompts:
    """A `PromptStyle` made of plain functions (what most environments need).

    The first prompt and every windowed prompt list the admissible actions; a later
    full-history prompt (`step`) does when `step_lists_admissible`.
    """

    system_prompt: str | None
    first: Callable[[str, str, Sequence[str] | None], str]
    step: Callable[[int, str, Sequence[str] | None], str]
    window: Callable[..., str]
    step_lists_admissible: bool = True

    def lists_admissible(self, step: int, history_mode: str) -> bool:
        """Whether the prompt before action ``step`` shows the admissible actions."""
        return step == 0 or history_mode == "window" or self.step_lists_admissible


def task_files(
    root: str | Path, split: str | None, is_split: Callable[[Path], bool] = Path.is_dir
) -> list[Path]:
    """Task files laid out as ``root/<split>/<group>/*.json``, sorted: those of ``split``, or
    of every folder of ``root`` that ``is_split`` accepts when ``split`` is None; a one-line
    ``ValueError`` when the split's folder or ``root`` is missing."""
    base = Path(root)
    if split is not None:
        folder = base / split
        if not folder.is_dir():
            raise ValueError(f"no {split!r} split in {base} (no folder {folder})")
        return sorted(folder.glob("*/*.json"))
    if not base.is_dir():
        raise ValueError(f"no task folder {base}")
    return sorted(p for d in base.iterdir() if is_split(d) for p in d.glob("*/*.json"))


class TaskFileError(ValueError):
    """A task folder or file that is not what its environment writes (one line naming it)."""


def check_types(path: Path, data: Any, types: Mapping[str, type | tuple[type, ...]]) -> None:
    """``data`` (a task file's JSON) is an object whose fields named in ``types`` hold values
    of those types where present and not null; `TaskFileError` naming the file and field."""
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: a JSON object expected, got {type(data).__name__}")
    for key, kind in types.items():
        value = data.get(key)
        wrong = isinstance(value, bool) and bool not in (
            kind if isinstance(kind, tuple) else (kind,)
        )
        if value is not None and (wrong or not isinstance(value, kind)):
            raise TaskFileError(f"{path}: {key} is {value!r:.40}, of the wrong type")


def checked_task_files(
    root: str | Path,
    split: str | None,
    load: Callable[[Path], Any],
    is_split: Callable[[Path], bool] = Path.is_dir,
) -> list[Path]:
    """`task_files`, each read with ``load`` (the environment's checked reader) before any
    episode, and no group folder without task files (a file deleted from a split)."""
    files = task_files(root, split, is_split)
    base = Path(root)
    splits = [base / split] if split is not None else [d for d in base.iterdir() if is_split(d)]
    for group in (g for s in splits if _shown(s) for g in s.iterdir() if _shown(g)):
        if group.is_dir() and not any(group.glob("*.json")):
            raise TaskFileError(f"{group}: a task group folder without task files")
    for path in files:
        stat = path.stat()
        stamp = (str(path), stat.st_size, stat.st_mtime_ns)
        if stamp not in _CHECKED:  # a file checked before and unchanged is not read again
            load(path)
            _CHECKED.add(stamp)
    return files


_CHECKED: set[tuple[str, int, int]] = set()  # (path, size, mtime) of task files read whole


def _shown(folder: Path) -> bool:
    """Not a hidden folder (``.git``, ``.ipynb_checkpoints``): never a split or a group."""
    return not folder.name.startswith(".")


def choose_style(styles: Mapping[str, Prompts], name: str) -> Prompts:
    """``styles[name]`` (an environment's ``prompts``); a one-line error naming the others."""
    if name not in styles:
        raise ValueError(f"unknown prompt style {name!r}; choose from {sorted(styles)}")
    return styles[name]


def user_message(
    style: PromptStyle,
    goal: str,
    history: History,
    observation: str,
    admissible: Admissible,
    history_mode: str,
    history_window: int,
) -> str:
    """The user message before the next action of an episode (the agent loop's and every
    demonstration's): the first prompt before any action, then in ``window`` mode one
    prompt holding the last ``history_window`` of ``history`` (every (observation, action)
    pair so far), in ``full`` mode the new observation alone."""
    step = len(history)
    if step == 0:
        return style.first(goal, observation, admissible)
    if history_mode == "window":
        kept = list(history[-history_window:]) if history_window else []
        return style.window(goal, kept, observation, step, admissible)
    return style.step(step, observation, admissible)


# ---------------------------------------------------------------------------- records


class TurnFacts(Protocol):
    """What an oracle reads of one step (a `megatron_seed.data.Turn` is one)."""

    action: str  # the reply as written
    observation: str  # what the environment said before this action
    admissible: list[str] | None
    executed: str | None  # the action sent to the environment
    valid: bool  # whether the reply held a well-formed action


class EpisodeFacts(Protocol):
    """What an oracle reads of one finished episode (a `TrajectoryRecord` is one).

    ``status`` compares equal to its string: ``"ok"``, ``"max_steps"`` (the step budget ran
    out), ``"truncated"``, ``"env_error"``, ``"engine_error"``.
    """

    game: str
    family: str
    goal: str
    won: bool
    status: Any
    turns: Sequence[Any]  # TurnFacts
    final_observation: str | None
    meta: dict[str, Any]


STATUS_MAX_STEPS = "max_steps"  # `EpisodeFacts.status` when the step budget ran out


def task_of(record: EpisodeFacts) -> str:
    """The task instruction, as the environment stated it (no trailing period)."""
    return one_line(record.goal).rstrip(".")


def action_of(turn: TurnFacts) -> tuple[str | None, bool]:
    """The executed action of a turn, or (None, False) when its reply held none."""
    if not turn.valid or not turn.executed:
        return None, False
    return turn.executed, True


def step_feedback(record: EpisodeFacts) -> list[str | None]:
    """The environment's answer to each action (None where the record does not hold it).

    The answer to action t is the observation before turn t+1; the last action's answer is
    the record's `final_observation`.
    """
    feedback: list[str | None] = [one_line(t.observation) for t in record.turns[1:]]
    if record.turns:
        final = record.final_observation
        feedback.append(one_line(final) if final else None)
    return feedback


# ---------------------------------------------------------------------------- plug-ins


@dataclass(frozen=True)
class Oracle:
    """An analyzer that knows the task's ground truth: ``analyze(record) -> {"summary": ...,
    "skill": ...}`` (deterministic; raises on a record it cannot read). ``name`` names it in
    errors; ``ensure_ascii=False`` keeps non-ASCII text (a grid symbol) in the JSON reply."""

    analyze: Callable[[EpisodeFacts], dict[str, str]]
    name: str
    ensure_ascii: bool = True


class TaskCommand(Protocol):
    """An environment's ``seed games`` flags and generator. ``run`` reports bad input by
    raising ``ValueError`` (printed as one line); ``args.out`` is checked before it runs."""

    def add_arguments(self, parser: Any) -> None: ...

    def run(self, args: Any) -> int: ...


class PromptModule(Protocol):
    """An environment's prompt module: its prompt styles, its reply parser and the task
    line's marker (H inserts a skill after that line; None: skills go to the system
    prompt)."""

    TASK_MARKER: str | None

    def prompt_style(self, name: str) -> PromptStyle: ...

    def parse_action(self, text: str) -> tuple[str | None, bool]: ...


_DEMO_NAMES = ("DemoSettings", "Demo", "game_demos", "eval_hints", "reply_text", "random_reply")


class DemoPlayers(Protocol):
    """An environment's demonstration players (`envs.demos` describes the API), from which
    the CPU test bed clones a base policy."""

    DemoSettings: type
    Demo: type

    def game_demos(self, game: str, index: int, settings: Any) -> list[Any]: ...

    def eval_hints(self, games: Sequence[str]) -> dict[str, str]: ...

    def reply_text(self, action: str) -> str: ...

    def random_reply(self, goal: str, observation: str, admissible: Any, rng: Any) -> str: ...


@dataclass(frozen=True)
class RolloutDefaults:
    """An environment's episode budgets: a job's rollout config starts from them (its
    recipe and the user's config override them)."""

    max_steps: int  # actions per episode
    max_response_tokens: int  # tokens per reply
    history_window: int = 2  # (observation, action) pairs a windowed prompt keeps

    def as_changes(self) -> dict[str, int]:
        """The ``rollout`` section changes (``SeedConfig.with_changes``)."""
        return {
            "max_steps": self.max_steps,
            "max_response_tokens": self.max_response_tokens,
            "history_window": self.history_window,
        }


@dataclass(frozen=True)
class EnvSpec:
    """Everything the library needs from one environment.

    make_env(max_steps) -> `Env`; runs inside the env workers.
    list_tasks(root, split) -> task ids (paths or names) under a task folder; ``split``
        None means every task under ``root``.
    family(task) -> the task's family or dataset type (report rows, per-family metrics).
    prompt: the `PromptModule`; the spec answers `prompts(style)` (the `PromptStyle` named
        ``style``: "paper", "compact", ...), `parse_action(text)` -> (action or None,
        valid) and `task_marker` (every first prompt holds exactly one line starting
        with it; H inserts the skill right after that line) from it.
    rollout: the episode budgets a job starts from; None: the library's defaults.
    report_columns: (family, column label) pairs, in report order.
    plan(task) -> the expert's actions; raises ValueError where the task has none
        (`expert_plan` answers None there).
    generate_tasks(root, split, n, seed, **options) -> task folders written offline.
    prompt, oracle, command, demos: the typed plug-ins (`PromptModule`, `Oracle`,
        `TaskCommand`, `DemoPlayers`), checked when the registry loads the spec (`check`).
    """

    name: str
    make_env: Callable[[int], Env]
    list_tasks: Callable[[Any, str | None], list[Any]]
    family: Callable[[str], str]
    prompt: PromptModule
    description: str = ""  # "a text-based household environment (ALFWorld)": the analyzer's words
    rollout: RolloutDefaults | None = None
    report_columns: tuple[tuple[str, str], ...] = ()
    plan: Callable[[str], list[str] | None] | None = None
    oracle: Oracle | None = None
    generate_tasks: Callable[..., list[Any]] | None = None
    command: TaskCommand | None = None
    demos: DemoPlayers | None = None

    def prompts(self, style: str) -> PromptStyle:
        """The prompt style named ``style``."""
        return self.prompt.prompt_style(style)

    def parse_action(self, text: str) -> tuple[str | None, bool]:
        """(the action to execute or None, valid) from a reply."""
        return self.prompt.parse_action(text)

    @property
    def task_marker(self) -> str | None:
        """The start of the task line H inserts a skill after (None: the system prompt)."""
        return self.prompt.TASK_MARKER

    def expert_plan(self, task: str) -> list[str] | None:
        """The expert's actions for ``task``; None where the environment has no expert or
        the task has no plan."""
        if self.plan is None:
            return None
        try:
            return self.plan(task)
        except ValueError:
            return None

    def check(self) -> None:
        """A one-line ``TypeError`` naming the first plug-in that lacks what it must have."""
        needs = {
            "prompt": (self.prompt, ("prompt_style", "parse_action", "TASK_MARKER")),
            "command": (self.command, ("add_arguments", "run")),
            "demos": (self.demos, _DEMO_NAMES),
        }
        for field_name, (plugin, names) in needs.items():
            missing = [n for n in names if plugin is not None and not hasattr(plugin, n)]
            if missing:
                raise TypeError(f"environment {self.name!r}: {field_name} lacks {missing}")
        for name in ("make_env", "list_tasks", "family"):
            if not callable(getattr(self, name)):
                raise TypeError(f"environment {self.name!r}: {name} is not callable")
        if self.oracle is not None and not isinstance(self.oracle, Oracle):
            raise TypeError(f"environment {self.name!r}: oracle is not an envs.api.Oracle")
