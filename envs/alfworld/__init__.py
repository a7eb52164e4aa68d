"""ALFWorld (TextWorld + PDDL) as one environment package behind `envs.api.EnvSpec`.

- ``env``: ``AlfWorldEnv`` on alfworld's own wrappers; game folders, families, expert plans.
- ``games``: the offline game generator (``seed games``), from what ``alfworld`` ships.
- ``prompt``: the actor prompt styles (``paper``, ``compact``) and the action parser.
- ``expert``: planner-driven demonstration players (clean and searching/noisy).
- ``oracle``: the oracle analyzer (skills from the trajectory and the game's facts).
- ``commands``: ``seed games --env alfworld``.

Nothing outside this package imports ALFWorld code or knows its prompt: the library takes
``spec()`` through ``envs.spec.get_env("alfworld")``. alfworld and textworld themselves are
imported only when a game is played or written.
"""

from __future__ import annotations

from envs.alfworld import commands, expert, oracle, prompt
from envs.alfworld.env import DEFAULT_MAX_STEPS, AlfWorldEnv, expert_plan, find_games, game_family
from envs.alfworld.games import generate_games
from envs.api import EnvSpec, RolloutDefaults

FAMILY_COLUMNS = (
    ("pick", "Pick"),
    ("look", "Look"),
    ("clean", "Clean"),
    ("heat", "Heat"),
    ("cool", "Cool"),
    ("pick2", "Pick2"),
)  # the paper's Table 1 order


def spec() -> EnvSpec:
    """ALFWorld's environment spec (``generate_tasks`` takes ``room=(receptacles,
    distractors)`` for the room size)."""
    return EnvSpec(
        name="alfworld",
        make_env=AlfWorldEnv,
        list_tasks=find_games,
        family=game_family,
        prompt=prompt,
        description="a text-based household environment (ALFWorld)",
        # the paper's Table 5: 30 steps, 512 tokens a reply; verl-agent keeps 2 turns
        rollout=RolloutDefaults(DEFAULT_MAX_STEPS, max_response_tokens=512, history_window=2),
        report_columns=FAMILY_COLUMNS,
        plan=expert_plan,
        oracle=oracle.ORACLE,
        generate_tasks=generate_games,
        command=commands,
        demos=expert,
    )
