"""ALFWorld's oracle analyzer: hindsight skills written from the trajectory and the game's facts.

For offline use without an endpoint (the default CPU job, tests). It replays the episode's
actions and the environment's answers to track where the agent was, what it held and what
changed, compares that with the game's expert plan, and writes the reply an analyzer would:
``{"summary": ..., "skill": ...}``. The reply goes through the same parsing and validation
as any analyzer's (`ORACLE`, through `megatron_seed.skills.oracle`).

- success: a workflow built from the actions that mattered ("Workflow: to put a clean mug in
  microwave, go to shelf 1, take mug 1 from shelf 1, ..., then move mug 1 to microwave 1."),
  the family's rule (state change before placing, one object at a time, ...) and, when the
  episode wasted steps, where the object actually was.
- failure: an avoidance rule naming the first mistake the replay finds (placing the object
  before its required state change, taking the wrong object, an action the environment
  rejected with "Nothing happens." and why, replies without an action, loops) and the fix:
  the rest of the expert plan from the first sub-goal the episode did not reach, and whether
  the step budget ran out.

The trajectory is read from the record's facts (executed actions, the environment's answers,
the admissible actions of each step, the goal). Game facts come from ``record.meta``
(``expert_plan``, ``object_target``, ``parent_target``, ``toggle_target``: ALFWorld's own
extras) and, for whatever is missing, from the game folder when ``record.game`` is a path
(``traj_data.json`` and the stored planner walkthrough).
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from envs.api import STATUS_MAX_STEPS, EpisodeFacts, Oracle, action_of, step_feedback, task_of

_NOTHING = "nothing happens"
MAX_PLAN_STEPS = 8  # longest expert-plan excerpt quoted in a failure's fix
_STATE_CHANGE = {
    "clean": ("sinkbasin", "clean"),
    "heat": ("microwave", "hot"),
    "cool": ("fridge", "cool"),
}
_EFFECTIVE = {"take", "move", "open", "clean", "heat", "cool", "use", "slice"}
_ACTION = re.compile(
    r"^(?:(?P<go>go to) (?P<dest>.+)"
    r"|(?P<take>take) (?P<tobj>.+?) from (?P<src>.+)"
    r"|(?P<move>move|put) (?P<mobj>.+?) (?:to|in|on|in/on) (?P<mdst>.+)"
    r"|(?P<tool>clean|heat|cool|slice) (?P<sobj>.+?) with (?P<with>.+)"
    r"|(?P<verb>open|close|use|examine|toggle) (?P<arg>.+))$"
)


def kind_of(name: str | None) -> str:
    """The object type of an instance name: "mug 1" -> "mug"."""
    return re.sub(r"\s*\d+$", "", name or "").strip()


def parse_command(action: str | None) -> tuple[str, str, str]:
    """(verb, object, target) of an ALFWorld command; ("", "", "") if unknown."""
    m = _ACTION.match(action or "")
    if not m:
        return (action or "").split(" ")[0] if action else "", "", ""
    if m["go"]:
        return "go", "", m["dest"]
    if m["take"]:
        return "take", m["tobj"], m["src"]
    if m["move"]:
        return "move", m["mobj"], m["mdst"]
    if m["tool"]:
        return m["tool"], m["sobj"], m["with"]
    return m["verb"], m["arg"], ""


@dataclass
class GameFacts:
    """What the analyzer knows about the game beyond the trajectory."""

    goal: str
    family: str
    object_target: str  # env names, lower case: "mug"
    parent_target: str = ""  # "microwave"; "" for look
    toggle_target: str = ""  # "desklamp"; "" unless look
    expert_plan: list[str] = field(default_factory=list)


def game_facts(record: EpisodeFacts) -> GameFacts:
    """Facts from ``record.meta``, completed from the game folder when it exists."""
    meta = record.meta
    params = {
        k: str(meta.get(k) or "") for k in ("object_target", "parent_target", "toggle_target")
    }
    plan = list(meta.get("expert_plan") or [])
    folder = Path(record.game) if record.game else None
    if folder is not None and folder.is_file():
        folder = folder.parent
    if folder is not None and folder.is_dir() and (not plan or not params["object_target"]):
        traj = folder / "traj_data.json"
        if traj.is_file():
            stored = json.loads(traj.read_text()).get("pddl_params", {})
            params = {k: params[k] or str(stored.get(k) or "") for k in params}
        if not plan:
            from envs.alfworld.env import GameFormatError, expert_plan

            try:
                plan = expert_plan(folder)
            except (GameFormatError, KeyError):
                plan = []
    params = {k: v.lower() for k, v in params.items()}
    if not params["object_target"]:  # infer from the plan: the first object taken
        taken = [parse_command(a)[1] for a in plan if a.startswith("take ")]
        params["object_target"] = kind_of(taken[0]) if taken else ""
    return GameFacts(goal=task_of(record), family=record.family, expert_plan=plan, **params)


# --------------------------------------------------------------------------- replay


@dataclass
class Step:
    """One replayed step: the action, the answer, and the state before the action."""

    index: int  # 1-based
    action: str | None  # None: the reply had no parsable <action>
    feedback: str | None  # the environment's answer (None: not recorded)
    admissible: list[str] | None
    location: str | None
    holding: str | None
    closed: frozenset[str]

    @property
    def failed(self) -> bool:
        return self.action is None or (self.feedback or "").lower().startswith(_NOTHING)


@dataclass
class Replay:
    """The steps and the object states the episode produced."""

    steps: list[Step]
    states: dict[str, set[str]]  # object -> {"clean", "hot", "cool"}
    done: list[tuple[str, str, str]]  # parsed commands that succeeded, in order


def replay(record: EpisodeFacts) -> Replay:
    """Track location, held object, closed receptacles and object states through the episode."""
    location: str | None = None
    holding: str | None = None
    closed: set[str] = set()
    states: dict[str, set[str]] = collections.defaultdict(set)
    steps, done = [], []
    for i, (turn, answer) in enumerate(zip(record.turns, step_feedback(record), strict=True)):
        action, ok = action_of(turn)
        step = Step(i + 1, action if ok else None, answer, turn.admissible,
                    location, holding, frozenset(closed))  # fmt: skip
        steps.append(step)
        if step.failed:
            continue
        verb, obj, target = parse_command(action)
        text = (answer or "").lower()
        done.append((verb, obj, target))
        if verb == "go":
            location = target
            if f"the {target} is closed" in text:
                closed.add(target)
        elif verb == "open":
            closed.discard(obj)
        elif verb == "close":
            closed.add(obj)
        elif verb == "take":
            holding = obj
        elif verb == "move":
            holding = None
        elif verb in _STATE_CHANGE:
            states[obj].add(_STATE_CHANGE[verb][1])
    return Replay(steps, dict(states), done)


# --------------------------------------------------------------------------- diagnosis


def _why_nothing(step: Step, facts: GameFacts) -> tuple[str, str]:
    """(why "Nothing happens.", what to do instead) for a rejected action."""
    verb, obj, target = parse_command(step.action)
    where = step.location or "the starting point"
    if verb == "go" and step.location == target:
        return (
            f"you were already at {target}",
            "read the current observation instead of going where you are",
        )
    if verb == "take":
        if step.holding:
            return (
                f"you were already holding the {step.holding}",
                "put down what you hold before taking another object",
            )
        if step.location != target:
            return f"you were at {where}, not at {target}", f"go to {target} before taking from it"
        return (
            f"there was no {obj} at {target}",
            f"look at what {target} holds before taking from it",
        )
    if verb == "move":
        if step.holding != obj:
            held = f"the {step.holding}" if step.holding else "nothing"
            return (
                f"you were holding {held}, not the {obj}",
                f"take the {obj} first and carry it there",
            )
        if target in step.closed:
            return f"the {target} was closed", f"open the {target} before putting anything in it"
        if step.location != target:
            return (
                f"you were at {where}, not at {target}",
                f"go to {target} before placing the object",
            )
    if verb in _STATE_CHANGE or verb == "use":
        if verb != "use" and step.holding != obj:
            return f"you were not holding the {obj}", f"take the {obj} before you {verb} it"
        if verb != "use" and step.location != target:
            return f"you were at {where}, not at {target}", f"go to {target} with the {obj} in hand"
        if verb == "use" and not step.holding:
            return (
                "you were not holding the object to look at",
                f"take the {facts.object_target} first, then use the lamp",
            )
    if step.admissible is not None and step.action not in step.admissible:
        return (
            "it was not one of the admissible actions",
            "choose an action from the admissible list",
        )
    return (
        "its preconditions did not hold",
        "check the observation for what is possible at that point",
    )


def _ordering_error(rep: Replay, facts: GameFacts) -> str | None:
    """Placing the target in its receptacle before the state change its family needs."""
    need = _STATE_CHANGE.get(facts.family)
    if need is None:
        return None
    state = need[1]
    seen: dict[str, set[str]] = collections.defaultdict(set)
    for step in rep.steps:
        if step.failed:
            continue
        verb, obj, target = parse_command(step.action)
        if verb == facts.family:
            seen[obj].add(state)
        if (
            verb == "move"
            and kind_of(obj) == facts.object_target
            and kind_of(target) == facts.parent_target
            and state not in seen[obj]
        ):
            verb_ing = {"clean": "cleaning", "heat": "heating", "cool": "cooling"}[facts.family]
            return (
                f"moving the {obj} to the {target} before {verb_ing} it: at step {step.index} it went "
                f"in without being {state}; the task is only done once the {state} {facts.object_target} is placed"
            )  # fmt: skip
    return None


def _wrong_object(rep: Replay, facts: GameFacts) -> str | None:
    if not facts.object_target:
        return None
    for step in rep.steps:
        verb, obj, target = parse_command(step.action)
        if verb == "take" and not step.failed and kind_of(obj) != facts.object_target:
            return (
                f"picking up the wrong object: at step {step.index} you took the {obj} from {target}, "
                f"but the task needs a {facts.object_target}"
            )
    return None


def _loop(rep: Replay) -> str | None:
    counts = collections.Counter(s.action for s in rep.steps if s.action)
    repeated = [(a, n) for a, n in counts.most_common() if n >= 3]
    if not repeated:
        return None
    gos = [(a, n) for a, n in repeated if a.startswith("go to ")]
    if len(gos) >= 2:
        (a, n), (b, m) = gos[:2]
        return f"going back and forth between {a[6:]} and {b[6:]} ({n + m} moves) without new information"
    action, n = repeated[0]
    return f"repeating '{action}' ({n} times) when it does not change anything"


def _milestones(facts: GameFacts) -> list[tuple[int, tuple[str, str, str]]]:
    """(plan index, command) of the expert plan's sub-goals (its non-navigation actions)."""
    out = []
    for i, action in enumerate(facts.expert_plan):
        cmd = parse_command(action)
        if cmd[0] in _EFFECTIVE and cmd[0] != "open":
            out.append((i, cmd))
    return out


