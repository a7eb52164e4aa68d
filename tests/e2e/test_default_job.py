"""`seed run --quick` end to end: games, base policy, Stage 1, Stage 2 (SEED), evaluation,
report; then a rerun that resumes from the finished phases instead of redoing them.

The job is the session's `quick_job` (`tests/fixtures.py`; the base-policy tests read it too).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.fixtures import QUICK_JOB_EVAL_EPISODES, QUICK_JOB_UPDATES


@pytest.fixture(scope="module")
def quick_run(quick_job):
    return quick_job.out, quick_job.proc, quick_job.seconds


def test_artifacts_exist_and_hold_the_run(quick_run):
    out, _, _ = quick_run
    for rel in (
        "report.md",
        "curves.png",
        "eval.json",
        "progress.json",
        "stage2/metrics.jsonl",
        "stage2/config.json",
        "stage1/annotated.jsonl",
        "stage2/final_hf/config.json",
        "base/manifest.json",
    ):
        assert (out / rel).is_file(), rel
    evaluations = json.loads((out / "eval.json").read_text())
    assert set(evaluations) == {"Base (Vanilla)", "Stage-1 SFT", "SEED"}
    report = (out / "report.md").read_text()
    for name, result in evaluations.items():
        for split in ("seen", "unseen", "train"):
            r = result[split]
            assert r["episodes"] > 0 and r["per_family"]
            per = list(r["per_family"].values())
            assert r["macro_avg"] == pytest.approx(sum(per) / len(per))
        assert f"| {name} |" in report
    config = json.loads((out / "stage2" / "config.json").read_text())
    assert config["rollout"]["prompt_style"] == "compact" and config["algo"]["use_opd"]
    rows = [json.loads(x) for x in (out / "stage2" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == config["updates"] == QUICK_JOB_UPDATES
    assert all("time/rollout" in r and "batch/signal_frac" in r for r in rows)
    # an update whose groups are all tied takes no step (algo.no_signal) and has no loss
    stepped = [r for r in rows if r["train/steps"]]
    assert stepped and all("train/loss/opd" in r for r in stepped)
    assert all(r["batch/signal_frac"] == 0 for r in rows if not r["train/steps"])


def test_stage2_trained_the_policy_it_evaluates(quick_run):
    """The evaluated SEED model is the Stage-2 result: its weights differ from theta_sft,
    and every model was evaluated on the same training games with sampled episodes."""
    from safetensors.torch import load_file

    out, _, _ = quick_run
    final = load_file(next((out / "stage2" / "final_hf").glob("*.safetensors")))
    init = load_file(next((out / "stage1" / "sft" / "hf").glob("*.safetensors")))
    assert final.keys() == init.keys()
    moved = [k for k in final if not final[k].equal(init[k])]
    assert len(moved) > len(final) // 2, moved
    evaluations = json.loads((out / "eval.json").read_text())
    n = QUICK_JOB_EVAL_EPISODES
    episodes = {r["train"]["episodes"] for r in evaluations.values()}
    assert episodes == {6 * n}  # 6 training games x n sampled episodes
    assert all(r["train"]["decoding"] == f"T=1, {n} per game" for r in evaluations.values())


def _action_logprob_change(out, record) -> float:
    """Mean change, from theta_sft to the final policy, of the log-probs of a record's
    sampled action tokens (transformers scores both models)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron_seed.data.sequences import build_sequences

    cache = _action_logprob_change.__dict__.setdefault("models", {})
    if out not in cache:
        load = AutoModelForCausalLM.from_pretrained
        cache[out] = (
            AutoTokenizer.from_pretrained(out / "stage2" / "final_hf"),
            load(out / "stage1" / "sft" / "hf", dtype=torch.float32).eval(),
            load(out / "stage2" / "final_hf", dtype=torch.float32).eval(),
        )
    tok, start, final = cache[out]
    seq = build_sequences(record, tok, "task_line", with_teacher=False)[0].student
    ids = torch.tensor([seq.input_ids])  # [1, n]
    mask = torch.tensor(seq.action_mask[1:])  # [n - 1]: the sampled action tokens
    with torch.no_grad():
        logp = [
            torch.log_softmax(m(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            for m in (start, final)
        ]  # [n - 1] each
    return float((logp[1] - logp[0])[mask].mean())


def test_stage2_reinforced_its_winners_over_its_losers(quick_run):
    """The RL signal's direction: over the first half of Stage 2's own trajectories, the
    final policy raised the log-probs of the winning episodes' actions more than those of
    the losing ones, relative to theta_sft (seed 0, 4 updates, on an AMD EPYC: winners
    +0.058, losers -0.169 nats per token; at the recipe's 12 updates on an Intel Xeon:
    -0.071, -0.572). Whether the final policy also wins more evaluation episodes than the
    base is a single-seed draw (48 episodes in the recipe, 12 here) that float rounding flips
    from machine to machine (35.4 -> 39.6 % on some, 31.2 -> 18.8 % on an AMD EPYC):
    measured over seeds in docs/results.md, printed here, not asserted."""
    from megatron_seed.data import read_jsonl

    out, _, _ = quick_run
    evaluations = json.loads((out / "eval.json").read_text())
    base = evaluations["Base (Vanilla)"]["train"]["success"]
    seed = evaluations["SEED"]["train"]["success"]
    print(f"training-game success: base {base:.3f}, SEED {seed:.3f}")
    rows = [json.loads(x) for x in (out / "stage2" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["analyze/valid_rate"] for r in rows) > 0.2  # OPD had skills to work with
    assert max(r.get("train/opd/token_frac", 0.0) for r in rows) > 0.1  # skipped: none
    change: dict[bool, list[float]] = {True: [], False: []}
    for update in range(len(rows) // 2):
        path = out / "stage2" / "trajectories" / f"update_{update:05d}.jsonl"
        for record in read_jsonl(path):
            if record.trainable:
                change[record.won].append(_action_logprob_change(out, record))
    assert change[True] and change[False], {k: len(v) for k, v in change.items()}
    won, lost = (sum(v) / len(v) for v in (change[True], change[False]))
    print(f"action log-prob change, theta_sft -> final: winners {won:+.4f}, losers {lost:+.4f}")
    assert won - lost > 0.02, (won, lost)


def test_rerun_resumes_without_redoing_phases(quick_job):
    out = quick_job.out
    report = (out / "report.md").read_text()
    outputs = [
        *(out / "stage2" / "final_hf").glob("*.safetensors"),
        out / "stage1" / "trajectories.jsonl",
        out / "stage2" / "metrics.jsonl",
    ]
    stamps = {p: p.stat().st_mtime_ns for p in outputs}
    proc = subprocess.run(quick_job.command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "base policy: reusing" in proc.stdout
    assert "[update " not in proc.stdout and "stage 1: collect" not in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in outputs} == stamps  # nothing was redone
    assert (out / "report.md").read_text() == report  # the finished run's numbers
