"""Measurement of a built base policy: the real agent loop with an in-process vLLM engine on
held-out games, without and with the plan as a skill."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs.spec import get_env
from megatron_seed.testbed.base_policy.settings import BasePolicySettings


def _measure_worker(
    model_dir: str, games: list[str], settings: dict[str, Any], conditions: list[list[Any]]
) -> dict[str, Any]:
    """Spawned: in-process vLLM + the real agent loop on in-process envs; success rates."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from envs.api import BatchedEnv
    from megatron_seed.config import RolloutConfig
    from megatron_seed.rollout.agent_loop import AgentLoop, Task
    from megatron_seed.rollout.engine import SamplingSpec, VLLMEngine
    from megatron_seed.testbed.base_policy.demos import _expert

    s = BasePolicySettings(**settings)
    env = get_env(s.env)
    start = time.perf_counter()
    engine = VLLMEngine(model_dir, seed=s.seed, max_model_len=s.max_position_embeddings)
    hints = _expert(s.env).eval_hints(games)
    cfg = RolloutConfig(
        max_steps=s.eval_max_steps,
        max_prompt_tokens=s.eval_max_prompt_tokens,
        max_response_tokens=48,
        history_mode=s.history_mode,  # type: ignore[arg-type]
        history_window=s.history_window,
        prompt_style=s.prompt_style,  # type: ignore[arg-type]
    )
    pool = BatchedEnv(lambda: env.make_env(s.eval_max_steps))
    results: dict[str, Any] = {}
    for hinted, temperature, group in conditions:
        tasks = [
            Task(f"eval{i}", g, env.family(g), skill=hints[g] if hinted else None)
            for i, g in enumerate(games)
        ]
        loop = AgentLoop(engine, pool, engine.tokenizer, cfg, env)
        spec = SamplingSpec(temperature=temperature, max_tokens=48, seed=s.seed)
        played = loop.run(tasks, group, spec)
        records, stats = played.records, played.stats
        name = f"{'hint' if hinted else 'no_hint'}_t{temperature:g}"
        results[name] = {
            "success": round(sum(r.won for r in records) / len(records), 4),
            "episodes": len(records),
            "mean_turns": round(stats.turns / len(records), 2),
            "invalid_actions": stats.invalid_actions,
        }
    results["seconds"] = round(time.perf_counter() - start, 1)
    return results


def measure_base_policy(
    model_dir: str | Path,
    games: Sequence[str | Path],
    settings: BasePolicySettings,
    conditions: Sequence[tuple[bool, float, int]] = ((False, 0.0, 1), (True, 0.0, 1)),
) -> dict[str, Any]:
    """Success rate of the policy on ``games`` per (hinted, temperature, episodes per game),
    in a fresh process (in-process vLLM pins the threads of its process)."""
    from megatron_seed.models.parallel import spawn

    (result,) = spawn(
        _measure_worker,
        1,
        str(model_dir),
        [str(g) for g in games],
        dataclasses.asdict(settings),
        [list(c) for c in conditions],
    )
    return result
