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


def test_cpu_seconds_from_a_proc_tree(tmp_path):
    """Machine busy/idle from the first line of proc/stat; per group, the utime + stime of
    the processes whose title starts with the group's (a title with spaces and parentheses
    in the comm field, another process, and a non-process entry are handled)."""
    import os

    from megatron_seed.testbed.bench_phases import cpu_snapshot, cpu_used

    hz = os.sysconf("SC_CLK_TCK")

    def proc(user: int, idle: int, engine: tuple[int, int], env: int) -> object:
        root = tmp_path / f"proc{user}"
        root.mkdir()
        # user nice system idle iowait irq softirq steal
        (root / "stat").write_text(f"cpu  {user} 0 {hz} {idle} {hz} 0 0 0\ncpu0 1 2 3 4\n")
        for pid, title, comm, ticks in (
            ("11", "ray::_EngineActor.advance", "ray::_Engine (x)", engine),
            ("12", "ray::EnvWorker.step_many", "ray::EnvWorker", (env, 0)),
            ("13", "python -m pytest", "python", (999, 999)),
        ):
            (root / pid).mkdir()
            (root / pid / "cmdline").write_bytes(title.encode() + b"\0--flag\0")
            fields = ["S"] + ["0"] * 10 + [str(ticks[0]), str(ticks[1])] + ["0"] * 5
            (root / pid / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields))
        (root / "self").mkdir()
        return root

    before = cpu_snapshot(proc(hz, 10 * hz, (hz, 0), hz))
    assert before == {"machine_busy": 2.0, "machine_idle": 11.0, "engines": 1.0, "envs": 1.0}
    after = cpu_snapshot(proc(5 * hz, 12 * hz, (2 * hz, hz), 4 * hz))
    used = cpu_used(before, after)
    assert used["cpu/machine_busy_s"] == 4.0 and used["cpu/machine_idle_s"] == 2.0
    assert used["cpu/engines_s"] == 2.0 and used["cpu/envs_s"] == 3.0
    assert used["cpu/machine_idle_share"] == pytest.approx(2 / 6)
    assert cpu_snapshot(tmp_path / "nowhere") == {} and cpu_used({}, after) == {}
