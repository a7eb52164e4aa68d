"""Sokoban's oracle analyzer: hindsight skills from the trajectory and the task's ground truth.

For offline Stage 1 without an analyzer endpoint. It reads the task file named by
``record.game`` (room, start, BFS-optimal plan), replays the record's executed actions with
the environment's own rules (``envs.sokoban.grid.step``, ``env.normalize_move``), measures
after each move how far the BFS says the box still is from solved, and writes the reply an
analyzer would: JSON ``{"summary": ..., "skill": ...}`` (10-80 words).

- success: the plan that worked (the moves that changed the room), where the box and the
  target were, the pushing principle (stand on the side opposite to the push), and the
  shorter optimal plan when the episode wasted moves.
- failure: the first mistake the replay finds, in the order it happened: a reply without a
  valid ``<action>`` (the turn was lost), a move into a wall or a blocked push (no effect),
  a push after which the BFS cannot solve the room (deadlock: where the box got stuck), or
  a move that does not bring the room closer to solved (wandering: more moves than the
  optimal). The fix: the moves before the mistake (all optimal, since it is the first) and
  the BFS plan from the last solvable state before it, which together are an optimal plan
  from the start.

Deterministic. A record whose task file cannot be read, or whose replay disagrees with the
record's outcome, raises (the analyzer reports it as a failed generation).
"""

from __future__ import annotations

from dataclasses import dataclass

from envs.api import EpisodeFacts, Oracle
from envs.sokoban.env import normalize_move
from envs.sokoban.expert import PUSH_RULE
from envs.sokoban.grid import DELTAS, Pos, Room, State, cell_name, corner_deadlock, solved, step
from envs.sokoban.rooms import load_task
from envs.sokoban.solver import solve

MAX_SKILL_WORDS = 80
_STAND = {"left": "right of", "right": "left of", "up": "below", "down": "above"}


@dataclass
class Move:
    """One replayed step: the move (None: invalid reply), and the states around it."""

    index: int  # 1-based
    move: str | None
    valid: bool
    before: State
    after: State
    moved: bool
    pushed: bool
    togo_before: int | None  # BFS distance to solved before the move (None: unsolvable)
    togo_after: int | None


def replay(record: EpisodeFacts, room: Room, start: State) -> list[Move]:
    """The record's executed actions through the environment's rules."""
    state, out = start, []
    first = solve(room, state)
    togo = None if first is None else len(first)
    for i, turn in enumerate(record.turns):
        move = normalize_move(turn.executed) if turn.executed else None
        after, moved, pushed = (state, False, False) if move is None else step(room, state, move)
        plan = solve(room, after)
        togo_after = None if plan is None else len(plan)
        out.append(Move(i + 1, move, turn.valid, state, after, moved, pushed, togo, togo_after))
        state, togo = after, togo_after
        if solved(room, state):
            break
    return out


def _box_of(state: State) -> Pos:
    return min(state.boxes)


def _first_mistake(moves: list[Move], room: Room) -> tuple[Move, str] | None:
    """(the step, a description) of the first move that did not progress."""
    for m in moves:
        if not m.valid or m.move is None:
            return m, (
                f"replies without a move: at step {m.index} the reply held no "
                "<action>up|down|left|right</action>, so the turn was lost"
            )
        if not m.moved:
            dr, dc = DELTAS[m.move]
            ahead = (m.before.player[0] + dr, m.before.player[1] + dc)
            if ahead in m.before.boxes:
                what = f"pushed the box at {cell_name(ahead)} against a wall"
            else:
                what = f"walked into the wall at {cell_name(ahead)}"
            return m, f"useless moves: at step {m.index} '{m.move}' {what} and had no effect"
        if m.togo_after is None and m.togo_before is not None:
            box = _box_of(m.after)
            where = "into a corner" if corner_deadlock(room, box) else "against a wall"
            return m, (
                f"dead pushes: at step {m.index} '{m.move}' pushed the box {where} at "
                f"{cell_name(box)}, from where it can never reach the target"
            )
        before, after = m.togo_before, m.togo_after
        if before is not None and after is not None and after >= before:
            return m, (
                f"wandering: at step {m.index} '{m.move}' led away from the shortest "
                f"plan ({before} moves were left before it, {after} after)"
            )
    return None