def _first_unmet(rep: Replay, facts: GameFacts) -> tuple[int, tuple[str, str, str]] | None:
    """The first expert sub-goal the episode never achieved (type-level match)."""
    achieved = collections.Counter((v, kind_of(o), kind_of(t)) for v, o, t in rep.done)
    for index, (verb, obj, target) in _milestones(facts):
        key = (verb, kind_of(obj), kind_of(target))
        if achieved[key] > 0:
            achieved[key] -= 1
            continue
        return index, (verb, obj, target)
    return None


def _goal_phrase(cmd: tuple[str, str, str]) -> str:
    verb, obj, target = cmd
    return {
        "take": f"picking up the {kind_of(obj)}",
        "move": f"placing the {kind_of(obj)} in the {kind_of(target)}",
        "clean": f"cleaning the {kind_of(obj)}",
        "heat": f"heating the {kind_of(obj)}",
        "cool": f"cooling the {kind_of(obj)}",
        "use": f"turning on the {kind_of(obj)}",
    }.get(verb, f"doing '{verb} {obj}'")


def _join_steps(actions: list[str]) -> str:
    if len(actions) == 1:
        return actions[0]
    return ", ".join(actions[:-1]) + ", then " + actions[-1]


# --------------------------------------------------------------------------- skills


_FAMILY_RULE = {
    "pick": "Find the {obj} first and carry it straight to the {parent}{open_note}.",
    "look": "Pick up the {obj} and carry it to the {toggle}, then use the {toggle} while still holding the {obj}.",
    "clean": "Clean the {obj} at the sinkbasin while holding it, and only then place it in the {parent}{open_note}.",
    "heat": "Heat the {obj} with the microwave while holding it, and only then place it in the {parent}{open_note}.",
    "cool": "Cool the {obj} with the fridge while holding it, and only then place it in the {parent}{open_note}.",
    "pick2": "Carry one {obj} at a time: place the first in the {parent}{open_note}, then go back for the second.",
}


