"""The ALFWorld actor prompt and action parsing.

Modelled on the paper's actor prompt (Figure 11) and the reference verl-agent templates:
role, task, step count, history, admissible actions, and the answer format
``<action>...</action>`` with optional ``<think>...</think>``.

Contract with the library (``envs.alfworld.spec``'s ``task_marker``): the first user message
contains exactly one line that starts with ``"Your task is to: "`` followed by the goal; H
inserts the hindsight skill right after that line. The windowed prompt keeps the same line.

Two styles (``prompt_style``): ``paper`` (below; the default) and ``compact``: a one-line
system prompt, the task line, the observation and the admissible actions as a plain list
(chat mode: in the first message only; later turns hold the observation alone), no
instructions. Compact prompts are ~5x shorter; the tiny CPU policy of the default job uses
them (a 0.7M-parameter model learns little from boilerplate and pays for every token of it).

Two layouts:
- chat mode: ``render_first_observation`` for the first user turn, ``render_step_observation``
  for each later turn (only the new observation and admissible actions; the chat is the
  history).
- windowed mode: ``render_window_prompt`` packs the last k (observation, action) pairs into one
  user message, like the reference code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.api import MAX_ACTION_CHARS, History, Prompts, choose_style, sanitize_action

TASK_PREFIX = "Your task is to: "
TASK_MARKER = TASK_PREFIX.strip()  # where H inserts the skill
DEFAULT_INVALID_PENALTY = 0.0

SYSTEM_PROMPT = (
    "You are an expert agent operating in the ALFRED Embodied Environment, a text-based "
    "household simulator. You complete the given task by choosing one admissible action per "
    "step. Reason inside <think> </think> tags if you wish, then give exactly one admissible "
    "action inside <action> </action> tags."
)

_ROLE = "You are an expert agent operating in the ALFRED Embodied Environment."
_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags."
)
_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def clean_observation(observation: str) -> str:
    """The observation without its "Your task is to:" line (the prompt states the task once)."""
    lines = [ln for ln in observation.splitlines() if not ln.startswith(TASK_PREFIX)]
    return _one_line("\n".join(lines))


def format_admissible(admissible: Sequence[str]) -> str:
    """``[ 'go to desk 1', 'look' ]`` in the reference code's quoting."""
    return "[" + ", ".join(f"'{a}'" for a in admissible if a != "help") + "]"


def _task_line(task: str) -> str:
    return TASK_PREFIX + _one_line(task).rstrip(".") + "."


def render_first_observation(task: str, observation: str, admissible: Sequence[str]) -> str:
    """First user message of the chat mode (role, task line, observation, actions, format)."""
    return (
        f"{_ROLE}\n{_task_line(task)}\n"
        f"Your current observation is: {clean_observation(observation)}\n"
        f"Your admissible actions of the current situation are: {format_admissible(admissible)}.\n"
        f"\n{_INSTRUCTIONS}"
    )


def render_step_observation(step: int, observation: str, admissible: Sequence[str]) -> str:
    """A later user turn of the chat mode: ``step`` actions have been taken so far."""
    return (
        f"You are now at step {step + 1} and your current observation is: "
        f"{clean_observation(observation)}\n"
        f"Your admissible actions of the current situation are: {format_admissible(admissible)}.\n"
        f"\n{_INSTRUCTIONS}"
    )


def render_window_prompt(
    task: str, history: History, observation: str, step: int, admissible: Sequence[str]
) -> str:
    """One user message holding the last k (observation, action) pairs (windowed mode).

    ``history`` is the caller's ``history[-k:]``; ``step`` is the number of actions taken so
    far, so the pairs are numbered ``step - len(history) + 1 .. step``.
    """
    if step == 0 or not history:
        return render_first_observation(task, observation, admissible)
    first = step - len(history) + 1
    pairs = "\n".join(
        f"[Observation {first + i}: '{clean_observation(obs)}', Action {first + i}: '{act}']"
        for i, (obs, act) in enumerate(history)
    )
    return (
        f"{_ROLE}\n{_task_line(task)}\n"
        f"Prior to this step, you have already taken {step} step(s). Below are the most recent "
        f"{len(history)} observations and the corresponding actions you took:\n{pairs}\n"
        f"You are now at step {step + 1} and your current observation is: "
        f"{clean_observation(observation)}\n"
        f"Your admissible actions of the current situation are: {format_admissible(admissible)}.\n"
        f"\n{_INSTRUCTIONS}"
    )


def parse_action(text: str, max_chars: int = MAX_ACTION_CHARS) -> tuple[str | None, bool]:
    """The last ``<action>...</action>`` of a response, normalised; ``(None, False)`` if none.

    Control characters are stripped, whitespace collapsed, the text lower-cased (ALFWorld's
    commands are lower case). An empty action or one longer than ``max_chars`` is invalid;
    the over-long one is returned truncated so the env can still answer it.
    """
    if not text:
        return None, False
    matches = _ACTION_RE.findall(text)
    if not matches:
        return None, False
    raw = matches[-1]
    action = sanitize_action(raw, max_chars=len(raw) + 1).lower()
    if not action:
        return None, False
    if len(action) > max_chars:
        return action[:max_chars], False
    return action, True


def format_reward(reward: float, valid: bool, penalty: float = DEFAULT_INVALID_PENALTY) -> float:
    """Env reward minus ``penalty`` for a badly formatted response (default 0, as the paper)."""
    return reward - (0.0 if valid else penalty)


# --------------------------------------------------------------------------- compact style

COMPACT_SYSTEM_PROMPT = (
    "You are a household agent. Answer with exactly one action inside <action> </action>."
)


def _compact_actions(admissible: Sequence[str]) -> str:
    return "Actions: " + "; ".join(a for a in admissible if a != "help") + "."


def render_first_compact(task: str, observation: str, admissible: Sequence[str]) -> str:
    """First user message of the compact style: task line, observation, actions."""
    return f"{_task_line(task)}\n{clean_observation(observation)}\n{_compact_actions(admissible)}"


def render_step_compact(step: int, observation: str, admissible: Sequence[str]) -> str:
    """A later user turn of the compact style (chat mode): the observation alone (the chat
    holds the first message's actions: every place is a "go to" there)."""
    return clean_observation(observation)


def render_window_compact(
    task: str, history: History, observation: str, step: int, admissible: Sequence[str]
) -> str:
    """Windowed compact prompt: the task line, the last k (observation, action) pairs, the
    current observation."""
    pairs = "".join(f"{clean_observation(o)} > {a}\n" for o, a in history)
    return (
        f"{_task_line(task)}\n{pairs}{clean_observation(observation)}\n"
        f"{_compact_actions(admissible)}"
    )


STYLES: dict[str, Prompts] = {
    "paper": Prompts(
        SYSTEM_PROMPT, render_first_observation, render_step_observation, render_window_prompt
    ),
    "compact": Prompts(
        COMPACT_SYSTEM_PROMPT,
        render_first_compact,
        render_step_compact,
        render_window_compact,
        step_lists_admissible=False,  # a later turn holds the observation alone
    ),
}


def prompt_style(name: str) -> Prompts:
    """The renderers of a prompt style (``paper`` or ``compact``)."""
    return choose_style(STYLES, name)
