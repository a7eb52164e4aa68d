"""Refit verification: the engines hold the weights the trainer has, checked, not assumed.

After every weight sync the trainer and every engine score one fixed probe sequence (the
same token ids each time); the mean |log-prob difference| per engine is a metric, and a gap
above the configured threshold fails the update loudly, naming the engine. A mixture
of experts is scored by the trainer on each engine's own routes (routing replay), so that a
near tie its router breaks the other way does not count as a weight difference. Stale or
corrupted weights after a refit (a bucket that did not load, a restarted engine that came
back with the original checkpoint, a wrong name mapping) show up as a gap of order 0.1-10;
the same weights give ~1e-6 in float32 and ~1e-2 in bf16.
"""

from __future__ import annotations

import random


class RefitError(RuntimeError):
    """An engine's weights differ from the trainer's after a sync."""


def probe_ids(vocab: int, special: set[int], n: int, seed: int = 0) -> list[int]:
    """`n` token ids drawn with a fixed seed from the ordinary (non-special) tokens."""
    ordinary = [i for i in range(vocab) if i not in special]
    if n < 2 or not ordinary:
        raise ValueError("a refit probe needs at least 2 tokens and an ordinary vocabulary")
    rng = random.Random(seed)
    return [rng.choice(ordinary) for _ in range(n)]


def check_refit(
    reference: list[float] | list[list[float]], per_engine: list[list[float]], max_gap: float
) -> dict[str, float]:
    """Metrics of one probe; `RefitError` naming the worst engine if any gap exceeds
    `max_gap`. `reference[i]` and `per_engine[e][i]` are log p(token i+1 | tokens <= i);
    `reference` is one list for every engine, or one per engine (a mixture of experts: the
    trainer scored the probe on each engine's own routes)."""
    if reference and isinstance(reference[0], list):
        references = reference
        if len(references) != len(per_engine):
            raise ValueError(f"{len(references)} references for {len(per_engine)} engines")
    else:
        references = [reference] * len(per_engine)
    gaps = []
    for engine, (values, ref) in enumerate(zip(per_engine, references, strict=True)):
        if len(values) != len(ref):
            raise RefitError(f"engine {engine} scored {len(values)} probe tokens, not {len(ref)}")
        gaps.append(sum(abs(a - b) for a, b in zip(values, ref, strict=True)) / len(ref))
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    if gaps[worst] > max_gap:
        raise RefitError(
            f"engine {worst} disagrees with the trainer after the weight sync: mean |Δ log-prob| "
            f"{gaps[worst]:.3g} on the probe > {max_gap:g} (engines: "
            + ", ".join(f"{g:.3g}" for g in gaps)
            + ")"
        )
    return {"sync/probe_gap_max": gaps[worst], "sync/probe_gap_mean": sum(gaps) / len(gaps)}
