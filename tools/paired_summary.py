"""Paired summaries of `seed compare` results: per-seed success on each split, every method
against the base and against GRPO (95 % t interval, sd of the differences, TOST at +-10
points), and the seeds a paired design needs for 80 % power at a 10-point difference.

    python tools/paired_summary.py runs/compare/compare.json [more compare.json ...]
    python tools/paired_summary.py runs/default runs/default-seed1 ...   # `seed run` folders

Several files are merged as `seed compare --merge` merges them (their seeds in order); `seed
run` folders (each an eval.json and the job_config.json that names its seed) are read as one
comparison of the models each evaluated.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from megatron_seed.compare.report import merge_summaries
from megatron_seed.compare.stats import seeds_for_power, t_interval, tost

BASE, REF = "Base (Vanilla)", "GRPO"


def run_folders(paths: list[Path]) -> dict:
    """`seed run` folders as `merge_summaries` gives compare files: results per model label
    over the folders, and the folders' seeds."""
    import json

    runs = {}
    for folder in paths:
        try:
            seed = json.loads((folder / "job_config.json").read_text())["seed"]
            runs[seed] = json.loads((folder / "eval.json").read_text())
        except (OSError, ValueError, KeyError) as err:
            sys.exit(f"paired_summary: {folder} is not a finished seed run folder ({err})")
    if len(runs) != len(paths):
        sys.exit("paired_summary: two folders hold the same seed")
    labels = next(iter(runs.values())).keys()
    if any(run.keys() != labels for run in runs.values()):  # pair only like with like
        sys.exit("paired_summary: the folders evaluated different models")
    seeds = sorted(runs)
    return {"results": {m: [runs[s][m] for s in seeds] for m in labels}, "seeds": seeds}


def main(paths: list[str]) -> None:
    folders = [Path(p) for p in paths]
    runs = [(f / "eval.json").is_file() for f in folders]
    if all(runs):
        merged = run_folders(folders)
    elif any(runs):
        sys.exit("paired_summary: give seed run folders or comparisons, not both")
    else:
        try:
            merged = merge_summaries(folders)
        except (OSError, ValueError) as err:
            sys.exit(f"paired_summary: {err}")
    results, seeds = merged["results"], merged["seeds"]
    for split in ("train", "seen", "unseen"):
        rates = {m: [100 * r[split]["macro_avg"] for r in runs] for m, runs in results.items()}
        print(f"\n## {split} (success %, seeds {seeds})")
        for m, v in rates.items():
            print(
                f"{m:40s} "
                + " ".join(f"{x:5.1f}" for x in v)
                + f" | mean {statistics.fmean(v):5.1f}"
            )
        for ref in (BASE, REF):
            if ref not in rates:
                continue
            for m, v in rates.items():
                if m in (ref, BASE) or len(v) != len(rates[ref]) or len(v) < 2:
                    continue
                d = [a - b for a, b in zip(v, rates[ref], strict=True)]
                mean, half = t_interval(d)
                sd = statistics.stdev(d)
                _, lo, hi, within = tost(d, 10.0)
                print(
                    f"  {m} - {ref}: {mean:+.1f} ± {half:.1f} (sd {sd:.1f}; all > 0: "
                    f"{all(x > 0 for x in d)}; TOST ±10 90 % [{lo:+.1f}, {hi:+.1f}] "
                    f"{'within' if within else 'not within'}; seeds for 80 % power at 10: "
                    f"{seeds_for_power(sd, 10.0)})"
                )


if __name__ == "__main__":
    main(sys.argv[1:] or ["runs/compare/compare.json"])
