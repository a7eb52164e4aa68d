"""`seed bench analyzer`'s bookkeeping: which episodes it re-asks and how it counts them
(the engine part runs in the benchmark itself)."""

from __future__ import annotations

import pytest

from megatron_seed.benchmarks.analyzer import analysed_records, length_bin, table, tally
from megatron_seed.data import Analysis, Status, TrajectoryRecord, Turn, write_jsonl
from megatron_seed.errors import CommandError


def _record(tid: str, won: bool, valid: bool | None, tokens: int = 100, error: str | None = None):
    turn = Turn("Your task is to: put a mug in desk.", "look", [5], [-0.1])
    analysis = None
    if valid is not None:
        analysis = Analysis(tid, valid, error=error, prompt_tokens=tokens)
    return TrajectoryRecord(task_id=tid, group_id=f"u0/{tid}", game=tid, family="pick",
                            turns=[turn], won=won, reward=float(won), analysis=analysis,
                            status=Status.OK if won else Status.MAX_STEPS)  # fmt: skip


def test_it_re_asks_the_last_updates_analysed_episodes_once_each(tmp_path):
    traj = tmp_path / "run" / "stage2" / "trajectories"
    traj.mkdir(parents=True)
    write_jsonl([_record("old", True, True)], traj / "update_00000.jsonl")
    write_jsonl([_record("a", True, True), _record("a", True, True)], traj / "update_00001.jsonl")
    library = _record("lib", False, True)
    library.analysis.source = "library"  # a fixed library's skill: not the analyzer's
    write_jsonl(
        [_record("b", False, False), _record("c", False, None), library],
        traj / "update_00002.jsonl",
    )
    got = analysed_records(tmp_path / "run", last=2)
    assert [r.analysis.trajectory_id for r in got] == ["a", "b"]
    with pytest.raises(CommandError, match="not a Stage-2 run"):
        analysed_records(tmp_path / "nothing", last=2)
    write_jsonl([_record("c", False, None)], traj / "update_00003.jsonl")
    with pytest.raises(CommandError, match="last 1 updates analysed no episode"):
        analysed_records(tmp_path / "run", last=1)


def test_tally_splits_validity_by_outcome_and_prompt_length():
    assert [length_bin(n) for n in (0, 599, 600, 799, 800, 5000)] == [
        "0-599", "0-599", "600-799", "600-799", ">=800", ">=800",
    ]  # fmt: skip
    records = [
        _record("a", True, True, 300),
        _record("b", True, False, 900, "the skill has 1 word; at least 5 are required"),
        _record("c", False, True, 650),
        _record("d", False, False, 850, "the skill has 2 words; at least 5 are required"),
        _record("e", False, False, 820, 'no JSON object with a "skill" field found'),
    ]
    t = tally(records)
    assert t["all"] == {"valid": 0.4, "n": 5}
    assert t["won"] == {"valid": 0.5, "n": 2}
    assert t["lost"] == {"valid": pytest.approx(1 / 3), "n": 3}
    assert t["by_prompt_tokens"] == {
        "0-599": {"valid": 1.0, "n": 1},
        "600-799": {"valid": 1.0, "n": 1},
        ">=800": {"valid": 0.0, "n": 3},
    }
    assert t["invalid_reasons"] == {
        "the skill has N word; at least N are required": pytest.approx(1 / 3),
        "the skill has N words; at least N are required": pytest.approx(1 / 3),
        'no JSON object with a "skill" field found': pytest.approx(1 / 3),
    }
    first_ask = tally(records, {"b": 300})  # b's re-ask was longer than its first prompt
    assert first_ask["by_prompt_tokens"]["0-599"] == {"valid": 0.5, "n": 2}
    # pooled over runs: episodes weigh equally, a stratum a run lacks is skipped
    other = tally([_record("f", True, True, 300), _record("g", True, True, 310)])
    text = table({"r1": {"variants": {"as run": t}}, "r2": {"variants": {"as run": other}}})
    assert text.splitlines()[0] == (
        "| variant | all | won | lost | prompt 0-599 | prompt 600-799 | prompt >=800 |"
    )
    assert "| as run | 57 (7) | 75 (4) | 33 (3) | 100 (3) | 100 (1) | 0 (3) |" in text
