"""WebShop's actor prompts and action parser.

``paper``: verl-agent's WebShop prompt (``agent_system/environments/prompts/webshop.py``:
``WEBSHOP_TEMPLATE_NO_HIS`` first, ``WEBSHOP_TEMPLATE`` with the last k (observation, action)
pairs): the expert-agent preamble, the task, the current page, the admissible actions one a
line in quotes, the ``<think>`` / ``<action>`` answer format. One departure: verl-agent's
task sentence starts "Your task is" + " to:"; here the task line starts with ``TASK_MARKER``
("Your shopping task:"), so that the task line is WebShop's own (H inserts the skill after
it). A later full-history chat turn holds the step, the page and the actions.

``compact``: a one-line system prompt, the task line, the page (lower case, a line per
text: ``compact_page``) and the actions; a windowed
prompt keeps the last k actions but not their pages (a results page is long); for the CPU
test bed's tiny policy, which pays for every token.

Actions: the content of the last ``<action>...</action>`` of a reply, whitespace collapsed,
when it is ``search[...]`` or ``click[...]`` (as verl-agent reads the action tag; whether the
page accepts it is the environment's call).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.api import Admissible, History, Prompts, choose_style

TASK_MARKER = "Your shopping task:"
_HEAD = "You are an expert autonomous agent operating in the WebShop e-commerce environment."
_INSTRUCTIONS = (
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully "
    "which admissible action best advances the shopping goal. This reasoning process MUST be "
    "enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags."
)
_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_SHAPE = re.compile(r"(search|click)\[.+\]")


def task_line(goal: str) -> str:
    """``Your shopping task: <the instruction, on one line>.``"""
    return f"{TASK_MARKER} {' '.join(goal.split()).rstrip('.')}."


def format_admissible(admissible: Sequence[str] | None) -> str:
    """The actions as verl-agent lists them: one a line, quoted, comma after each."""
    return "[\n" + "\n".join(f"'{a}'," for a in admissible or []) + "\n]"


def render_first(goal: str, observation: str, admissible: Sequence[str] | None) -> str:
    """verl-agent's ``WEBSHOP_TEMPLATE_NO_HIS``."""
    return (
        f"{_HEAD}\n{task_line(goal)}\nYour current observation is: {observation}.\n"
        f"Your admissible actions of the current situation are: \n"
        f"{format_admissible(admissible)}.\n\n{_INSTRUCTIONS}"
    )


def render_step(step: int, observation: str, admissible: Sequence[str] | None) -> str:
    """A later chat turn (``step`` actions taken): the page, the actions, the instructions."""
    return (
        f"You are now at step {step + 1} and your current observation is: {observation}.\n"
        f"Your admissible actions of the current situation are: \n"
        f"{format_admissible(admissible)}.\n\n{_INSTRUCTIONS}"
    )


def render_window(
    goal: str, history: History, observation: str, step: int, admissible: Admissible
) -> str:
    """verl-agent's ``WEBSHOP_TEMPLATE``: the last k pairs numbered ``step - k + 1 .. step``."""
    if step == 0 or not history:
        return render_first(goal, observation, admissible)
    first = step - len(history) + 1
    pairs = "\n".join(
        f"[Observation {first + i}: '{obs}', Action {first + i}: '{act}']"
        for i, (obs, act) in enumerate(history)
    )
    return (
        f"{_HEAD}\n{task_line(goal)}\nPrior to this step, you have already taken {step} "
        f"step(s). Below are the most recent {len(history)} observations and the corresponding "
        f"actions you took: {pairs}\nYou are now at step {step + 1} and your current "
        f"observation is: {observation}.\nYour admissible actions of the current situation "
        f"are: \n{format_admissible(admissible)}.\n\n{_INSTRUCTIONS}"
    )


# --------------------------------------------------------------------------- compact style

COMPACT_SYSTEM_PROMPT = (
    "WebShop: answer <action>search[query]</action> or <action>click[button]</action>."
)


def compact_page(observation: str) -> str:
    """The page in lower case (asins as ``click[...]`` spells them), a line per text."""
    return observation.lower().replace(" [sep] ", "\n")


def _compact_actions(admissible: Sequence[str] | None) -> str:
    return "Actions: " + " | ".join(admissible or [])


def render_first_compact(goal: str, observation: str, admissible: Sequence[str] | None) -> str:
    """The task line, the page, the actions."""
    return f"{task_line(goal)}\n{compact_page(observation)}\n{_compact_actions(admissible)}"


def render_step_compact(step: int, observation: str, admissible: Sequence[str] | None) -> str:
    """A later chat turn: the page alone."""
    return compact_page(observation)


def render_window_compact(
    goal: str, history: History, observation: str, step: int, admissible: Admissible
) -> str:
    """The task line, the last k actions, the page, the actions."""
    done = "".join(f"> {a}\n" for _, a in history)
    return f"{task_line(goal)}\n{done}{compact_page(observation)}\n{_compact_actions(admissible)}"


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
    """The last ``<action>`` of a reply when it reads ``search[...]`` or ``click[...]``:
    ``("click[buy now]", True)``; else ``(None, False)``."""
    matches = _ACTION_TAG.findall(text or "")
    if not matches:
        return None, False
    action = " ".join(matches[-1].split())
    return (action, True) if _SHAPE.fullmatch(action) else (None, False)
