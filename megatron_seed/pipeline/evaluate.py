"""Evaluation without skills: greedy episodes on held-out games, success per family.

The table layout follows the paper's Table 1 (ALFWorld): Pick, Look, Clean, Heat, Cool,
Pick2 and their average (the macro average over families present).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron_seed.config import RolloutConfig

FAMILY_COLUMNS = (
    ("pick", "Pick"),
    ("look", "Look"),
    ("clean", "Clean"),
    ("heat", "Heat"),
    ("cool", "Cool"),
    ("pick2", "Pick2"),
)


def summarize(records: list) -> dict[str, Any]:
    """Success per family (fraction), macro average, overall success, mean episode length."""
    out: dict[str, Any] = {"episodes": len(records)}
    per = {}
    for fam, _ in FAMILY_COLUMNS:
        rs = [r for r in records if r.family == fam]
        if rs:
            per[fam] = sum(r.won for r in rs) / len(rs)
    out["per_family"] = per
    out["macro_avg"] = sum(per.values()) / len(per) if per else 0.0
    out["success"] = sum(r.won for r in records) / max(1, len(records))
    out["episode_length"] = sum(len(r.turns) for r in records) / max(1, len(records))
    return out


def evaluate_policies(
    model_dirs: Sequence[str | Path],
    splits: dict[str, list[str]],
    rollout: RolloutConfig,
    num_engines: int = 2,
    env_workers: int = 2,
    engine_kwargs: dict | None = None,
    sampled: dict[str, tuple[float, int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Skill-free episodes of each model on each split's games, one fleet for all (the next
    model's weights are streamed into the engines; the models must share an architecture and
    a tokenizer). Needs Ray.

    Greedy, one episode per game, unless ``sampled[split] = (temperature, episodes per game,
    seed)``: then that many sampled episodes per game, the same request seeds for every
    model (on CPU the engine's own seed: vLLM's CPU sampler cannot seed single requests)."""
    from transformers import AutoTokenizer

    from envs.alfworld_env import game_family
    from envs.workers import EnvPool
    from megatron_seed.models.convert import HFCheckpoint
    from megatron_seed.rollout.agent_loop import AgentLoop, Task
    from megatron_seed.rollout.engine import SamplingSpec
    from megatron_seed.rollout.fleet import Fleet

    tokenizer = AutoTokenizer.from_pretrained(str(model_dirs[0]))
    fleet = Fleet(str(model_dirs[0]), num_engines, engine_kwargs=engine_kwargs or {})
    pool = EnvPool(num_workers=env_workers, max_steps=rollout.max_steps)
    results = []
    try:
        loop = AgentLoop(fleet, pool, tokenizer, rollout)
        for i, model_dir in enumerate(model_dirs):
            if i:
                ckpt = HFCheckpoint(model_dir)
                fleet.update_weights((name, ckpt.get(name)) for name in ckpt.names())
            result = {}
            for split, games in splits.items():
                temperature, n, seed = (sampled or {}).get(split, (0.0, 1, 0))
                spec = SamplingSpec(
                    temperature=temperature, max_tokens=rollout.max_response_tokens, seed=seed
                )
                tasks = [Task(Path(g).name, str(g), game_family(g)) for g in games]
                records, _ = loop.run(tasks, n, spec, update=-1)
                result[split] = summarize(records)
                result[split]["decoding"] = f"T={temperature:g}, {n} per game"
            results.append(result)
        return results
    finally:
        pool.close()
        fleet.close()
