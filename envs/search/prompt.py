"""The search environment's actor prompts and action parser.

``paper``: Search-R1's instruction prompt (``make_prefix`` of its ``nq_search.py``: reason
inside <think>, search with <search>, read <information>, answer inside <answer>), no system
prompt (Search-R1 uses the chat template's default). One departure: Search-R1 ends the
instruction with "Question: {question}" on the same line; here the question is a line of its
own, so that exactly one line starts with the task marker ``Question:`` (H inserts the skill
after it). Later turns hold the environment's answer alone (the ``<information>`` block, as
Search-R1 appends it to the context). The windowed layout adds verl-agent's history preamble
(``SEARCH_TEMPLATE``: "Prior to this step, you have already taken N step(s). ...").

``compact``: a one-line system prompt, the task line ``Question: ...``, and later turns the
information block alone; for the CPU test bed's tiny policy, which pays for every token.

``parse_action`` returns the canonical tag string (``<search>q</search>`` or
``<answer>a</answer>``, whitespace collapsed) or ``(None, False)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.api import Admissible, History, Prompts, choose_style
from envs.search.env import parse_reply

TASK_MARKER = "Question:"

INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>."
)  # Search-R1's prefix, verbatim (its typo "as your want" included)
_HISTORY = (
    "Prior to this step, you have already taken {step} step(s). Below is the interaction "
    "history where <search> </search> wrapped your past search queries and <information> "
    "</information> wrapped the corresponding search results returned by the external search "
    "engine. History:"
)  # verl-agent's SEARCH_TEMPLATE
COMPACT_SYSTEM_PROMPT = "Reply <search>query</search> or <answer>answer</answer>."


def _one_line(text: str) -> str:
    return " ".join(text.split())


def task_line(question: str) -> str:
    """``Question: <the question, on one line>``."""
    return f"{TASK_MARKER} {_one_line(question)}"


def _history_lines(goal: str, history: Sequence[tuple[str, str]]) -> list[str]:
    """The (observation, action) pairs, a line each; an observation that is the question
    itself (the first) is left out: the task line states it."""
    lines = []
    for obs, act in history:
        if _one_line(obs) != _one_line(goal):
            lines.append(obs.strip())
        lines.append(act)
    return lines


def render_first_paper(goal: str, observation: str, admissible: Sequence[str] | None) -> str:
    """Search-R1's first prompt: the instruction, then the question line."""
    return f"{INSTRUCTION}\n{task_line(goal)}"


def render_step(step: int, observation: str, admissible: Sequence[str] | None) -> str:
    """A later user turn (both styles): the environment's answer alone."""
    return observation.strip()


def render_window_paper(
    goal: str, history: History, observation: str, step: int, admissible: Admissible
) -> str:
    """One user message: the instruction, the question, the last k (observation, action)
    pairs (the question itself is not repeated), the current observation."""
    if step == 0 or not history:
        return render_first_paper(goal, observation, admissible)
    lines = [INSTRUCTION, task_line(goal), _HISTORY.format(step=step)]
    lines += _history_lines(goal, history)
    lines.append(observation.strip())
    return "\n".join(lines)


def render_first_compact(goal: str, observation: str, admissible: Sequence[str] | None) -> str:
    """The compact first prompt: the task line alone (the observation is the question)."""
    return task_line(goal)


def render_window_compact(
    goal: str, history: History, observation: str, step: int, admissible: Admissible
) -> str:
    """The task line, the last k (observation, action) pairs, the current observation."""
    lines = [task_line(goal), *_history_lines(goal, history)]
    if step and _one_line(observation) != _one_line(goal):
        lines.append(observation.strip())
    return "\n".join(lines)


STYLES: dict[str, Prompts] = {
    "paper": Prompts(None, render_first_paper, render_step, render_window_paper, False),
    "compact": Prompts(
        COMPACT_SYSTEM_PROMPT, render_first_compact, render_step, render_window_compact, False
    ),
}


def prompt_style(name: str) -> Prompts:
    """The renderers of a prompt style (``paper`` or ``compact``)."""
    return choose_style(STYLES, name)


def parse_action(reply: str) -> tuple[str | None, bool]:
    """The canonical action of a reply with exactly one non-empty <search> or <answer> tag
    (whitespace collapsed), else ``(None, False)``."""
    parsed = parse_reply(reply)
    if parsed is None:
        return None, False
    kind, content = parsed
    return f"<{kind}>{content}</{kind}>", True
