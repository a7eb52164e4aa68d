"""`seed bench phases`' summary: per-phase medians over updates and the ratios the
overlap target is stated in, from hand-made metrics rows."""

from __future__ import annotations

import pytest

from megatron_seed.testbed.bench_phases import VARIANTS, summarize


def _row(rollout: float, analyze: float, train: float, **extra: float) -> dict[str, float]:
    row = {"time/rollout": rollout, "time/train": train, "time/sync": 1.0, **extra}
    if analyze:
        row["time/analyze"] = analyze
    return row


def test_cpu_seconds_are_summed_over_the_actors():
    cpu = {"cpu/engine0_s": 1.0, "cpu/engine1_s": 2.0, "cpu/env0_s": 4.0, "cpu/env1_s": 5.0}
    cpu["cpu/envs_total_s"] = 100.0  # not an actor's: left out of the sums
    rows = {name: [_row(1, 0, 1, **cpu)] for name in VARIANTS}
    rows["grpo/sync"].append(_row(1, 0, 1, **{**cpu, "cpu/engine0_s": 3.0}))  # engines 5
    med = summarize(rows)["medians"]
    assert med["seed/sync"]["cpu/engines_s"] == 3.0 and med["seed/sync"]["cpu/envs_s"] == 9.0
    assert med["grpo/sync"]["cpu/engines_s"] == 4.0  # median of 3 and 5


def test_medians_and_ratios_by_hand():
    rows = {
        "grpo/sync": [_row(10, 0, 2), _row(12, 0, 2), _row(30, 0, 2)],  # work 12, 14, 32
        "seed/sync": [_row(10, 5, 3), _row(11, 4, 3), _row(9, 6, 3)],  # 18, 18, 18
        "grpo/overlap": [_row(9, 0, 2), _row(10, 0, 2), _row(11, 0, 2)],  # 11, 12, 13
        "seed/overlap": [
            _row(12, 0, 3, **{"overlap/analysis_tail_s": 1.0}),
            _row(11, 0, 3, **{"overlap/analysis_tail_s": 3.0}),
            _row(13, 0, 3, **{"overlap/analysis_tail_s": 2.0}),
        ],  # 15, 14, 16
    }
    assert set(rows) == set(VARIANTS)
    result = summarize(rows)
    med = result["medians"]
    assert med["grpo/sync"]["rollout"] == 12 and med["grpo/sync"]["work"] == 14
    assert med["seed/sync"]["analyze"] == 5 and med["seed/sync"]["work"] == 18
    assert med["seed/overlap"]["analysis_tail"] == 2.0 and "analysis_tail" not in med["grpo/sync"]
    assert med["seed/overlap"]["sync"] == 1.0
    ratios = result["ratios"]
    assert ratios["seed/grpo sync"] == pytest.approx(18 / 14)
    assert ratios["seed/grpo overlap"] == pytest.approx(15 / 12)
    assert ratios["grpo overlap/sync"] == pytest.approx(12 / 14)
    assert ratios["seed overlap/sync"] == pytest.approx(15 / 18)
    assert result["updates"] == {name: 3 for name in VARIANTS}


def test_an_extra_variant_is_compared_with_its_method_and_with_grpo():
    rows = {
        "grpo/sync": [_row(10, 0, 2)],
        "seed/sync": [_row(10, 4, 3)],
        "grpo/overlap": [_row(8, 0, 2)],  # work 10
        "seed/overlap": [_row(9, 0, 3)],  # 12
        "seed/overlap-mixed": [_row(8, 0, 3, **{"analyze/selected_share": 0.5})],  # 11
    }
    result = summarize(rows)
    ratios = result["ratios"]
    assert ratios["seed/overlap-mixed/seed/overlap"] == pytest.approx(11 / 12)
    assert ratios["seed/overlap-mixed/grpo/overlap"] == pytest.approx(11 / 10)
    assert result["medians"]["seed/overlap-mixed"]["analyze/selected_share"] == 0.5
    assert "seed/overlap-mixed/grpo/overlap" in ratios and len(ratios) == 6
