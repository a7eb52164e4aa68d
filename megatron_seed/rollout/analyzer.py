"""The on-policy analyzer: the fleet (theta_old) turns finished episodes into skills.

Requests come from `megatron_seed.skills` (prompt layouts, lenient parsing, validation,
retries that quote the error); their token ids from `data.requests.request_ids`. This
module only decodes them with the fleet.
"""

from __future__ import annotations

from typing import Any

from megatron_seed.config import SkillConfig
from megatron_seed.data import TrajectoryRecord
from megatron_seed.data.requests import request_ids


def selected(records: list[TrajectoryRecord], rule: str = "all") -> list[bool]:
    """Which of `records` to analyse (`skill.select`; the others train without a teacher):

    all: every trainable record (the paper);
    mixed_groups: the records of groups (same `group_id`) whose outcomes differ (some won,
        some did not), where a hindsight contrast exists;
    uncertain: per group, the half (rounded up) with the lowest mean sampled-token log-prob.
    Records without turns or of an untrainable status are never selected.
    """
    ok = [r.trainable for r in records]
    if rule == "all":
        return ok
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r.group_id, []).append(i)
    chosen = [False] * len(records)
    for members in groups.values():
        if rule == "mixed_groups":
            wins = {records[i].won for i in members if ok[i]}
            for i in members:
                chosen[i] = ok[i] and len(wins) == 2
        elif rule == "uncertain":
            live = [i for i in members if ok[i]]
            live.sort(key=lambda i: _mean_logprob(records[i]))
            for i in live[: (len(live) + 1) // 2]:
                chosen[i] = True
        else:
            raise ValueError(f"unknown analysis selection rule {rule!r}")
    return chosen


def _mean_logprob(record: TrajectoryRecord) -> float:
    values = [x for t in record.turns for x in t.logprobs]
    return sum(values) / max(1, len(values))


def apply_analysis(records: list[TrajectoryRecord], results: list[Any]) -> dict[str, float]:
    """Set `skill` and `analysis` of the analysed `records` from their `results` (same
    order); return the analysis metrics (validity rate, retries, skill length, tokens)."""
    from megatron_seed.skills.parse import analysis_metrics, apply_results

    for record, done in zip(records, apply_results(records, results), strict=True):
        record.skill, record.analysis = done.skill, done.analysis
    metrics = analysis_metrics(results)
    metrics["analyze/prompt_tokens"] = float(sum(r.prompt_tokens for r in results))
    metrics["analyze/completion_tokens"] = float(sum(r.completion_tokens for r in results))
    return metrics


def analyze_records(
    fleet: Any,
    tokenizer: Any,
    records: list[TrajectoryRecord],
    cfg: SkillConfig,
    max_prompt_tokens: int | None = None,
) -> dict[str, float]:
    """Fill `skill` and `analysis` of the `cfg.select`ed records in place (all trainable
    ones by default); return the analysis metrics (validity rate, retries, skill length,
    tokens, the share selected)."""
    from megatron_seed.data.generation import Generation
    from megatron_seed.rollout.engine import SamplingSpec
    from megatron_seed.skills.parse import analyze_with_retries

    trainable = [r for r in records if r.trainable]
    chosen = [r for r, c in zip(records, selected(records, cfg.select), strict=True) if c]
    spec = SamplingSpec(temperature=cfg.temperature, max_tokens=cfg.max_tokens)

    def generate(requests: list) -> list:
        prompts = [request_ids(tokenizer, q) for q in requests]
        ok = [
            i
            for i, p in enumerate(prompts)
            if max_prompt_tokens is None or len(p) <= max_prompt_tokens
        ]
        outs: list = [Generation(error="analyzer prompt exceeds the engine's context")] * len(
            prompts
        )
        if ok:
            gens = fleet.generate([prompts[i] for i in ok], spec)
            for i, g in zip(ok, gens, strict=True):
                outs[i] = Generation(
                    text=g.text,
                    prompt_tokens=len(prompts[i]),
                    completion_tokens=len(g.token_ids),
                    finish_reason=g.finish_reason,
                )
        return outs

    results = analyze_with_retries(generate, chosen, cfg)
    metrics = apply_analysis(chosen, results)
    metrics["analyze/selected_share"] = len(chosen) / max(1, len(trainable))
    return metrics
