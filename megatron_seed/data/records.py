"""The trajectory record: one episode, from the environment to the loss, as JSON.

A record holds facts, verbatim, from the two sides of an episode:
- the engine's: the user message the policy saw (`Turn.user`, as rendered), the response
  text, the sampled action token ids exactly as the engine returned them (including its
  sampled EOS, if it sampled one) and their rollout log-probs;
- the environment's: what it said before each action (`Turn.observation`), the admissible
  actions where it lists them, the action executed and whether it parsed; the goal, the
  final observation, the counts of invalid actions and cut responses, the error that ended
  an episode.
Readers (the analyzer prompt, oracle analyzers, reports) use these fields; nobody parses a
rendered prompt back. Token sequences for training are derived from it by
`megatron_seed.data.sequences`. `meta` holds genuinely environment-specific extras only.

Schema version `SCHEMA` is written into every record; a record of another version is an
error naming the version (re-collect it).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

HistoryMode = Literal["full", "window"]
HISTORY_MODES: tuple[HistoryMode, ...] = ("full", "window")


class Status(enum.StrEnum):
    """How an episode ended. Only `trainable` statuses enter the loss."""

    OK = "ok"  # the environment ended it (won or lost)
    MAX_STEPS = "max_steps"  # the step budget ran out (an ordinary failure, reward 0)
    TRUNCATED = "truncated"  # a prompt or response hit its token limit; the episode was cut
    ENV_ERROR = "env_error"  # the environment raised
    ENGINE_ERROR = "engine_error"  # the generation engine failed

    @property
    def trainable(self) -> bool:
        """Whether the trajectory is valid on-policy data (errors are not)."""
        return self not in (Status.ENV_ERROR, Status.ENGINE_ERROR)


SCHEMA = 2  # 1: rendered prompts only (`Turn.observation` was the user message)


@dataclass
class Turn:
    """One agent step: the user message that preceded the action, and the action.

    user: the full text of the user message before this action, as rendered. In `full`
        history mode: turn 0 holds the first prompt (task, first observation), later turns
        the environment's reply. In `window` mode: the whole rendered prompt of this step
        (task line + last-k history + current observation).
    action: the decoded response text (for reading; never re-tokenised).
    action_ids: the sampled token ids, as the engine returned them.
    logprobs: log pi_theta_old of each sampled id, as the engine returned them.
    observation: what the environment said before this action (its own text).
    admissible: the environment's admissible actions at this step, as the user message showed
        them to the policy (None: the environment lists none, or this prompt did not show
        them, e.g. a compact prompt after the first turn).
    executed: the action text sent to the environment (the parsed action, or the raw reply
        when it did not parse); None if the episode ended before the step.
    valid: whether the response held a well-formed action.
    """

    user: str
    action: str
    action_ids: list[int]
    logprobs: list[float]
    observation: str = ""
    admissible: list[str] | None = None
    executed: str | None = None
    valid: bool = True

    def __post_init__(self) -> None:
        if len(self.action_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.action_ids)} action ids but {len(self.logprobs)} log-probs"
            )
        if not self.action_ids:
            raise ValueError("a turn needs at least one sampled action token")


@dataclass
class Analysis:
    """The hindsight analysis of one trajectory (the analyzer's or a library's)."""

    trajectory_id: str
    valid: bool
    summary: str | None = None
    error: str | None = None  # the last parse/validation/transport error
    retries: int = 0  # re-asks after a bad reply
    attempts: int = 0  # generations made
    prompt_tokens: int = 0
    completion_tokens: int = 0
    transport_error: bool = False  # the engine/endpoint failed (not the reply)
    source: str = "analyzer"  # "analyzer", or "library" (a fixed skill library)


@dataclass
class TrajectoryRecord:
    """One episode. `group_id` names the rollout group (task x update) for GRPO."""

    task_id: str
    group_id: str
    game: str  # the task instance (for ALFWorld, the game folder)
    family: str  # the task's family or dataset type (environment-defined)
    turns: list[Turn]
    reward: float  # the episode's return: the sum of the environment's rewards - penalties
    won: bool
    status: Status = Status.OK
    env: str = ""  # the environment's name (`envs.spec.get_env`); "" for synthetic records
    history_mode: HistoryMode = "full"
    # None: the environment gives none (ChatBuilder then uses the chat template's default)
    system_prompt: str | None = None
    # the line of a prompt after which H inserts a skill starts with this (the environment's
    # task line); None: the environment has none (skills go to the system prompt)
    task_marker: str | None = None
    goal: str = ""  # the task instruction, as the environment stated it
    final_observation: str | None = None  # the environment's answer to the last action
    invalid_actions: int = 0
    cut_responses: int = 0  # responses that hit the token limit
    error: str | None = None  # why an env_error / engine_error episode ended
    skill: str | None = None  # the hindsight skill inserted by H (only if it is valid)
    analysis: Analysis | None = None  # None: not analysed (no teacher signal)
    # the trainer step whose weights played it (one-step-off sets it; None: not recorded)
    policy_version: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # environment-specific extras
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        if self.schema != SCHEMA:
            raise ValueError(
                f"record schema {self.schema} is not the current {SCHEMA}; re-collect it"
            )
        self.status = Status(self.status)
        if self.history_mode not in HISTORY_MODES:
            raise ValueError(f"history_mode must be one of {HISTORY_MODES}")
        self.turns = [t if isinstance(t, Turn) else _strict(Turn, t) for t in self.turns]
        if isinstance(self.analysis, dict):
            self.analysis = _strict(Analysis, self.analysis)

    @property
    def trainable(self) -> bool:
        """Whether the episode is on-policy data the loss may use: it ended without an
        environment or engine error and took at least one turn."""
        return self.status.trainable and bool(self.turns)

    @property
    def has_teacher(self) -> bool:
        """Whether this trajectory gets OPD (a skill that passed validation)."""
        return bool(self.skill) and self.analysis is not None and self.analysis.valid

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (status as its string value)."""
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrajectoryRecord:
        """Inverse of `to_dict`: every field of its declared type (checked by pydantic against
        the dataclasses' annotations); unknown keys and other schemas are an error."""
        if not isinstance(data, dict):
            raise ValueError(f"a record is a JSON object, got {type(data).__name__}")
        if data.get("schema", 1) != SCHEMA:
            raise ValueError(
                f"record schema {data.get('schema', 1)} is not the current {SCHEMA}; re-collect it"
            )
        _check_types(cls, data)
        return _strict(cls, data)

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> TrajectoryRecord:
        """Inverse of `to_json`: each field strictly of its JSON type (a "false" where a bool
        belongs, a "5" where a token id does, is an error, not a coercion)."""
        data = json.loads(line)
        if isinstance(data, dict) and data.get("schema", 1) == SCHEMA:
            _check_types(cls, line, strict=True)
        return cls.from_dict(data)