def _fit(sentences: list[str]) -> str:
    """The sentences, in order, that fit in ``MAX_SKILL_WORDS`` (the first always)."""
    text = sentences[0]
    for sentence in sentences[1:]:
        candidate = f"{text} {sentence}"
        if len(candidate.split()) > MAX_SKILL_WORDS:
            break
        text = candidate
    return text


def _where(room: Room, start: State) -> str:
    target = min(room.targets)
    return (
        f"The box starts at {cell_name(_box_of(start))}, the target is at {cell_name(target)}"
        f" and you start at {cell_name(start.player)}."
    )


def _principle(pushes: list[str]) -> str:
    sides = [f"stand {_STAND[d]} the box to push it {d}" for d in dict.fromkeys(pushes)]
    return "Push from the opposite side: " + ", then ".join(sides) + "." if sides else PUSH_RULE


def success_skill(moves: list[Move], room: Room, start: State) -> str:
    """The plan that worked, where things were, the principle, the optimal plan if shorter."""
    worked = [m.move for m in moves if m.moved and m.move is not None]
    pushes = [m.move for m in moves if m.pushed and m.move is not None]
    optimal = solve(room, start) or []
    sentences = [f"Plan that worked: {', '.join(worked)}.", _where(room, start), _principle(pushes)]
    if len(moves) > len(optimal):
        sentences.insert(
            1,
            f"It took {len(moves)} steps; the shortest plan is {len(optimal)} moves: "
            f"{', '.join(optimal)}.",
        )
    return _fit(sentences)


def failure_skill(moves: list[Move], room: Room, start: State) -> str:
    """The first mistake and the fix (the optimal moves before it, the BFS plan after)."""
    found = _first_mistake(moves, room)
    optimal = solve(room, start) or []
    if found is None:
        done = [m.move for m in moves if m.move is not None]
        last = moves[-1].after if moves else start
        rest = solve(room, last) or []
        head = f"Avoid stopping early: the episode ended after {len(moves)} moves, before the box reached the target."
        fix = f"Fix: keep following the plan {', '.join(done + rest)}; {len(rest)} moves were left."
        return _fit([head, fix, _where(room, start), PUSH_RULE])
    mistake, what = found
    prefix = [m.move for m in moves[: mistake.index - 1] if m.move is not None]
    rest = solve(room, mistake.before) or []
    if prefix:
        fix = (
            f"Fix: play {', '.join(prefix + rest)} ({len(prefix) + len(rest)} moves): the first "
            f"{len(prefix)} moves were right, then {', '.join(rest)}."
        )
    else:
        fix = f"Fix: from the start play {', '.join(optimal)} ({len(optimal)} moves)."
    pushes = _pushes_of(room, start, prefix + rest)
    return _fit([f"Avoid {what}.", fix, _where(room, start), _principle(pushes)])


def _pushes_of(room: Room, start: State, plan: list[str]) -> list[str]:
    state, pushes = start, []
    for move in plan:
        state, _, pushed = step(room, state, move)
        if pushed:
            pushes.append(move)
    return pushes


def analyze_record(record: EpisodeFacts) -> dict[str, str]:
    """The oracle's answer for one trajectory: {"summary": ..., "skill": ...}."""
    task = load_task(record.game)
    moves = replay(record, task.room, task.start)
    won = bool(moves) and solved(task.room, moves[-1].after)
    if won != bool(record.won):
        raise ValueError(
            f"replaying the record's actions {'wins' if won else 'does not win'} {record.game}, "
            f"but the record says won={record.won}"
        )
    wasted = sum(
        1
        for m in moves
        if m.togo_before is None or m.togo_after is None or m.togo_after >= m.togo_before
    )
    n, optimal = len(moves), len(task.plan)
    if won:
        skill = success_skill(moves, task.room, task.start)
        summary = f"The agent solved the room in {n} steps ({wasted} wasted; optimal {optimal})."
    else:
        skill = failure_skill(moves, task.room, task.start)
        summary = (
            f"The agent failed after {n} steps ({wasted} wasted moves; the optimal plan has "
            f"{optimal}); status {record.status}."
        )
    return {"summary": summary, "skill": skill}


ORACLE = Oracle(analyze_record, "sokoban oracle", ensure_ascii=False)  # the grid's "√" as it is
