"""`seed eval`: the expert wins every generated task of every environment, the random policy
rarely does (measured, printed); results per family as JSON; one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ENVS = ("alfworld", "search", "sokoban")
# the random policy's success over these tasks is measured (printed with -s) and must stay
# below these bounds: ALFWorld 0/30 (15 steps), search and Sokoban are in test_envs_*
RANDOM_BOUND = {"alfworld": 0.1, "search": 0.1, "sokoban": 0.25}
MAX_STEPS = {"alfworld": "15", "search": "4", "sokoban": "15"}  # the default job's budgets


def _seed(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "megatron_seed.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval")
    out = {}
    for env in ENVS:
        for split, n in (("train", 6), ("unseen", 4)):
            proc = _seed("games", "--env", env, "--split", split, "--n", str(n), "--seed", "5",
                         "--out", str(root / env))  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-2000:]
        out[env] = root / env
    return out


@pytest.mark.parametrize("env", ENVS)
def test_expert_wins_every_task_and_random_rarely(tasks, env, tmp_path):
    out = tmp_path / "expert.json"
    proc = _seed("eval", "--env", env, "--games", str(tasks[env]), "--policy", "expert",
                 "--max-steps", "30", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["episodes"] == 10 and result["success"] == 1.0 and result["macro_avg"] == 1.0
    assert all(e["won"] and e["invalid"] == 0 for e in result["episodes_played"])
    assert "| **average** (family-balanced) | 10 | 100.0 |" in proc.stdout
    out = tmp_path / "random.json"
    proc = _seed("eval", "--env", env, "--games", str(tasks[env]), "--policy", "random",
                 "--episodes", "3", "--max-steps", MAX_STEPS[env], "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    print(f"{env}: random policy success {result['success']:.3f} over {result['episodes']}")
    assert result["episodes"] == 30 and result["success"] < RANDOM_BOUND[env]
    families = {e["family"] for e in result["episodes_played"]}
    assert set(result["per_family"]) == families
    assert sum(p["episodes"] for p in result["per_family"].values()) == 30


def test_one_split_and_one_line_errors(tasks, capsys):
    from megatron_seed.cli import main

    games = ["--games", str(tasks["sokoban"]), "--env", "sokoban"]
    assert main(["eval", *games, "--split", "unseen", "--policy", "expert"]) == 0
    assert "4 episodes" in capsys.readouterr().out
    for args, message in (
        (("--policy", "/nonexistent/model"), "not expert, random or a model folder"),
        (("--policy", "expert", "--split", "valid"), "--games"),
        (("--policy", "expert", "--episodes", "0"), "--episodes must be at least 1"),
        (("--policy", "expert", "--env", "chess"), "unknown environment 'chess'"),
        (("--policy", "expert", "--max-steps", "0"), "bad --max-steps"),
        (("--policy", "expert", "--skill-library", "lib"), "--skill-library is for a model"),
    ):
        assert main(["eval", *games, *args]) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
