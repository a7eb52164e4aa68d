"""The pilot of the full size's base policy: bases cloned on the job's own 16 training games
at several demonstration and step settings, and their success on those games as the job
measures it (T = 1, 4 sampled episodes per game). Seeds outside the registered 0-2.

    PYTHONPATH=. python docs/runs/full-pilot-seed20/base_pilot.py 20 OUT \
        '{"s350": {"noisy_per_game": 8, "hinted_per_game": 2, "analysis_per_game": 8,
                   "train_steps": 350}}'
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from megatron_seed.compare.job import JobFleet, evaluation_draws
from megatron_seed.pipeline.evaluate import evaluate_policies
from megatron_seed.testbed.base_policy import build_base_policy
from megatron_seed.testbed.base_policy.settings import BasePolicySettings
from megatron_seed.testbed.default_job import _games, job_config, job_size


def main(seed: int, root: Path, variants: dict[str, dict]) -> None:
    """Build each variant's base under ROOT/base-NAME, evaluate all of them on the training
    games in one fleet, write ROOT/pilot.json."""
    size = job_size("alfworld", "full")
    games = _games(root / "games", size, seed, "alfworld")
    cfg = job_config(size, "seed", seed, "alfworld")
    bases = {}
    for name, settings in variants.items():
        start = time.time()
        base = BasePolicySettings(env="alfworld", seed=seed, n_train_games=16, **settings)
        bases[name] = build_base_policy(
            root / f"base-{name}", settings=base, games_dir=root / "games", measure=False
        )
        print(name, "build", round(time.time() - start), "s", flush=True)
    fleet = JobFleet(next(iter(bases.values())), cfg)
    results = evaluate_policies(
        list(bases.values()),
        {"train": games["train"]},
        cfg,
        sampled=evaluation_draws(1.0, 4),
        fleet=fleet.get(),
    )
    fleet.close()
    out = dict(zip(bases, results, strict=True))
    for name, result in out.items():
        print(name, json.dumps(result)[:400], flush=True)
    (root / "pilot.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":  # the engines' processes import this file again
    main(int(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]))
