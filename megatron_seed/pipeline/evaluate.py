"""Evaluation (without skills, unless asked): episodes on held-out tasks, success per family.

The report's columns are the environment's (`EnvSpec.report_columns`; for ALFWorld the
paper's Table 1: Pick, Look, Clean, Heat, Cool, Pick2) and their macro average over the
families present.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from megatron_seed.config import SeedConfig


def summarize(records: list) -> dict[str, Any]:
    """Success per family (fraction) and its episodes, macro average, overall success, mean
    episode length, and per game (task id) its episodes won and played."""
    out: dict[str, Any] = {"episodes": len(records)}
    per_game: dict[str, list[int]] = {}
    for r in records:
        won_played = per_game.setdefault(r.task_id, [0, 0])
        won_played[0] += int(r.won)
        won_played[1] += 1
    per, counts = {}, {}
    for fam in sorted({r.family for r in records}):
        rs = [r for r in records if r.family == fam]
        per[fam] = sum(r.won for r in rs) / len(rs)
        counts[fam] = len(rs)
    out["per_family"] = per
    out["per_family_episodes"] = counts
    out["macro_avg"] = sum(per.values()) / len(per) if per else 0.0
    out["success"] = sum(r.won for r in records) / max(1, len(records))
    out["episode_length"] = sum(len(r.turns) for r in records) / max(1, len(records))
    out["per_game"] = dict(sorted(per_game.items()))  # task id -> [won, played]
    return out


def evaluate_policies(
    model_dirs: Sequence[str | Path],
    splits: dict[str, list[str]],
    cfg: SeedConfig,
    sampled: dict[str, tuple[float, int, int]] | None = None,
    fleet: Any = None,
    skills: Mapping[str, str] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Skill-free episodes of each model on each split's games, one fleet for all (the next
    model's weights are streamed into the engines; the models must share an architecture and
    a tokenizer). Needs Ray. The environment, fleet and env workers are `cfg`'s.

    Greedy, one episode per game, unless ``sampled[split] = (temperature, episodes per game,
    seed)``: then that many sampled episodes per game, the same request seeds for every
    model (on CPU, where vLLM cannot seed single requests, the engines' streams restart at
    ``seed`` for each model and split: `Fleet.reseed`).

    ``fleet``: a running `Fleet` to use (left running) instead of starting one.
    ``skills``: {game: skill} for every game of every split: each episode plays with its
    game's skill inserted by H (Skill-Prompt*, Skill-GRPO*); None: without skills.
    ``progress``: a bar of (model, decoding) batches on the terminal."""
    from megatron_seed.progress import LiveBar
    from megatron_seed.rollout.engine import SamplingSpec
    from megatron_seed.rollout.session import RolloutSession

    results = []
    groups = _by_decoding(splits, sampled)
    with (
        RolloutSession(cfg, model_dirs[0], fleet=fleet) as session,
        LiveBar(len(model_dirs) * len(groups), "evaluation", enabled=progress) as bar,
    ):
        for i, model_dir in enumerate(model_dirs):
            if i or fleet is not None:
                session.fleet.load_model(model_dir)
            result = {}
            # splits decoded alike play as one batch (fewer, wider generation calls)
            for (temperature, n, seed), names in groups.items():
                spec = SamplingSpec(
                    temperature=temperature, max_tokens=cfg.rollout.max_response_tokens, seed=seed
                )
                session.fleet.reseed(seed)  # the same draws whatever ran on the fleet before
                games = [g for name in names for g in splits[name]]
                records = session.play(session.tasks(games, skills), n, spec, update=-1).records
                for name in names:  # records come n per task, in task order
                    result[name] = summarize(records[: n * len(splits[name])])
                    result[name]["decoding"] = f"T={temperature:g}, {n} per game"
                    records = records[n * len(splits[name]) :]
                bar.update()
            results.append({name: result[name] for name in splits})
    return results


def _by_decoding(
    splits: dict[str, list[str]], sampled: dict[str, tuple[float, int, int]] | None
) -> dict[tuple[float, int, int], list[str]]:
    """Split names grouped by (temperature, episodes per game, seed); greedy by default."""
    groups: dict[tuple[float, int, int], list[str]] = {}
    for name in splits:
        groups.setdefault((sampled or {}).get(name, (0.0, 1, 0)), []).append(name)
    return groups
