"""Stage 2's per-update accounting of the rollout and analysis window, from hand-made
usage snapshots (`RolloutSession.usage`)."""

from __future__ import annotations

import pytest

from megatron_seed.pipeline.accounting import accounting

SECONDS = {"rollout": 4.0, "analyze": 1.0, "train": 9.0}  # the window: 5 s


def _usage(engines, envs, busy, idle):
    return {
        "engine": [None if e is None else {"busy_s": e[0], "cpu_s": e[1]} for e in engines],
        "env": [None if e is None else {"busy_s": e[0], "cpu_s": e[1]} for e in envs],
        "machine": {"busy_s": busy, "idle_s": idle},
    }


def test_busy_idle_and_cpu_seconds_per_actor_and_the_machines_idle_share():
    before = _usage([(1.0, 10.0), (0.0, 5.0)], [(2.0, 7.0), (3.0, 1.0)], 100.0, 50.0)
    after = _usage([(3.0, 12.5), (1.0, 5.5)], [(6.0, 10.0), None], 108.0, 52.0)
    out = accounting(before, after, SECONDS)
    assert out["busy/engine0_s"] == 2.0 and out["idle/engine0_s"] == 3.0
    assert out["cpu/engine0_s"] == 2.5 and out["cpu/engine1_s"] == 0.5
    assert out["busy/env0_s"] == 4.0 and out["idle/env0_s"] == 1.0 and out["cpu/env0_s"] == 3.0
    assert "busy/env1_s" not in out and "cpu/env1_s" not in out  # no answer: left out
    assert out["cpu/machine_busy_s"] == 8.0
    assert out["cpu/machine_idle_share"] == pytest.approx(2.0 / 10.0)


def test_a_replaced_worker_counts_from_its_start_and_is_left_out():
    before = _usage([(5.0, 9.0)], [(2.0, 7.0)], 1.0, 1.0)
    after = _usage([(0.5, 0.2)], [(2.5, 7.5)], 2.0, 1.0)  # engine 0 restarted meanwhile
    out = accounting(before, after, SECONDS)
    assert not any(k.endswith("engine0_s") for k in out)
    assert out["cpu/env0_s"] == 0.5 and out["cpu/machine_idle_share"] == 0.0
    assert accounting(None, after, SECONDS) == {}
