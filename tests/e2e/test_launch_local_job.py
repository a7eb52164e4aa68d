"""`seed launch tiny --executor local` for real: NeMo-Run's LocalExecutor runs torchrun, which
runs `seed train` of the tiny recipe on the session's tiny world (fleet, env workers,
trainer) for its two updates."""

from __future__ import annotations

import json
from pathlib import Path

from launch.local import run_local
from launch.plan import make_plan


def test_local_launch_of_tiny_trains_two_updates(tiny_world: Path, tmp_path: Path) -> None:
    env = {
        "SEED_MODEL_DIR": str(tiny_world / "model"),
        "SEED_GAMES_DIR": str(tiny_world / "games"),
        "SEED_OUT_DIR": str(tmp_path / "out"),
    }
    outcome = run_local(make_plan("tiny"), nemorun_home=str(tmp_path / "nemorun"), env=env)
    assert outcome.succeeded, [p.read_text()[-2000:] for p in outcome.logs()]
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # the tiny recipe's two Stage-2 updates