def _family_rule(facts: GameFacts, actions: list[str]) -> str:
    rule = _FAMILY_RULE.get(facts.family)
    if rule is None or not facts.object_target:
        return ""
    opened = (
        any(a.startswith(f"open {facts.parent_target}") for a in actions)
        if facts.parent_target
        else False
    )
    open_note = f", opening the {facts.parent_target} first since it is closed" if opened else ""
    return " " + rule.format(
        obj=facts.object_target,
        parent=facts.parent_target,
        toggle=facts.toggle_target,
        open_note=open_note,
    )


def success_skill(record: EpisodeFacts, rep: Replay, facts: GameFacts) -> str:
    """A workflow from the steps that mattered, the family rule and where time was lost."""
    kept: list[str] = []
    last_go: str | None = None
    here: str | None = None
    for step in rep.steps:
        if step.failed or step.action is None:
            continue
        verb = parse_command(step.action)[0]
        if verb == "go":
            last_go = step.action
        elif verb in _EFFECTIVE:
            if last_go and last_go[6:] != here:
                kept.append(last_go)
                here = last_go[6:]
            kept.append(step.action)
    kept = kept or list(facts.expert_plan)
    goal = facts.goal or task_of(record) or "complete the task"
    text = (
        f"Workflow: to {goal}, {_join_steps(kept)}."
        if kept
        else f"Workflow: to {goal}, act step by step."
    )
    text += _family_rule(facts, kept)
    rejected = next((s for s in rep.steps if s.action is not None and s.failed), None)
    if rejected is not None:
        why, fix = _why_nothing(rejected, facts)
        text += f" Note that '{rejected.action}' at step {rejected.index} did nothing because {why}: {fix}."
    n = len(record.turns)
    if n > len(kept) + 2:
        take = next((parse_command(a) for a in kept if a.startswith("take ")), None)
        source = take[2] if take else ""
        searched: list[str] = []
        for step in rep.steps:
            verb, _, dest = parse_command(step.action)
            if verb == "go" and dest != source and step.action not in kept and dest not in searched:
                searched.append(dest)
        if take and searched:
            text += (
                f" The {kind_of(take[1])} was at {source}; visiting {', '.join(searched[:3])} "
                f"first cost {n - len(kept)} extra steps."
            )
        else:
            text += (
                f" It took {n} steps where {len(kept)} suffice; skip actions that change nothing."
            )
    return text


