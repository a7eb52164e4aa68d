"""WebShop's oracle analyzer: hindsight skills from the trajectory and the goal's ground truth.

It replays the record's executed actions in a fresh ``WebShopEnv`` (the shop is
deterministic, so each step's page, results and chosen options are the episode's own) and
compares them with the goal: the target product, its attributes, options and price cap, and
the stored expert plan. It writes ``{"summary", "skill"}``:

- success: the workflow that bought the right product (the search, the product, the
  options), and the steps that were wasted (invalid actions, wrong products opened).
- failure: the first mistake in episode order (an invalid action; a search whose first page
  does not show the product; buying another product and what it lacks: an attribute, the
  price cap, the type; buying with a wrong or missing option; running out of steps) and the
  fix: the expert plan's search and the options to click.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envs.api import EpisodeFacts, Oracle, action_of
from envs.webshop.env import WebShopEnv
from envs.webshop.reward import attribute_matches, get_reward, option_matches
from envs.webshop.tasks import load_task, shop_of


@dataclass
class Step:
    """One replayed action."""

    index: int  # 1-based
    action: str | None
    invalid: bool
    page: str  # the page after it
    shown: list[str]  # asins on the results page after it
    asin: str | None  # the product open after it


def replay(record: EpisodeFacts) -> tuple[list[Step], WebShopEnv]:
    """The record's actions replayed in a fresh env (the env after the last one)."""
    env = WebShopEnv(max_steps=max(1, len(record.turns)))
    env.reset(record.game)
    steps = []
    for i, turn in enumerate(record.turns):
        action, ok = action_of(turn)
        if env.done:
            break
        _, _, _, info = env.step(action if ok and action else "")
        assert env.session is not None
        shown = list(env.session.shown()) if env.session.page == "results" else []
        executed = action if ok else None
        steps.append(
            Step(i + 1, executed, bool(info["invalid"]), env.session.page, shown, env.session.asin)
        )
    return steps, env


def _what_it_lacks(product: dict[str, Any], goal: dict[str, Any], price: float) -> str:
    reward = get_reward(product, goal, price, {})
    if reward.r_type < 1.0:
        return f"it is not a {goal['query']}"
    missing = [a for a in goal["attributes"] if attribute_matches(product, [a]) == 0]
    if missing:
        return f"it is not {missing[0]}"
    if not reward.price_ok:
        return f"it costs {price:.2f} dollars, over the {goal['price_upper']:.2f} cap"
    values = [v for vs in product["options"].values() for v in vs]
    absent = [o for o in goal["goal_options"] if option_matches(values, [o]) == 0]
    if absent:
        return f"it has no {absent[0]} option"
    return "it is another listing"


def _fix(goal: dict[str, Any]) -> str:
    plan = goal.get("plan") or []
    if not plan:
        return "Fix: search the product type with its attributes, read Features before buying."
    options = [a[len("click[") : -1] for a in plan[2:-1]]
    chosen = f", click {' and '.join(options)}" if options else ""
    return (
        f"Fix: {plan[0]}, open the product with every asked attribute under "
        f"{goal['price_upper']:.2f} dollars ({goal['asin'].lower()}){chosen}, then buy now."
    )


def _first_mistake(steps: list[Step], env: WebShopEnv, goal: dict[str, Any]) -> str:
    target = goal["asin"]
    for s in steps:
        if s.invalid:
            shown = s.action or "a reply without an <action> tag"
            return f"the invalid action '{shown}' at step {s.index}, which changed nothing"
        if s.action and s.action.startswith("search[") and target not in s.shown:
            return f"searching '{s.action[7:-1]}' at step {s.index}, whose first page did not show the right product"
    if env.reward is not None and env.session is not None:
        product = env.session.product()
        if product["asin"] != target and not env.reward.won:
            why = _what_it_lacks(product, goal, product["price"])
            return f"buying {product['asin'].lower()}, the wrong product ({why})"
        chosen = ", ".join(env.session.options.values()) or "no options"
        return f"buying with {chosen} instead of {' and '.join(goal['goal_options'])}"
    return f"using all {len(steps)} steps without buying"


def analyze_record(record: EpisodeFacts) -> dict[str, str]:
    """The oracle's answer for one trajectory: ``{"summary": ..., "skill": ...}``."""
    goal = load_task(record.game)
    shop_of(record.game)  # fail loud here on a task folder without its shop
    steps, env = replay(record)
    n = len(steps)
    score = env.reward.total if env.reward else 0.0
    if env.won:
        query = next((s.action for s in steps if s.action and s.action.startswith("search[")), "")
        options = " and ".join(env.session.options.values()) if env.session else ""
        skill = (
            f"Workflow: {query}, open {goal['asin'].lower()} (every asked attribute, under "
            f"{goal['price_upper']:.2f} dollars)"
            + (f", click {options}" if options else "")
            + ", then buy now."
        )
        wasted = [s for s in steps if s.invalid]
        opened = [s for s in steps if s.page == "item" and s.asin not in (None, goal["asin"])]
        if opened:
            skill += f" Skip opening {opened[0].asin.lower()} (step {opened[0].index}): check the title and price on the results page."
        if wasted:
            skill += f" Step {wasted[0].index} was an invalid action: use an admissible one."
        summary = f"The agent bought the right product with the right options in {n} steps."
    else:
        mistake = _first_mistake(steps, env, goal)
        skill = f"Avoid {mistake}. {_fix(goal)}"
        summary = f"The agent failed after {n} steps (score {score:.2f}): {mistake}."
    return {"summary": summary, "skill": skill}


ORACLE = Oracle(analyze_record, "webshop oracle")
