"""Engines that follow a script instead of a model: the expert (a task's plan) and a random
admissible-action policy. They speak the same `generate(prompts, spec)` interface as the
vLLM fleet and read what the environment said from the agent loop's `EpisodeView`s (never
from the rendered prompt), tokenise their answers with the policy's tokenizer and report
log-probs of 0, so the agent loop, records and sequences can be checked (and upper bounds
measured) without a model."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from megatron_seed.data.generation import Generation
from megatron_seed.rollout.agent_loop import EpisodeView


class ScriptedEngine:
    """`choose(view) -> action` wrapped as a generation engine (replies `<action>A</action>`)."""

    accepts_views = True  # the agent loop passes one EpisodeView per prompt

    def __init__(self, tokenizer: Any, choose: Callable[[EpisodeView], str]) -> None:
        self.tokenizer = tokenizer
        self.choose = choose
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(
        self, prompts: list[list[int]], spec: Any = None, *, views: list[EpisodeView]
    ) -> list[Generation]:
        """One scripted answer per prompt, ending in the EOS token like a sampled one."""
        out = []
        for _ids, view in zip(prompts, views, strict=True):
            text = f"<action>{self.choose(view)}</action>"
            token_ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos_id]
            out.append(Generation(token_ids, [0.0] * len(token_ids), text, "stop"))
        return out


def random_policy(seed: int = 0) -> Callable[[EpisodeView], str]:
    """Uniform over the admissible actions the environment listed."""
    rng = random.Random(seed)

    def choose(view: EpisodeView) -> str:
        return rng.choice(view.admissible or ["look"])

    return choose


def expert_policy(plans: dict[str, list[str]]) -> Callable[[EpisodeView], str]:
    """Follows the plan of the episode's task (`plans` keyed by task id)."""

    def choose(view: EpisodeView) -> str:
        plan = plans[view.task.task_id]
        return plan[view.step] if view.step < len(plan) else "look"

    return choose
