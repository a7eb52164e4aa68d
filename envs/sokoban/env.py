"""``SokobanEnv``: one text Sokoban episode on a task file (``envs.api.Env``).

Rules and reward shaping are gym-sokoban 0.0.6's (``gym_sokoban/envs/sokoban_env.py``):
- the text actions ``up``/``down``/``left``/``right`` are its push actions 1-4 (verl-agent's
  mapping in ``sokoban/projection.py``): walk to a free cell, or push the box ahead when the
  cell behind it is free; a wall, or a box against a wall or another box, leaves the state
  unchanged;
- every step ``penalty_for_step = -0.1``; ``+1`` (``reward_box_on_target``) when a box
  reaches a target, ``-1`` (``penalty_box_off_target``) when one leaves a target; ``+10``
  (``reward_finished``) when all boxes are on targets: done and won. After ``max_steps``
  steps (15, verl-agent's Sokoban budget): done, not won. Rewards are summed in gym's order,
  so they are the same floats (-0.1, 0.9, 10.9).
- an action that is not one of the four moves is gym-sokoban's action 0 ("no operation"):
  state unchanged, -0.1, the step counts. (verl-agent maps it to its own action 0, which
  skips the environment: reward 0, no step, and charges an invalid-format penalty in the
  trainer instead.) The observation is this environment's error message followed by the
  unchanged grid, and ``info["invalid"]`` is True. (The agent loop sends the parsed move,
  or the raw reply when it did not parse; a raw reply that is a bare move word, ``"up"``,
  is executed like a move, the way ALFWorld executes a raw reply that is a command.)

Observations are verl-agent's text grid (``envs.sokoban.grid.render``). ``info`` carries
``won``, ``task`` (the goal), ``admissible_actions`` (the four moves), ``invalid``,
``moved_player``, ``moved_box`` and ``steps``.
"""

from __future__ import annotations

import os
from typing import Any

from envs.api import sanitize_action
from envs.sokoban.grid import MOVES, Room, State, boxes_on_target, render, solved, step
from envs.sokoban.rooms import load_task

GOAL = "push the box (X) onto the target (O)"
DEFAULT_MAX_STEPS = 15
PENALTY_FOR_STEP = -0.1
REWARD_BOX_ON_TARGET = 1.0
PENALTY_BOX_OFF_TARGET = -1.0
REWARD_FINISHED = 10.0


def invalid_message(text: str) -> str:
    """The environment's answer to an action that is not a move."""
    shown = sanitize_action(text, max_chars=40) or "(empty)"
    return f"Invalid action '{shown}': choose up, down, left or right. The room is unchanged:"


def normalize_move(text: str | None) -> str | None:
    """``"up"`` for ``" Up "``; None if the text is not one of the four moves."""
    move = sanitize_action(text).lower().strip(" .'\"`")
    return move if move in MOVES else None


class SokobanEnv:
    """One episode at a time on a task file (``rooms.py`` layout)."""

    def __init__(self, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.room: Room | None = None
        self.state: State | None = None
        self.steps = 0
        self.done = True
        self.task = ""

    def reset(self, game: str | os.PathLike) -> tuple[str, dict[str, Any]]:
        """Start an episode of the task file ``game``."""
        task = load_task(game)
        self.room, self.state, self.task = task.room, task.start, str(game)
        self.steps, self.done = 0, False
        info = self._info(invalid=False, moved_player=False, moved_box=False)
        return render(self.room, self.state), info

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one move (or an invalid text: a no-op that costs a step)."""
        if self.room is None or self.state is None or self.done:
            raise RuntimeError("the episode is over (or never started): call reset first")
        self.steps += 1
        move = normalize_move(action_text)
        before = boxes_on_target(self.room, self.state)
        moved_player = moved_box = False
        if move is not None:
            self.state, moved_player, moved_box = step(self.room, self.state, move)
        reward = PENALTY_FOR_STEP  # gym-sokoban's _calc_reward, in its order
        after = boxes_on_target(self.room, self.state)
        if after > before:
            reward += REWARD_BOX_ON_TARGET
        elif after < before:
            reward += PENALTY_BOX_OFF_TARGET
        won = solved(self.room, self.state)
        if won:
            reward += REWARD_FINISHED
        self.done = won or self.steps >= self.max_steps
        observation = render(self.room, self.state)
        if move is None:
            observation = f"{invalid_message(action_text)}\n{observation}"
        info = self._info(invalid=move is None, moved_player=moved_player, moved_box=moved_box)
        return observation, reward, self.done, info

    def _info(self, invalid: bool, moved_player: bool, moved_box: bool) -> dict[str, Any]:
        assert self.room is not None and self.state is not None
        return {
            "won": solved(self.room, self.state),
            "task": GOAL,
            "admissible_actions": list(MOVES),
            "invalid": invalid,
            "moved_player": moved_player,
            "moved_box": moved_box,
            "steps": self.steps,
        }