def failure_skill(record: EpisodeFacts, rep: Replay, facts: GameFacts) -> str:
    """An avoidance rule: the first mistake found, why, and the fix from the expert plan."""
    issues: list[str] = []
    fixes: list[str] = []
    for finder in (_ordering_error, _wrong_object):
        found = finder(rep, facts)
        if found:
            issues.append(found)
    unparsed = [s for s in rep.steps if s.action is None]
    rejected = next((s for s in rep.steps if s.action is not None and s.failed), None)
    if rejected is not None:
        why, fix = _why_nothing(rejected, facts)
        issues.append(
            f"actions the environment rejects: at step {rejected.index} '{rejected.action}' gave \"Nothing happens.\" because {why}"
        )
        fixes.append(fix)
    if unparsed:
        issues.append(
            f"replies without one admissible action inside <action></action>: {len(unparsed)} of "
            f"{len(rep.steps)} replies had none (first at step {unparsed[0].index})"
        )
    loop = _loop(rep)
    if loop:
        issues.append(loop)
    unmet = _first_unmet(rep, facts)
    if not issues:
        issues.append(
            f"wandering without progress: the episode never got to {_goal_phrase(unmet[1])}"
            if unmet
            else "ending the episode before the task is verified as done"
        )
    text = "Avoid " + issues[0] + "."
    if len(issues) > 1:
        text += " Also avoid " + issues[1] + "."
    if fixes:
        text += f" Fix: {fixes[0]}."
    if unmet is not None and facts.expert_plan:
        start = unmet[0]
        go_back = [j for j in range(start) if facts.expert_plan[j].startswith("go to ")]
        rest = facts.expert_plan[go_back[-1] if go_back else start :]
        if len(rest) > MAX_PLAN_STEPS:
            rest = [
                *rest[: MAX_PLAN_STEPS - 1],
                f"... (the remaining {len(rest) - MAX_PLAN_STEPS + 1} steps)",
            ]
        text += f" Instead, starting from {_goal_phrase(unmet[1])}: {_join_steps(rest)}."
    if record.status == STATUS_MAX_STEPS:
        progress = f"before {_goal_phrase(unmet[1])}" if unmet else "before the task was done"
        text += (
            f" The {len(rep.steps)}-step budget ran out {progress}; stop repeating what failed "
            "and move on to the next sub-goal."
        )
    return text


def analyze_record(record: EpisodeFacts) -> dict[str, str]:
    """The embedded analyzer's answer for one trajectory: {"summary": ..., "skill": ...}."""
    facts = game_facts(record)
    rep = replay(record)
    n = len(record.turns)
    invalid = sum(s.failed for s in rep.steps)
    goal = facts.goal or "the task"
    if record.won:
        skill = success_skill(record, rep, facts)
        summary = f"The agent completed '{goal}' in {n} steps ({invalid} rejected actions)."
    else:
        skill = failure_skill(record, rep, facts)
        summary = f"The agent failed '{goal}' after {n} steps ({invalid} rejected actions; status {record.status})."
    return {"summary": summary, "skill": skill}


ORACLE = Oracle(analyze_record, "embedded analyzer")
