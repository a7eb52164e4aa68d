"""WebShop (Yao et al., 2022) behind `envs.api.EnvSpec`, built clean-room with the
original's semantics over a generated catalogue, or over the official data files.

- ``reward``: the original's ``get_reward`` (type, attributes, options, price).
- ``catalog``: the generated products and goals (five categories, near misses).
- ``shop``: products from the original's file formats, bm25s search, the pages.
- ``env``: ``WebShopEnv`` (``search[...]`` / ``click[...]``, 15 steps).
- ``tasks``: task folders (generate, list, read); ``official``: the official files.
- ``prompt``: ``paper`` (verl-agent's WebShop prompt) and ``compact``; the parser.
- ``expert``: demonstrations, hints, random; ``oracle``: skills from the replayed episode.
- ``commands``: ``seed games --env webshop``.

bm25s is imported only when a shop is built.
"""

from __future__ import annotations

from envs.api import EnvSpec, RolloutDefaults
from envs.webshop import commands, expert, oracle, prompt
from envs.webshop.catalog import CATEGORIES
from envs.webshop.env import DEFAULT_MAX_STEPS, WebShopEnv
from envs.webshop.tasks import expert_plan, generate_tasks, list_tasks, task_family

REPORT_COLUMNS = tuple((c, c.capitalize()) for c in CATEGORIES)  # the original's categories


def spec() -> EnvSpec:
    """WebShop's environment spec (``generate_tasks`` option: ``targets_per_type``)."""
    return EnvSpec(
        name="webshop",
        make_env=WebShopEnv,
        list_tasks=list_tasks,
        family=task_family,
        prompt=prompt,
        description="a web shopping environment (WebShop): search, read product pages, buy",
        # verl-agent's WebShop: 15 steps, 2 pairs kept in a windowed prompt; 512 tokens a reply
        rollout=RolloutDefaults(DEFAULT_MAX_STEPS, max_response_tokens=512, history_window=2),
        report_columns=REPORT_COLUMNS,
        plan=expert_plan,
        oracle=oracle.ORACLE,
        generate_tasks=generate_tasks,
        command=commands,
        demos=expert,
    )
