"""Stage 2 end to end on CPU: 2 vLLM engines in Ray actors, Ray env workers on generated
ALFWorld games, the Megatron trainer; `seed train` for 3 updates, then a resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from megatron_seed.testbed.tiny_world import make_tiny_world, train_command

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return make_tiny_world(tmp_path_factory.mktemp("stage2"))


def _train(root, *extra):
    config = {"rollout": {"tasks_per_update": 4, "group_size": 4}}
    cmd = train_command(root, root / "out", config, *extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200)


def test_seed_train_three_updates_then_resume(setup):
    root = setup
    proc = _train(root, "--updates", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (root / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/episodes"] == 16  # B=4 tasks x N=4
        assert r["analyze/n"] >= 1
        assert r["sync/bytes"] > 0
        # the engines hold the trainer's weights (refit probe), and the log-probs the engines
        # sampled with are the trainer's theta_old log-probs (float32 on both sides)
        assert r["sync/probe_gap_max"] <= 1e-4
        assert r["train/mismatch/mean"] <= 1e-3 and r["train/mismatch/max"] <= 1e-2
        for phase in ("rollout", "analyze", "train", "sync"):
            assert r[f"time/{phase}"] > 0
    records = [
        json.loads(x)
        for x in (root / "out" / "trajectories" / "update_00000.jsonl").read_text().splitlines()
    ]
    assert len(records) == 16
    for rec in records:
        assert rec["turns"] and all(
            len(t["action_ids"]) == len(t["logprobs"]) for t in rec["turns"]
        )
        # an analysed record carries a typed analysis; only a valid one carries a skill
        assert (rec["skill"] is not None) == rec["analysis"]["valid"]
        assert rec["env"] == "alfworld" and rec["goal"] and rec["turns"][0]["observation"]
    analysed = [rec for rec in records if rec["analysis"] is not None]
    assert rows[0]["analyze/n"] == len(analysed)
    valid = sum(rec["analysis"]["valid"] for rec in analysed)
    assert rows[0]["analyze/valid_rate"] == pytest.approx(valid / len(analysed))
    assert (root / "out" / "checkpoints" / "latest").read_text().strip() == "step_000003"
    # resume: one more update continues from step 3
    proc = _train(root, "--updates", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (root / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_bad_inputs_fail_fast(setup, tmp_path):
    root = setup
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_seed.cli",
            "train",
            "--model",
            str(root / "model"),
            "--games",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "no games" in proc.stderr
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_seed.cli",
            "train",
            "--model",
            str(root / "model"),
            "--games",
            str(root / "games"),
            "--recipe",
            "nope",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
