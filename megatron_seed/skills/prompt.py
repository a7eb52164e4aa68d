"""The analyzer prompt: x_tau, the trajectory-analysis input (paper §3.2, Figure 10).

A completed trajectory is serialised into a structured record (task instruction, the full
interaction: one action and the environment's answer per step, terminal outcome) and the
analyzer is asked for one JSON object ``{"summary": ..., "skill": ...}``: a reusable workflow
for a success, an avoidance rule (the core mistake and what to do instead) for a failure.

Two layouts (``SkillConfig.analyzer_layout``):

- ``record`` (the paper's): one user message holding the instructions and the serialised
  trajectory. `analyzer_messages` returns that one message.
- ``continuation``: the episode's own chat (system prompt, every observation and action, as
  the actor saw and wrote them) followed by ONE new user turn holding the request (outcome,
  final observation, instructions). `analyzer_messages` returns only that appended turn; the
  fleet appends its ids to the episode's chat ids so the prefix cache already holds the
  trajectory. `full_messages` gives the complete chat for a chat endpoint (needs ``full``
  history mode: a windowed episode has no single chat to continue).

The serialised trajectory reads the record's facts (the goal, the environment's own
observations, the executed actions and whether they parsed), so the analyzer reads the
interaction, not the actor's boilerplate. The environment is described in the words of its
spec (`EnvSpec.description`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from envs.api import action_of, one_line, step_feedback, task_of
from envs.spec import get_env
from megatron_seed.data.records import Status, TrajectoryRecord

AnalyzerLayout = Literal["record", "continuation"]
LAYOUTS: tuple[AnalyzerLayout, ...] = ("record", "continuation")
Message = dict[str, str]

# Placeholders of the answer format; a "skill" equal to one of them is a copy, not a skill.
SUMMARY_PLACEHOLDER = "<one or two sentences on what happened>"
SKILL_PLACEHOLDER = "<the reusable workflow or avoidance rule>"
ANSWER_FORMAT = json.dumps({"summary": SUMMARY_PLACEHOLDER, "skill": SKILL_PLACEHOLDER})

_ROLE = (
    "You are an expert trajectory analyzer. You read a completed episode of an agent acting "
    "in {environment} and distill it into one hindsight "
    "skill: natural-language guidance that would help the agent on similar tasks."
)
DEFAULT_DESCRIPTION = "an interactive text environment"
_SUCCESS = (
    "The episode SUCCEEDED. Write the skill as a reusable workflow: the decisive steps in the "
    "order that made it work, stated so it transfers to similar tasks. Start it with "
    '"Workflow:".'
)
_FAILURE = (
    "The episode FAILED. Write the skill as an avoidance rule: name the core mistake and its "
    "warning signs (invalid actions, loops, wrong object or order, running out of steps) and "
    'say what to do instead. Start it with "Avoid".'
)
_RULES = (
    "Rules: the skill is one to three sentences of at least {min_words} words; it gives "
    "guidance, not a retelling of the steps; it does not copy these instructions.\n"
    "Reply with ONLY a JSON object, no other text:\n{answer_format}"
)


def role(record: TrajectoryRecord) -> str:
    """The analyzer's role line, naming the record's environment."""
    description = DEFAULT_DESCRIPTION
    if record.env:
        description = get_env(record.env).description or DEFAULT_DESCRIPTION
    return _ROLE.format(environment=description)


def outcome_text(record: TrajectoryRecord) -> str:
    """One line: success or failure, reward, steps, and why a failure ended."""
    steps = len(record.turns)
    if record.won:
        return f"success (the task was completed; reward {record.reward:g}; {steps} steps)"
    why = {
        Status.MAX_STEPS: "the step budget ran out",
        Status.TRUNCATED: "the episode was cut at a token limit",
        Status.ENV_ERROR: "the environment failed",
        Status.ENGINE_ERROR: "the generation engine failed",
    }.get(record.status, "the task was not completed")
    return f"failure ({why}; reward {record.reward:g}; {steps} steps)"


def serialize_trajectory(record: TrajectoryRecord) -> str:
    """x_tau: task, initial observation, every step's action and answer, outcome."""
    lines = [f"Task: {task_of(record) or '(unknown)'}"]
    if record.turns:
        lines.append(f"Initial observation: {one_line(record.turns[0].observation)}")
    for i, (turn, answer) in enumerate(zip(record.turns, step_feedback(record), strict=True)):
        action, ok = action_of(turn)
        shown = (
            action if ok else f"(no valid action; the reply was: {one_line(turn.action)[:200]!r})"
        )
        lines.append(f"Step {i + 1}: action: {shown}")
        if answer is not None:
            lines.append(f"  observation: {answer}")
    lines.append(f"Outcome: {outcome_text(record)}")
    return "\n".join(lines)