def _check_types(cls: type, data: dict[str, Any] | str, strict: bool = False) -> None:
    """Raise ValueError naming the first field of ``data`` (a dict, or JSON text: then checked
    as JSON, where ``strict`` refuses every coercion) that is not of its type in ``cls``
    (nested records included)."""
    import pydantic

    try:
        if isinstance(data, str):
            _adapter(cls).validate_json(data, strict=strict)
        else:
            _adapter(cls).validate_python(data)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"field {where}: {first['msg']}, got {first['input']!r:.60}") from None


@functools.cache
def _adapter(cls: type) -> Any:
    import pydantic

    return pydantic.TypeAdapter(cls)


class RecordsError(ValueError):
    """A file of trajectory records that cannot be read: names the file and the line."""


def _strict(cls: type, data: dict[str, Any]) -> Any:
    """`cls(**data)`, naming the keys `cls` does not have."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}")
    return cls(**data)


def write_jsonl(records: Iterable[TrajectoryRecord], path: str | Path) -> None:
    """One record per line."""
    with Path(path).open("w", encoding="utf-8") as f:
        for record in records:
            f.write(record.to_json() + "\n")


def read_jsonl(path: str | Path) -> Iterator[TrajectoryRecord]:
    """Records from a JSONL file (blank lines skipped); `RecordsError` naming the file and the
    line that is not a record (not JSON, cut short, a field of another type)."""
    with Path(path).open(encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield TrajectoryRecord.from_json(line)
                    except (ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
                        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                        raise RecordsError(
                            f"{path}: line {number} is not a trajectory record ({reason})"
                        ) from None
        except UnicodeDecodeError:
            raise RecordsError(f"{path}: not a text file of trajectory records") from None
