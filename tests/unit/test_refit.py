"""The refit check's arithmetic: per-engine mean |Δ log-prob| against the trainer's."""

from __future__ import annotations

import pytest

from megatron_seed.rollout.refit import RefitError, check_refit, probe_ids


def test_gaps_are_mean_absolute_differences_per_engine() -> None:
    reference = [-1.0, -2.0, -0.5, -3.0]
    same = [-1.0, -2.0, -0.5, -3.0]
    off = [-1.1, -1.8, -0.5, -3.0]  # |Δ| = 0.1, 0.2, 0, 0 -> mean 0.075
    metrics = check_refit(reference, [same, off], max_gap=0.1)
    assert metrics == pytest.approx({"sync/probe_gap_max": 0.075, "sync/probe_gap_mean": 0.0375})
    with pytest.raises(RefitError, match=r"engine 1 disagrees .* 0\.075 on the probe > 0\.05"):
        check_refit(reference, [same, off], max_gap=0.05)
    with pytest.raises(RefitError, match="engine 0 scored 3 probe tokens, not 4"):
        check_refit(reference, [off[:3], same], max_gap=1.0)


def test_probe_ids_are_fixed_and_ordinary() -> None:
    a = probe_ids(100, {0, 1, 2}, 64, seed=3)
    assert a == probe_ids(100, {0, 1, 2}, 64, seed=3) and len(a) == 64
    assert not {0, 1, 2} & set(a) and a != probe_ids(100, {0, 1, 2}, 64, seed=4)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        probe_ids(100, set(), 1)
