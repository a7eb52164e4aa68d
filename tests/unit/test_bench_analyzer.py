"""`seed bench analyzer`: which episodes it re-asks, under which settings, and how it counts
them (a fake engine stands in for vLLM; the benchmark itself runs the real one)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from megatron_seed.benchmarks import analyzer as probe
from megatron_seed.benchmarks.synthetic import synthetic_records
from megatron_seed.config import SeedConfig, SkillConfig
from megatron_seed.data import Analysis, Status, TrajectoryRecord, Turn, write_jsonl
from megatron_seed.errors import CommandError
from megatron_seed.models.tiny_tokenizer import build_tokenizer
from megatron_seed.pipeline.stage1 import answer_text
from megatron_seed.skills.prompt import record_prompt


def _record(tid: str, won: bool, valid: bool | None, error: str | None = None):
    turn = Turn("Your task is to: put a mug in desk.", "look", [5], [-0.1])
    analysis = None if valid is None else Analysis(tid, valid, error=error)
    return TrajectoryRecord(task_id=tid, group_id=f"u0/{tid}", game=tid, family="pick",
                            turns=[turn], won=won, reward=float(won), analysis=analysis,
                            status=Status.OK if won else Status.MAX_STEPS)  # fmt: skip


def test_it_re_asks_every_episode_the_last_updates_analysed(tmp_path):
    traj = tmp_path / "run" / "stage2" / "trajectories"
    traj.mkdir(parents=True)
    with pytest.raises(CommandError, match=r"no stage2/config\.json"):
        probe.check_run(tmp_path / "run", 2)
    write_jsonl([_record("old", True, True)], traj / "update_00000.jsonl")
    # identical episodes share a trajectory id; the run analysed (and counted) both
    write_jsonl([_record("a", True, True), _record("a", True, True)], traj / "update_00001.jsonl")
    library = _record("lib", False, True)
    library.analysis.source = "library"  # a fixed library's skill: not the analyzer's
    write_jsonl(
        [_record("b", False, False), _record("c", False, None), library],
        traj / "update_00002.jsonl",
    )
    got = probe.analysed_records(tmp_path / "run", last=2)
    assert [r.analysis.trajectory_id for r in got] == ["a", "a", "b"]
    write_jsonl([_record("c", False, None)], traj / "update_00003.jsonl")
    with pytest.raises(CommandError, match="last 1 updates analysed no episode"):
        probe.analysed_records(tmp_path / "run", last=1)


def test_tally_splits_validity_by_outcome_and_first_prompt_length():
    assert [probe.length_bin(n) for n in (0, 599, 600, 799, 800, 5000)] == [
        "0-599", "0-599", "600-799", "600-799", ">=800", ">=800",
    ]  # fmt: skip
    records = [
        _record("a", True, True),
        _record("b", True, False, "the skill has 1 word; at least 5 are required"),
        _record("c", False, True),
        _record("d", False, False, "the skill has 2 words; at least 5 are required"),
        _record("e", False, False, 'no JSON object with a "skill" field found'),
    ]
    t = probe.tally(records, [300, 900, 650, 850, 820])
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
    # pooled over runs: episodes weigh equally, a stratum a run lacks is skipped
    other = probe.tally([_record("f", True, True), _record("g", True, True)], [300, 310])
    text = probe.table({"r1": {"variants": {"as run": t}}, "r2": {"variants": {"as run": other}}})
    assert text.splitlines()[0] == (
        "| variant | all | won | lost | prompt 0-599 | prompt 600-799 | prompt >=800 |"
    )
    assert "| as run | 57 (7) | 75 (4) | 33 (3) | 100 (3) | 100 (1) | 0 (3) |" in text


class _Engine:
    """Answers an analysis with a valid skill only when sampling (T > 0) or on a re-ask
    (the prompt quotes the parse error), else with a one-word skill; logs every ask."""

    def __init__(self, tokenizer):
        self.tok, self.asks = tokenizer, []

    def generate(self, prompts, spec):
        outs = []
        for p in prompts:
            reask = "the skill has 1 word" in self.tok.decode(p)  # the quoted error
            self.asks.append((len(p), spec.temperature, spec.max_tokens, reask))
            skill = "go to the desk then put the mug" if spec.temperature or reask else "go"
            outs.append(SimpleNamespace(text=answer_text("s", skill), token_ids=[0] * 9,
                                        finish_reason="stop"))  # fmt: skip
        return outs


def test_probe_asks_the_same_episodes_under_each_variant(tmp_path, monkeypatch):
    seed_tok = build_tokenizer(["hello world"], 300)
    draft = synthetic_records(seed_tok, groups=3, group_size=2, turns=2, seed=1)
    corpus = [record_prompt(r) for r in draft] + [answer_text("s", r.skill) for r in draft]
    run = tmp_path / "seed-seed0"
    model = run / "stage2" / "final_hf"
    tok = build_tokenizer(corpus * 2, 1024, model)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    # the run analysed uncertain episodes only, greedily, without re-asks
    skill = SkillConfig(select="uncertain", max_retries=0, max_tokens=64)
    SeedConfig(skill=skill).save(run / "stage2" / "config.json")
    records = synthetic_records(tok, groups=3, group_size=2, turns=2, seed=1)
    for i, r in enumerate(records):
        r.analysis = Analysis(f"t{i}", valid=True)
    records[0].analysis.source = "library"  # not the analyzer's: not re-asked
    (run / "stage2" / "trajectories").mkdir()
    write_jsonl(records, run / "stage2" / "trajectories" / "update_00000.jsonl")

    engine = _Engine(tok)
    monkeypatch.setattr("megatron_seed.rollout.engine.VLLMEngine.from_spec", lambda *a, **k: engine)
    got = probe.probe_run(run, last=1, variants=probe.VARIANTS)
    assert got["episodes"] == 5 and got["too_long"] == 0
    v = got["variants"]
    # every variant asks about all 5 (the run's selection is not made again)
    assert {name: v[name]["all"]["n"] for name in v} == dict.fromkeys(probe.VARIANTS, 5)
    assert v["as run"]["all"]["valid"] == 0.0 and v["2x tokens"]["all"]["valid"] == 0.0
    assert v["T=1"]["all"]["valid"] == 1.0 and v["2 re-asks"]["all"]["valid"] == 1.0
    assert v["as run"]["invalid_reasons"] == {"the skill has N word; at least N are required": 1}
    firsts = [a for a in engine.asks if not a[3]]
    assert {(t, m) for _, t, m, _ in firsts} == {(0.0, 64), (1.0, 64), (0.0, 128)}
    # bins follow the first ask's prompt, not a re-ask's longer one
    first_lengths = sorted(n for n, t, m, reask in engine.asks[:5])
    binned = v["2 re-asks"]["by_prompt_tokens"]
    assert sum(c["n"] for c in binned.values()) == 5
    assert sorted(binned) == sorted({probe.length_bin(n) for n in first_lengths})
