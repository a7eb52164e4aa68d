"""``WebShopEnv``: one shopping episode on a goal file (``envs.api.Env``).

Actions are the original's (princeton-nlp/WebShop ``web_agent_site/envs/web_agent_text_env.py``
``WebAgentTextEnv.step`` at 64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd): ``name[arg]`` read
with ``(.+)\\[(.+)\\]``, the argument lower-cased.

- ``search[keywords]`` with a non-empty argument searches, from any page;
- ``click[name]`` where ``name`` is a clickable of the page (``shop.Session.clickables``) and
  not ``search`` clicks it; ``click[buy now]`` buys: the episode ends with the purchase's
  reward (``reward.get_reward``) and ``won`` = reward 1.0;
- anything else is the original's no-op: the page is unchanged, reward 0, the step counts,
  ``info["invalid"] = True``.

After ``max_steps`` actions (15, verl-agent's WebShop budget) the episode ends, reward 0.
Observations are the pages in the original's simple text mode without the instruction
(``shop.Session.render``); ``info`` carries ``won``, ``task`` (the instruction),
``admissible_actions`` (verl-agent's list: ``search[<your query>]`` on the search page, then
``click[x]`` for each clickable), ``invalid``, ``page``, ``reward``, ``category``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from envs.api import sanitize_action
from envs.webshop.reward import Reward, get_reward
from envs.webshop.shop import Session
from envs.webshop.tasks import load_task, shop_of

DEFAULT_MAX_STEPS = 15
SEARCH_PLACEHOLDER = "search[<your query>]"
_ACTION = re.compile(r"(.+)\[(.+)\]")


def parse_action(text: str) -> tuple[str, str | None]:
    """The original's ``parse_action``: (name, argument) of ``name[argument]``, else
    (text, None)."""
    m = _ACTION.match(text)
    if m is None:
        return text, None
    return m.group(1), m.group(2)


class WebShopEnv:
    """One episode at a time on a goal file (``tasks.py`` layout)."""

    def __init__(self, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.goal: dict[str, Any] = {}
        self.session: Session | None = None
        self.steps = 0
        self.done = True
        self.won = False
        self.reward: Reward | None = None

    def reset(self, game: str | os.PathLike) -> tuple[str, dict[str, Any]]:
        """Start an episode of the goal file ``game`` on the search page."""
        self.goal = load_task(game)
        self.session = Session(shop_of(game))
        self.steps, self.done, self.won, self.reward = 0, False, False, None
        return self.session.render(), self._info(invalid=False)

    def admissible_actions(self) -> list[str]:
        """verl-agent's list of the page's actions."""
        assert self.session is not None
        search = [SEARCH_PLACEHOLDER] if self.session.has_search_bar() else []
        return search + [f"click[{c}]" for c in self.session.clickables()]

    def _info(self, invalid: bool) -> dict[str, Any]:
        assert self.session is not None
        return {
            "won": self.won,
            "task": self.goal.get("instruction_text", ""),
            "admissible_actions": [] if self.done else self.admissible_actions(),
            "invalid": invalid,
            "page": self.session.page,
            "reward": self.reward.total if self.reward else 0.0,
            "category": self.goal.get("category", ""),
            "step": self.steps,
        }

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One action (see the module docstring)."""
        if self.session is None or self.done:
            raise RuntimeError("the episode is over (or never started): call reset first")
        self.steps += 1
        name, arg = parse_action(sanitize_action(action_text))
        arg = arg.lower() if arg is not None else None
        reward, invalid = 0.0, False
        if name == "search" and arg:
            self.session.search(arg)
        elif name == "click" and arg and arg != "search" and arg in self.session.clickables():
            if self.session.click(arg):
                product = self.session.product()
                self.reward = get_reward(product, self.goal, product["price"], self.session.options)
                reward, self.won, self.done = self.reward.total, self.reward.won, True
        else:
            invalid = True
        if self.steps >= self.max_steps:
            self.done = True
        observation = self.session.render()
        if self.reward is not None:
            observation += f" [SEP] Your score (min 0.0, max 1.0) [SEP] {self.reward.total:g}"
        return observation, reward, self.done, self._info(invalid)
