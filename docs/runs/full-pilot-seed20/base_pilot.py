"""Pilot: full-size ALFWorld base policies cloned on the job's own 16 training games, at
several demonstration/step settings; success on those games as the job measures it
(T=1, 4 sampled episodes per game). Seeds outside the acceptance's 0-2."""
import dataclasses, json, sys, time
from pathlib import Path
from megatron_seed.testbed.default_job import _games, job_config, job_size
from megatron_seed.testbed.base_policy import build_base_policy
from megatron_seed.testbed.base_policy.settings import BasePolicySettings
from megatron_seed.compare.job import JobFleet, evaluation_draws
from megatron_seed.pipeline.evaluate import evaluate_policies

def main():
    seed = int(sys.argv[1]); root = Path(sys.argv[2]); variants = json.loads(sys.argv[3])
    size = job_size("alfworld", "full")
    games = _games(root / "games", size, seed, "alfworld")
    cfg = job_config(size, "seed", seed, "alfworld", None, None, None)
    bases = {}
    for name, kw in variants.items():
        t = time.time()
        s = BasePolicySettings(env="alfworld", seed=seed, n_train_games=16, **kw)
        bases[name] = build_base_policy(root / f"base-{name}", settings=s, games_dir=root / "games", measure=False)
        print(name, "build", round(time.time() - t), "s", flush=True)
    fleet = JobFleet(next(iter(bases.values())), cfg)
    res = evaluate_policies(list(bases.values()), {"train": games["train"]}, cfg,
                            sampled=evaluation_draws(1.0, 4), fleet=fleet.get())
    fleet.close()
    out = {}
    for name, r in zip(bases, res):
        out[name] = r
        print(name, json.dumps(r)[:400], flush=True)
    (root / "pilot.json").write_text(json.dumps(out, indent=1))

if __name__ == '__main__':
    main()
