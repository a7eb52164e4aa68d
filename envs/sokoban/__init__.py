"""Text Sokoban (one box on a 6x6 grid) as one environment package behind `envs.api.EnvSpec`.

- ``grid``: the board, gym-sokoban's move rules and verl-agent's text rendering.
- ``rooms``: rooms from gym-sokoban's own generator, written as task files (``seed games``).
- ``solver``: the BFS that gives each room's optimal plan (the expert).
- ``env``: ``SokobanEnv`` with gym-sokoban's reward shaping.
- ``prompt``: the actor prompt styles (``paper`` = verl-agent's, ``compact``) and the parser.
- ``expert``: demonstrations (noisy BFS player, hinted plans), hints, the random baseline.
- ``oracle``: the oracle analyzer (skills from the replayed trajectory and the BFS).
- ``commands``: ``seed games --env sokoban``.

Nothing here is imported by the library: it takes ``spec()`` through
``envs.spec.get_env("sokoban")``. gym-sokoban and numpy are imported only when rooms are
generated (``rooms.room_utils``).
"""

from __future__ import annotations

from envs.api import EnvSpec, RolloutDefaults
from envs.sokoban import commands, expert, oracle, prompt
from envs.sokoban.env import DEFAULT_MAX_STEPS, SokobanEnv
from envs.sokoban.rooms import FAMILY_COLUMNS, generate_rooms, list_tasks, load_task, task_family

__all__ = ["FAMILY_COLUMNS", "spec"]


def spec() -> EnvSpec:
    """Sokoban's environment spec (``generate_tasks`` options: ``num_steps``,
    ``p_change_directions``)."""
    return EnvSpec(
        name="sokoban",
        make_env=SokobanEnv,
        list_tasks=list_tasks,
        family=task_family,
        prompt=prompt,
        description="a text Sokoban puzzle environment (one box on a 6x6 grid)",
        # verl-agent's text Sokoban: at most 15 moves, 2 turns kept in a windowed prompt
        rollout=RolloutDefaults(DEFAULT_MAX_STEPS, max_response_tokens=512, history_window=2),
        report_columns=FAMILY_COLUMNS,
        plan=lambda task: load_task(task).plan,
        oracle=oracle.ORACLE,
        generate_tasks=generate_rooms,
        command=commands,
        demos=expert,
    )
