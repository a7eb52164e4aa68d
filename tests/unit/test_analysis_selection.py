"""`skill.select`: which trajectories the analyzer sees (`rollout.analyzer.selected`)."""

from __future__ import annotations

import pytest

from megatron_seed.data import Status, TrajectoryRecord, Turn
from megatron_seed.rollout.analyzer import selected


def _record(group: str, won: bool, logprobs: list[float], **overrides) -> TrajectoryRecord:
    turn = Turn("Your task is to: put a mug in desk.", "look", [5] * len(logprobs), logprobs)
    data = dict(task_id=group, group_id=f"u0/{group}", game=group, family="pick", turns=[turn], won=won,
                reward=float(won), status=Status.OK if won else Status.MAX_STEPS)  # fmt: skip
    data.update(overrides)
    return TrajectoryRecord(**data)


def _batch() -> list[TrajectoryRecord]:
    return [
        _record("a", True, [-0.1, -0.3]),  # group a: mixed outcomes
        _record("a", False, [-2.0]),
        _record("a", False, [-0.5, -0.5]),
        _record("b", False, [-1.0]),  # group b: all lost
        _record("b", False, [-3.0]),
        _record("c", True, [-0.2]),  # group c: mixed, one untrainable
        _record("c", False, [-4.0], status=Status.ENGINE_ERROR),
        _record("c", False, [-1.0], turns=[]),
    ]


def test_all_selects_every_trainable_trajectory():
    assert selected(_batch(), "all") == [True, True, True, True, True, True, False, False]


def test_mixed_groups_selects_groups_with_wins_and_losses_among_trainable_ones():
    # group c's only loss is untrainable (engine error / no turns): no contrast left
    assert selected(_batch(), "mixed_groups") == [True, True, True] + [False] * 5


def test_uncertain_selects_the_lower_mean_logprob_half_of_each_group():
    # a: means -0.2, -2.0, -0.5 -> the 2 lowest (ceil(3/2)); b: -1.0, -3.0 -> -3.0;
    # c: one trainable record -> it
    want = [False, True, True, False, True, True, False, False]
    assert selected(_batch(), "uncertain") == want


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="rule"):
        selected(_batch(), "random")
