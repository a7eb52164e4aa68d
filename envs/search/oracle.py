"""The search environment's oracle analyzer: hindsight skills from the trajectory and the
task file's ground truth (the gold query chain and the passages it must reach).

It replays the record's facts (the executed action of each turn, whether it parsed, the
environment's answer: the ``<information>`` block whose ``Doc i(Title: ...)`` lines name the
passages retrieved) against the task's gold chain and writes ``{"summary", "skill"}``:

- success: the workflow that found the answer, i.e. the searches that reached a gold passage
  for the first time, and the passage the answer was read from; searches that missed are
  named as the steps to skip.
- failure: the first mistake, in order of the episode (an invalid reply; a search that missed
  every gold passage or found nothing new; answering without searching; answering before the
  passage that holds the answer was read, or answering a wrong entity; running out of turns)
  and the fix: the gold query chain and the title of the answer's source passage. The
  answer string itself is never written (the skill names where to find it); the entity to
  search for may be named.

Official tasks (no gold chain) get the same diagnosis without the gold passages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from envs.api import EpisodeFacts, Oracle, action_of, step_feedback
from envs.search.env import exact_match, parse_reply
from envs.search.tasks import load_task

_TITLE = re.compile(r"Doc \d+\(Title: (.+?)\) ")


def _clean(title: str) -> str:
    return title.strip().strip('"').strip()


@dataclass
class Step:
    """One replayed action."""

    index: int  # 1-based
    kind: str  # "search" | "answer" | "invalid"
    content: str = ""
    titles: list[str] = field(default_factory=list)  # passages a search retrieved
    new_gold: list[str] = field(default_factory=list)  # gold passages it reached first


def replay(record: EpisodeFacts, gold: list[str]) -> list[Step]:
    """The episode's actions with what each search retrieved and which gold passages it
    reached for the first time."""
    found: set[str] = set()
    steps = []
    for i, (turn, answer) in enumerate(zip(record.turns, step_feedback(record), strict=True)):
        action, ok = action_of(turn)
        parsed = parse_reply(action) if ok and action else None
        if parsed is None:
            steps.append(Step(i + 1, "invalid"))
            continue
        step = Step(i + 1, parsed[0], parsed[1])
        if step.kind == "search":
            step.titles = [_clean(t) for t in _TITLE.findall((answer or "") + " ")]
            step.new_gold = [t for t in gold if t in step.titles and t not in found]
            found.update(step.new_gold)
        steps.append(step)
    return steps


def _fix(task: dict[str, Any], gold: list[str]) -> str:
    queries = task.get("gold_queries") or []
    if not queries:
        return (
            "Fix: search for the main entity of the question by its exact name, read the "
            "passages, then answer with their exact words."
        )
    if task.get("shape") == "comparison":
        return (
            f"Fix: search '{queries[0]}', then search '{queries[1]}', compare the years the "
            "two passages give, then answer with the name of the earlier one."
        )
    chain = "', then search '".join(queries)
    return f"Fix: search '{chain}', then answer with what the \"{gold[-1]}\" passage says."


def _first_mistake(steps: list[Step], task: dict[str, Any], gold: list[str], won: bool) -> str:
    searched = False
    found: list[str] = []
    for s in steps:
        if s.kind == "invalid":
            return (
                f"a reply at step {s.index} without exactly one <search>query</search> or "
                "<answer>answer</answer> tag, which wasted a turn"
            )
        if s.kind == "search":
            if gold and not s.new_gold:
                if any(t in gold for t in s.titles):
                    return f"searching '{s.content}' at step {s.index}, which found no new passage"
                need = next(t for t in gold if t not in found)
                return (
                    f"searching '{s.content}' at step {s.index}, which missed the \"{need}\" "
                    "passage the question needs"
                )
            found += s.new_gold
            searched = True
            continue
        if not searched and gold:
            return f"answering '{s.content}' at step {s.index} without searching first"
        if exact_match(s.content, task["golden_answers"]):
            continue
        if gold and gold[-1] not in found:
            return (
                f"answering '{s.content}' at step {s.index} before reading the "
                f'"{gold[-1]}" passage that holds the answer'
            )
        return f"answering '{s.content}' at step {s.index}, an entity the passages do not give"
    if won:
        return ""
    return f"using all {len(steps)} turns without giving an answer"


def success_skill(steps: list[Step], task: dict[str, Any], gold: list[str]) -> str:
    """The searches that reached the gold passages, and where the answer was read."""
    useful = [s.content for s in steps if s.kind == "search" and (s.new_gold or not gold)]
    if not useful:
        text = "Workflow: the answer was given without searching; search first to check it."
    else:
        chain = "', then search '".join(useful)
        source = f'the "{gold[-1]}" passage' if gold else "the retrieved passages"
        text = f"Workflow: search '{chain}', then answer with the exact words of {source}."
    wasted = [s for s in steps if s.kind == "search" and gold and not s.new_gold]
    if wasted:
        text += f" Skip searches like '{wasted[0].content}' (step {wasted[0].index}), which found nothing new."
    invalid = [s for s in steps if s.kind == "invalid"]
    if invalid:
        text += f" Reply with exactly one tag: step {invalid[0].index} was invalid."
    return text


def analyze_record(record: EpisodeFacts) -> dict[str, str]:
    """The oracle's answer for one trajectory: ``{"summary": ..., "skill": ...}``."""
    task = load_task(record.game)
    gold = [_clean(t) for t in task.get("gold_titles") or []]
    if not gold and task.get("gold_queries"):
        gold = list(task["gold_queries"])
    steps = replay(record, gold)
    n = len(steps)
    searches = sum(s.kind == "search" for s in steps)
    if record.won:
        skill = success_skill(steps, task, gold)
        summary = f"The agent answered correctly after {searches} searches in {n} steps."
    else:
        mistake = _first_mistake(steps, task, gold, won=False)
        skill = f"Avoid {mistake}. {_fix(task, gold)}"
        summary = f"The agent failed after {n} steps ({searches} searches): {mistake}."
    return {"summary": summary, "skill": skill}


ORACLE = Oracle(analyze_record, "search oracle")
