"""WebShop through the user's commands: `seed games` writes a generated catalogue and its
splits, `seed eval` plays the expert (every goal bought with reward 1.0) and the random
policy (no success) through the environment registry, as a user runs them.

The whole quick job (`seed run --quick --env webshop`) is measured in docs/results.md rather
than run here, to keep the suite's time down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _seed(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "megatron_seed.cli", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_seed_games_and_seed_eval_on_webshop(tmp_path: Path) -> None:
    games = tmp_path / "games"
    for split, n in (("train", "10"), ("unseen", "10")):
        proc = _seed("games", "--env", "webshop", "--split", split, "--n", n,
                     "--targets-per-type", "10", "--out", str(games))  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
    results = {}
    for policy in ("expert", "random"):
        out = tmp_path / f"{policy}.json"
        proc = _seed("eval", "--env", "webshop", "--games", str(games), "--policy", policy,
                     "--episodes", "2", "--out", str(out))  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[policy] = json.loads(out.read_text())
    expert, random_ = results["expert"], results["random"]
    assert expert["episodes"] == 40 and expert["success"] == 1.0 and expert["reward"] == 1.0
    assert set(expert["per_family"]) == {"beauty", "electronics", "fashion", "furniture", "grocery"}
    assert all(e["steps"] <= 6 for e in expert["episodes_played"])  # search, link, options, buy
    assert random_["success"] == 0.0 and random_["reward"] < 0.3
