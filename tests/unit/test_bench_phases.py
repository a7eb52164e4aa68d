"""`seed bench phases`' summary: per-phase medians over updates and the ratios the
overlap target is stated in, from hand-made metrics rows; and a second bench in the same
folder, with the world and the Stage-2 runs faked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_seed.benchmarks.phases import VARIANTS, summarize


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
    # per round: seed/grpo overlap 15/11, 14/12, 16/13 -> median 16/13 (not 15/12)
    assert result["paired"]["seed/grpo overlap"] == pytest.approx(16 / 13)
    assert result["paired"]["grpo overlap/sync"] == pytest.approx(12 / 14)  # 11/12, 12/14, 13/32
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


def test_a_second_bench_in_the_same_folder_starts_its_runs_afresh(tmp_path, monkeypatch):
    """Each variant's Stage-2 run resumes its own checkpoint between rounds; a run left by
    an earlier bench must not: its metrics rows would be read as this bench's."""
    import megatron_seed.compare.job as compare_job
    import megatron_seed.models.parallel as parallel
    import megatron_seed.testbed.base_policy as base_policy
    import megatron_seed.testbed.default_job as default_job
    from megatron_seed.benchmarks.phases import run_phases

    class Fleet:
        address = "fleet"

        def __init__(self, *args):
            pass

        def get(self):
            return self

        def close(self):
            pass

    def fake_run(fn, nprocs, job):  # a resumed run plays only the updates it lacks
        path = Path(job.out_dir) / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        done = len(path.read_text().splitlines()) if path.exists() else 0
        with path.open("a") as f:
            for step in range(done + 1, job.cfg.updates + 1):
                f.write(json.dumps({"step": step, "time/rollout": 1.0, "time/train": 1.0}) + "\n")

    monkeypatch.setattr(base_policy, "build_base_policy", lambda work, **kw: work)
    monkeypatch.setattr(default_job, "_games", lambda *a: {"train": ["g0", "g1"]})
    monkeypatch.setattr(compare_job, "run_stage1", lambda *a: tmp_path / "init")
    monkeypatch.setattr(compare_job, "ray_init", lambda: None)
    monkeypatch.setattr(compare_job, "JobFleet", Fleet)
    monkeypatch.setattr(parallel, "spawn", fake_run)
    stale = tmp_path / "stage2" / "grpo-sync" / "metrics.jsonl"  # an earlier bench's run
    stale.parent.mkdir(parents=True)
    stale.write_text("".join(json.dumps({"step": s, "time/rollout": 99.0}) + "\n" for s in (1, 2)))
    result = run_phases(tmp_path, rounds=2)
    assert result["updates"] == {name: 2 for name in VARIANTS}
    assert all(m["rollout"] == 1.0 and m["work"] == 2.0 for m in result["medians"].values())
