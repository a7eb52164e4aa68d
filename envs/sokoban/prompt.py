"""The Sokoban actor prompts and action parsing.

``paper``: verl-agent's text Sokoban prompt (``agent_system/environments/prompts/sokoban.py``:
``SOKOBAN_TEMPLATE_NO_HIS`` for the first turn, ``SOKOBAN_TEMPLATE`` for the windowed
history, whose pairs are ``[Observation k: '...', Action k: '...']`` as verl-agent's
``SimpleMemory.fetch`` writes them): symbol legend, goal, rules, the grid, the admissible
actions and the ``<think>`` / ``<action>`` answer format. verl-agent has no system prompt
(the chat template's default applies) and no full-history chat mode; a later chat turn here
holds the step number, the grid, the actions and the same instructions.

``compact``: a one-line system prompt (legend and answer format), the task line, the grid
with the cell padding removed (``#_OX#`` rather than `` # \\t _ \\t...``); a later chat turn
holds the grid alone. No instructions.

Contract (``task_marker``): the first prompt of both styles holds exactly one line starting
with ``TASK_MARKER`` ("Your goal is to", verl-agent's goal sentence); H inserts the skill
right after it.

Actions: ``<action>up|down|left|right</action>``, case-insensitive; the last ``<action>`` of
a reply counts (as the ALFWorld parser of this project does; verl-agent takes the first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.api import Admissible, History, Prompts, choose_style
from envs.sokoban.grid import MOVES

TASK_MARKER = "Your goal is to"

_LEGEND = (
    "# Symbols and Their Meaning\n"
    "- Walls (`#`): These block movement. You can't move through or push anything into walls.\n"
    "- Floor (`_`): Open spaces where you can walk and move boxes.\n"
    "- Targets (`O`): The spots where boxes need to go.\n"
    "- Boxes (`X`): These are what you need to push onto the targets.\n"
    "- Player (`P`): That's you! You'll move around the grid to push boxes.\n"
    "- Box on Target (`√`): A box successfully placed on a target.\n"
    "- Player on Target (`S`): You standing on a target.\n"
)
_GOAL_AND_RULES = (
    "# Your Goal\n"
    "Your goal is to push all the boxes (`X`) onto the target spots (`O`). Once all boxes "
    "are on the targets, you win!\n"
    "\n"
    "# Rules\n"
    "You can only push boxes. You can't pull them, so plan ahead to avoid getting stuck.\n"
    "You can't walk through or push boxes into walls (`#`).\n"
    "To avoid traps, do not push boxes into corners or against walls where they can't be "
    "moved again.\n"
)
_HEAD = (
    f"You are an expert agent operating in the Sokoban environment.\n\n{_LEGEND}\n{_GOAL_AND_RULES}"
)
_INSTRUCTIONS = (
    "Now it's your turn to make a move (choose ONE action only for the current step).\n"
    "You should first reason step-by-step about the current situation — observe the "
    "positions of boxes and targets, plan a path to push a box toward a target, and avoid "
    "traps like corners or walls. This reasoning process MUST be enclosed within <think> "
    "</think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for "
    "current step and present it within <action> </action> tags."
)
_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def format_admissible(admissible: Sequence[str] | None) -> str:
    """``["up", "down", "left", "right"]`` as verl-agent prints them."""
    return "[" + ", ".join(f'"{a}"' for a in (admissible or MOVES)) + "]"


def render_first(goal: str, observation: str, admissible: Sequence[str] | None) -> str:
    """verl-agent's ``SOKOBAN_TEMPLATE_NO_HIS`` (its goal sentence is the task line)."""
    return (
        f"{_HEAD}\n# Current Step\nYour current observation is:\n{observation}\n"
        f"Your admissible actions are {format_admissible(admissible)}.\n\n{_INSTRUCTIONS}"
    )


def render_step(step: int, observation: str, admissible: Sequence[str] | None) -> str:
    """A later chat turn (``step`` moves taken): the grid, the actions, the instructions."""
    return (
        f"You are now at step {step + 1} and your current observation is:\n{observation}\n"
        f"Your admissible actions are {format_admissible(admissible)}.\n\n{_INSTRUCTIONS}"
    )


def render_window(
    goal: str, history: History, observation: str, step: int, admissible: Admissible
) -> str:
    """verl-agent's ``SOKOBAN_TEMPLATE``: the last k (observation, action) pairs, numbered
    ``step - len(history) + 1 .. step``, then the current grid."""
    if step == 0 or not history:
        return render_first(goal, observation, admissible)
    first = step - len(history) + 1
    pairs = "\n".join(
        f"[Observation {first + i}: '{obs}', Action {first + i}: '{act}']"
        for i, (obs, act) in enumerate(history)
    )
    return (
        f"{_HEAD}\n# Current Step\nPrior to this step, you have already taken {step} step(s). "
        f"Below are the most recent {len(history)} observaitons and the corresponding actions "
        f"you took: {pairs}\n"
        f"You are now at step {step + 1} and your current observation is:\n{observation}\n"
        f"Your admissible actions are {format_admissible(admissible)}.\n\n{_INSTRUCTIONS}"
    )


# --------------------------------------------------------------------------- compact style

COMPACT_SYSTEM_PROMPT = (
    "Sokoban: # wall, _ floor, O target, X box, √ box on target, P you, S you on target. "
    "Answer with <action>up|down|left|right</action>."
)


def compact_grid(observation: str) -> str:
    """The observation with each grid cell's padding removed (other lines kept)."""
    return "\n".join(
        "".join(cell.strip() for cell in line.split("\t")) if "\t" in line else line
        for line in observation.split("\n")
    )


def task_line(goal: str) -> str:
    """``Your goal is to push the box (X) onto the target (O).``"""
    return f"{TASK_MARKER} {goal.strip().rstrip('.')}."


def render_first_compact(goal: str, observation: str, admissible: Sequence[str] | None) -> str:
    """The task line and the grid."""
    return f"{task_line(goal)}\n{compact_grid(observation)}"


def render_step_compact(step: int, observation: str, admissible: Sequence[str] | None) -> str:
    """A later chat turn: the grid alone."""
    return compact_grid(observation)


def render_window_compact(
    goal: str, history: History, observation: str, step: int, admissible: Admissible
) -> str:
    """The task line, the last k (grid, action) pairs, the current grid."""
    pairs = "".join(f"{compact_grid(o)}\n> {a}\n" for o, a in history)
    return f"{task_line(goal)}\n{pairs}{compact_grid(observation)}"


STYLES: dict[str, Prompts] = {
    "paper": Prompts(None, render_first, render_step, render_window),
    "compact": Prompts(
        COMPACT_SYSTEM_PROMPT,
        render_first_compact,
        render_step_compact,
        render_window_compact,
        step_lists_admissible=False,
    ),
}


def prompt_style(name: str) -> Prompts:
    """The renderers of a prompt style (``paper`` or ``compact``)."""
    return choose_style(STYLES, name)


def parse_action(text: str) -> tuple[str | None, bool]:
    """The move of the last ``<action>...</action>`` of a reply: ``("up", True)``, or
    ``(None, False)`` when there is no tag or its content is not one of the four moves."""
    matches = _ACTION_RE.findall(text or "")
    if not matches:
        return None, False
    move = " ".join(matches[-1].split()).lower().strip(" .'\"`")
    return (move, True) if move in MOVES else (None, False)