def _instructions(record: TrajectoryRecord, min_words: int) -> str:
    rules = _RULES.format(min_words=min_words, answer_format=ANSWER_FORMAT)
    return f"{_SUCCESS if record.won else _FAILURE}\n{rules}"


def record_prompt(record: TrajectoryRecord, min_words: int = 5) -> str:
    """The ``record`` layout's single user message."""
    return (
        f"{role(record)}\n\n## Episode\n{serialize_trajectory(record)}\n\n"
        f"## Your answer\n{_instructions(record, min_words)}"
    )


def continuation_request(record: TrajectoryRecord, min_words: int = 5) -> str:
    """The ``continuation`` layout's appended user turn (the episode chat precedes it)."""
    final = step_feedback(record)[-1] if record.turns else None
    last = f"\nThe last action's result: {final}" if final else ""
    return (
        f"The episode above has ended. Outcome: {outcome_text(record)}.{last}\n\n"
        f"Now stop acting. {role(record)}\n{_instructions(record, min_words)}"
    )


def episode_messages(record: TrajectoryRecord) -> list[Message]:
    """The episode's own chat (full history mode): system, then user/assistant per turn."""
    if record.history_mode != "full":
        raise ValueError(
            "the continuation layout needs a full-history record (a windowed episode has no "
            "single chat to continue); use analyzer_layout='record'"
        )
    messages: list[Message] = []
    if record.system_prompt:
        messages.append({"role": "system", "content": record.system_prompt})
    for turn in record.turns:
        messages.append({"role": "user", "content": turn.user})
        messages.append({"role": "assistant", "content": turn.action})
    return messages


def analyzer_messages(
    record: TrajectoryRecord, layout: AnalyzerLayout, min_words: int = 5
) -> list[Message]:
    """The analyzer's messages: the whole prompt (``record``) or the turn to append."""
    if layout == "record":
        return [{"role": "user", "content": record_prompt(record, min_words)}]
    if layout == "continuation":
        return [{"role": "user", "content": continuation_request(record, min_words)}]
    raise ValueError(f"unknown analyzer layout {layout!r}; expected one of {LAYOUTS}")


def full_messages(
    record: TrajectoryRecord, layout: AnalyzerLayout, min_words: int = 5
) -> list[Message]:
    """The complete chat to send to a chat endpoint for this layout."""
    appended = analyzer_messages(record, layout, min_words)
    return appended if layout == "record" else episode_messages(record) + appended


def trajectory_id(record: TrajectoryRecord) -> str:
    """A stable id: ``meta["trajectory_id"]``, else a hash of the episode's content."""
    given = record.meta.get("trajectory_id")
    if given:
        return str(given)
    content = json.dumps(
        [record.task_id, record.group_id, record.game, record.won, record.status.value]
        + [[t.user, t.action] for t in record.turns]
        + [record.final_observation],
        ensure_ascii=False,
    )
    return f"{record.task_id}:{hashlib.sha256(content.encode()).hexdigest()[:16]}"
