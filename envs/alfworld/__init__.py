"""ALFWorld (TextWorld + PDDL) as one environment package behind `envs.spec.EnvSpec`.

- ``env``: ``AlfWorldEnv`` on alfworld's own wrappers; game folders, families, expert plans.
- ``games``: the offline game generator (``seed games``), from what ``alfworld`` ships.
- ``prompt``: the actor prompt styles (``paper``, ``compact``) and the action parser.
- ``expert``: planner-driven demonstration players (clean and searching/noisy).
- ``oracle``: the oracle analyzer (skills from the trajectory and the game's facts).
- ``commands``: ``seed games --env alfworld``.

Nothing outside this package imports ALFWorld code or knows its prompt: the library takes
``spec()`` through ``envs.spec.get_env("alfworld")``.
"""

from __future__ import annotations

from typing import Any

from envs.spec import EnvSpec

FAMILY_COLUMNS = (
    ("pick", "Pick"),
    ("look", "Look"),
    ("clean", "Clean"),
    ("heat", "Heat"),
    ("cool", "Cool"),
    ("pick2", "Pick2"),
)  # the paper's Table 1 order


def _make_env(max_steps: int) -> Any:
    from envs.alfworld.env import AlfWorldEnv

    return AlfWorldEnv(max_steps)


def _list_tasks(root: Any, split: str | None) -> list[Any]:
    from envs.alfworld.env import find_games

    return find_games(root, split)


def _family(task: str) -> str:
    from envs.alfworld.env import game_family

    return game_family(task)


def _expert_plan(task: str) -> list[str] | None:
    from envs.alfworld.env import GameFormatError, expert_plan

    try:
        return expert_plan(task)
    except GameFormatError:
        return None


def _oracle() -> Any:
    from envs.alfworld.oracle import EmbeddedAnalyzer

    return EmbeddedAnalyzer()


def _generate(root: Any, split: str, n: int, seed: int, **options: Any) -> list[Any]:
    """``generate_games``; ``room=(receptacles, distractors)`` sets the room size."""
    from envs.alfworld.games import RoomSize, generate_games

    room = options.pop("room", None)
    return generate_games(root, split, n, seed, RoomSize(*room) if room else None, **options)


def spec() -> EnvSpec:
    """ALFWorld's environment spec."""
    from envs.alfworld.prompt import TASK_MARKER, parse_action, prompt_style

    return EnvSpec(
        name="alfworld",
        make_env=_make_env,
        list_tasks=_list_tasks,
        family=_family,
        prompts=prompt_style,
        parse_action=parse_action,
        task_marker=TASK_MARKER,
        description="a text-based household environment (ALFWorld)",
        report_columns=FAMILY_COLUMNS,
        expert_plan=_expert_plan,
        oracle_analyzer=_oracle,
        generate_tasks=_generate,
        commands="envs.alfworld.commands",
        demos="envs.alfworld.expert",
    )
