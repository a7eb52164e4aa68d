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
    fleet: Any = None,
) -> list[dict[str, Any]]:
    """Skill-free episodes of each model on each split's games, one fleet for all (the next
    model's weights are streamed into the engines; the models must share an architecture and
    a tokenizer). Needs Ray.

    Greedy, one episode per game, unless ``sampled[split] = (temperature, episodes per game,
    seed)``: then that many sampled episodes per game, the same request seeds for every
    model (on CPU, where vLLM cannot seed single requests, the engines' streams restart at
    ``seed`` for each model and split: `Fleet.reseed`).

    ``fleet``: a running `Fleet` to use (left running) instead of starting one."""
    from transformers import AutoTokenizer

    from envs.alfworld_env import game_family
    from envs.workers import EnvPool
    from megatron_seed.rollout.agent_loop import AgentLoop, Task
    from megatron_seed.rollout.engine import SamplingSpec
    from megatron_seed.rollout.fleet import Fleet

    tokenizer = AutoTokenizer.from_pretrained(str(model_dirs[0]))
    own_fleet = fleet is None
    if own_fleet:
        fleet = Fleet(str(model_dirs[0]), num_engines, engine_kwargs=engine_kwargs or {})
    pool = EnvPool(num_workers=env_workers, max_steps=rollout.max_steps)
    results = []
    try:
        loop = AgentLoop(fleet, pool, tokenizer, rollout)
        for i, model_dir in enumerate(model_dirs):
            if i or not own_fleet:
                fleet.load_model(model_dir)
            result = {}
            # splits decoded alike play as one batch (fewer, wider generation calls)
            for (temperature, n, seed), names in _by_decoding(splits, sampled).items():
                spec = SamplingSpec(
                    temperature=temperature, max_tokens=rollout.max_response_tokens, seed=seed
                )
                fleet.reseed(seed)  # the same draws whatever ran on the fleet before
                games = [g for name in names for g in splits[name]]
                tasks = [Task(Path(g).name, str(g), game_family(g)) for g in games]
                records, _ = loop.run(tasks, n, spec, update=-1)
                for name in names:  # records come n per task, in task order
                    result[name] = summarize(records[: n * len(splits[name])])
                    result[name]["decoding"] = f"T={temperature:g}, {n} per game"
                    records = records[n * len(splits[name]) :]
            results.append({name: result[name] for name in splits})
        return results
    finally:
        pool.close()
        if own_fleet:
            fleet.close()


def _by_decoding(
    splits: dict[str, list[str]], sampled: dict[str, tuple[float, int, int]] | None
) -> dict[tuple[float, int, int], list[str]]:
    """Split names grouped by (temperature, episodes per game, seed); greedy by default."""
    groups: dict[tuple[float, int, int], list[str]] = {}
    for name in splits:
        groups.setdefault((sampled or {}).get(name, (0.0, 1, 0)), []).append(name)
    return groups
