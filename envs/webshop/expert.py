"""WebShop demonstrations (the CPU test bed clones its base policy from them), hints, and
the random baseline.

- clean: the stored expert plan (search, the target's link, its options, Buy Now).
- noisy: the plan with recoverable mistakes, each with probability ``mistake_prob`` (at most
  ``max_mistakes``, only while the step budget leaves room): on the results page, opening a
  near miss shown there (or another product) and going back with ``< Prev``; on the item
  page, clicking a wrong value of an option before the right one. Every demo wins.
- ``eval_hints``: the plan stated as a hint; ``reply_text``: ``<action>...</action>``;
  ``random_reply``: a uniformly random admissible action (a search of 1-4 random words of
  the instruction on the search page).

Every demo is played in the real ``WebShopEnv``.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence
from typing import Any

from envs.demos import Demo, DemoSettings  # the test bed reads them here (`EnvSpec.demos`)
from envs.webshop.env import DEFAULT_MAX_STEPS, SEARCH_PLACEHOLDER, WebShopEnv
from envs.webshop.tasks import expert_plan, load_task

DEFAULT_SETTINGS = DemoSettings(mistake_prob=0.3, max_mistakes=2, max_demo_steps=DEFAULT_MAX_STEPS)


def reply_text(action: str) -> str:
    """The model reply that demonstrates ``action``."""
    return f"<action>{action}</action>"


def random_reply(
    goal: str, observation: str, admissible: Sequence[str] | None, rng: random.Random
) -> str:
    """A uniformly random admissible action (a search of random instruction words)."""
    action = rng.choice(list(admissible or [SEARCH_PLACEHOLDER]))
    if action == SEARCH_PLACEHOLDER:
        words = re.findall(r"[a-z0-9']+", goal.lower()) or ["product"]
        length = rng.randint(1, 4)
        start = rng.randrange(max(1, len(words) - length + 1))
        action = f"search[{' '.join(words[start : start + length])}]"
    return reply_text(action)


def plan_hint(task: dict[str, Any]) -> str:
    """A skill that states the plan."""
    plan = task.get("plan") or []
    if not plan:
        return "Search with the product type and its key attributes, open the product that has them all within budget, choose the asked options, then buy."
    query = plan[0][len("search[") : -1]
    options = [a[len("click[") : -1] for a in plan[2:-1]]
    chosen = f", click {' and '.join(options)}" if options else ""
    return (
        f"Search '{query}', open {plan[1][len('click[') : -1]} (it has every asked attribute "
        f"and costs less than {task['price_upper']:.2f} dollars){chosen}, then click buy now."
    )


def _play(env: WebShopEnv, game: str, actions: Any) -> Demo:
    """Play ``actions(observation, info, step) -> (action, is_mistake)`` to the end."""
    observation, info = env.reset(game)
    demo = Demo(str(game), info["task"], [], [], [])
    for index in range(env.max_steps):
        demo.observe(observation, info)
        action, mistake = actions(observation, info, index)
        demo.mistakes += int(mistake)
        demo.actions.append(action)
        observation, _, done, info = env.step(action)
        demo.final_observation = observation
        if done:
            break
    demo.won = bool(info["won"])
    return demo


def _noisy(game: str, plan: list[str], settings: DemoSettings, rng: random.Random, budget: int):
    task = load_task(game)
    queue = list(plan)
    pending: list[str] = []
    made = [0]
    misses = [a.lower() for a in (task.get("near_misses") or {}).values()]

    def choose(observation: str, info: dict[str, Any], index: int) -> tuple[str, bool]:
        if pending:
            return pending.pop(0), False
        left = budget - index
        can = made[0] < settings.max_mistakes and left >= len(queue) + 2
        nxt = queue[0]
        admissible = info["admissible_actions"]
        if can and rng.random() < settings.mistake_prob:
            if info["page"] == "results" and nxt.startswith("click[b"):
                shown = [a for a in admissible if a.startswith("click[b") and a != nxt]
                near = [a for a in shown if a[len("click[") : -1] in misses]
                if near or shown:
                    made[0] += 1
                    pending.append("click[< prev]")
                    return rng.choice(near or shown), True
            if info["page"] == "item" and len(plan) > 3 and nxt == plan[2]:  # options to come
                fixed = {"click[back to search]", "click[< prev]", "click[buy now]"}
                fixed |= {f"click[{p}]" for p in ("description", "features", "reviews")}
                wrong = [a for a in admissible if a not in fixed and a not in plan]
                if wrong:
                    made[0] += 1
                    return rng.choice(wrong), True
        return queue.pop(0), False

    return choose


def game_demos(game: str, index: int, settings: DemoSettings) -> list[Demo]:
    """``noisy_per_game`` noisy demos, then ``hinted_per_game`` clean ones with the plan as
    hint; deterministic per (settings.seed, index); every demo wins (RuntimeError
    otherwise)."""
    plan = expert_plan(game)
    if not plan:
        raise ValueError(f"{game} has no expert plan")
    budget = max(min(settings.max_demo_steps, DEFAULT_MAX_STEPS), len(plan))
    env = WebShopEnv(max_steps=budget)
    rng = random.Random(f"webshop-demos:{settings.seed}:{index}")
    demos = [
        _play(env, game, _noisy(game, plan, settings, rng, budget))
        for _ in range(settings.noisy_per_game)
    ]
    clean = _play(env, game, lambda obs, info, i: (plan[i], False))
    hint = plan_hint(load_task(game))
    demos += [dataclasses.replace(clean, hint=hint) for _ in range(settings.hinted_per_game)]
    if any(not d.won for d in demos):
        raise RuntimeError(f"a demonstration of {game} did not win in {budget} steps")
    return demos


def eval_hints(games: Sequence[str]) -> dict[str, str]:
    """Task -> the plan as a hint."""
    return {str(g): plan_hint(load_task(g)) for g in games}
