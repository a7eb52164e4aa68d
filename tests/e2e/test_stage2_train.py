"""Stage 2 end to end on CPU: a vLLM engine in a Ray actor, Ray env workers on generated
ALFWorld games (the session's `tiny_world`), the Megatron trainer; `seed train` for 2
updates; a run stopped by SIGTERM during update 1 that resumes into exactly the uninterrupted
run's update 2. (A `seed train` across several engines: the quick job's two, and the Slurm
rehearsal's one per node.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from megatron_seed.testbed.tiny_world import train_command

# the tiny recipe's B=2, N=2, on one engine (each engine is a vLLM start in every run)
CONFIG = {"rollout": {"tasks_per_update": 2, "group_size": 2}, "fleet": {"engines": 1}}


def _train(root, out, *extra):
    cmd = train_command(root, out, CONFIG, *extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200)


# the processes a Ray cluster runs besides its workers (the agents retitle themselves)
RAY_DAEMONS = ("gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "log_monitor")


def ray_daemons() -> set[int]:
    """Process ids of every Ray daemon on this machine."""
    import psutil

    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if any(name in line for name in RAY_DAEMONS):
            found.add(proc.info["pid"])
    return found


def left_behind(before: set[int], grace_s: float = 10.0) -> set[int]:
    """Ray daemons started since ``before`` that are still alive ``grace_s`` seconds on."""
    import time

    deadline = time.monotonic() + grace_s
    while (new := ray_daemons() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return new


@pytest.fixture(scope="module")
def reference(tiny_world, tmp_path_factory):
    """An uninterrupted 2-update run: (its output folder, the finished process, the Ray
    daemons it left running)."""
    out = tmp_path_factory.mktemp("stage2") / "out"
    before = ray_daemons()
    proc = _train(tiny_world, out, "--updates", "2")
    return out, proc, left_behind(before)


def _rows(out) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def test_seed_train_two_updates(reference):
    out, proc, orphans = reference
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not orphans, f"Ray daemons outlived seed train: {sorted(orphans)}"
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/episodes"] == 4  # B=2 tasks x N=2
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
        for x in (out / "trajectories" / "update_00000.jsonl").read_text().splitlines()
    ]
    assert len(records) == 4
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
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (out / "final_hf" / "config.json").is_file()


def _seed_train(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "megatron_seed.cli", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_bad_inputs_fail_fast(tiny_world, tmp_path):
    model = str(tiny_world / "model")
    proc = _seed_train("--model", model, "--games", str(tmp_path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "no games" in proc.stderr
    games = str(tiny_world / "games")
    proc = _seed_train("--model", model, "--games", games, "--recipe", "nope")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_sigterm_checkpoints_and_the_resumed_run_continues_exactly(tiny_world, reference, tmp_path):
    """SIGTERM during update 1 (its trajectories are written, it trains): the run finishes
    it, checkpoints, exits 143; the rerun resumes from that checkpoint (none lost, none
    repeated) and its update 2 plays and scores exactly what the uninterrupted run's update 2
    did (same model, games, config and seed)."""
    import os
    import signal
    import time

    root, (done_dir, _, _) = tiny_world, reference
    want_path = done_dir / "trajectories" / "update_00001.jsonl"
    assert want_path.is_file(), "the uninterrupted run did not finish"
    out = tmp_path / "preempted"
    cmd = train_command(root, out, CONFIG, "--updates", "2")
    before = ray_daemons()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    played = out / "trajectories" / "update_00000.jsonl"  # written before update 1 trains
    deadline = time.monotonic() + 900
    while not played.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)  # update 1 is under way
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 143, stderr[-3000:]
    assert "preempted after update 1" in stdout
    assert not (orphans := left_behind(before)), f"Ray daemons outlived SIGTERM: {orphans}"
    assert [r["step"] for r in _rows(out)] == [1]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert not (out / "final_hf").exists()
    proc = _train(root, out, "--updates", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in _rows(out)] == [1, 2]  # none lost, none repeated
    assert not (out / "preempted.json").exists()
    resumed = (out / "trajectories" / "update_00001.jsonl").read_text().splitlines()
    want = want_path.read_text().splitlines()
    fields = ("task_id", "turns", "reward", "won", "skill")
    assert [{k: json.loads(x)[k] for k in fields} for x in resumed] == [
        {k: json.loads(x)[k] for k in fields} for x in want
    ]
    (done,) = [r for r in _rows(done_dir) if r["step"] == 2]
    again = _rows(out)[-1]
    for key in ("train/loss/total", "train/loss/opd", "rollout/success"):
        assert again[key] == pytest.approx(done[key], rel=1e-6, abs=1e-9), key
