"""`seed compare [--quick] [--seeds 0 1 2] [--out runs/compare]`: SEED vs GRPO, same budget.

Each (method, seed) is one default job (`seed run`) in its own folder; the base policy and
the games of a seed are shared by the methods, so they start from the same place and see
the same tasks. GRPO starts from the base policy (the paper's baseline); SEED from its own
Stage-1 SFT. The side-by-side table (mean and spread over seeds, per family, seen and
unseen) goes to OUT/compare.md and OUT/compare.json. Re-running resumes.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from megatron_seed.errors import output_dir
from megatron_seed.testbed.default_job import METHODS
from megatron_seed.testbed.report import family_columns


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["seed", "grpo"],
        choices=list(METHODS),
        help="seed, grpo, and the paper's Table 2 ablations: no-sft, no-opd, static-skills",
    )
    parser.add_argument("--out", default="runs/compare")


def _cell(values: list[float]) -> str:
    if not values:
        return "–"
    mean = 100 * statistics.fmean(values)
    spread = 100 * statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f} ± {spread:.1f}"


def compare_table(results: dict[str, list[dict]], split: str) -> str:
    """Mean ± population std over seeds of the trained policy's success (%)."""
    head = "| Method | " + " | ".join(c for _, c in family_columns()) + " | Avg |"
    lines = [head, "| --- |" + " ---: |" * (len(family_columns()) + 1)]
    for method, runs in results.items():
        cells = []
        for fam, _ in family_columns():
            cells.append(
                _cell([r[split]["per_family"][fam] for r in runs if fam in r[split]["per_family"]])
            )
        cells.append(_cell([r[split]["macro_avg"] for r in runs]))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PHASES = ("sync", "rollout", "analyze", "train", "update")


def phase_seconds(metrics_path: Path) -> dict[str, float]:
    """Median seconds per update of each phase (update 1, the engines' warm-up, excluded
    when there are more)."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    rows = rows[1:] if len(rows) > 1 else rows
    return {phase: statistics.median(r.get(f"time/{phase}", 0.0) for r in rows) for phase in PHASES}


def time_table(seconds: dict[str, list[dict[str, float]]]) -> str:
    """Per-phase seconds per update (mean over seeds of each run's median) and the ratio of
    each method's update time to GRPO's (to the last method's when GRPO did not run)."""
    methods = list(seconds)
    mean = {
        m: {p: statistics.fmean(run[p] for run in runs) for p in PHASES}
        for m, runs in seconds.items()
    }
    head = "| phase | " + " | ".join(f"{m} s" for m in methods) + " |"
    lines = [head, "| --- |" + " ---: |" * len(methods)]
    for phase in PHASES:
        lines.append(f"| {phase} | " + " | ".join(f"{mean[m][phase]:.2f}" for m in methods) + " |")
    ref = "GRPO" if "GRPO" in methods else methods[-1]
    for m in (m for m in methods if m != ref):
        ratio = mean[m]["update"] / max(mean[ref]["update"], 1e-9)
        lines.append(f"\n{m} update time / {ref} update time: **{ratio:.2f}x**")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run every (method, seed) job, then write the side-by-side table."""
    from megatron_seed.testbed.default_job import run_default_job

    out = output_dir(args.out)
    results: dict[str, list[dict]] = {}
    seconds: dict[str, list[dict[str, float]]] = {}
    baseline: list[dict] = []
    for seed in args.seeds:
        for method in args.methods:
            job = run_default_job(
                out / f"{method}-seed{seed}",
                quick=args.quick,
                seed=seed,
                algo=method,
                base_dir=out / f"base-seed{seed}",
                games_dir=out / f"games-seed{seed}",
            )
            evals = job["evaluations"]
            label = METHODS[method].label
            results.setdefault(label, []).append(evals[label])
            metrics = out / f"{method}-seed{seed}" / "stage2" / "metrics.jsonl"
            seconds.setdefault(label, []).append(phase_seconds(metrics))
            if method == args.methods[0]:
                baseline.append(evals["Base (Vanilla)"])
    results = {"Base (Vanilla)": baseline, **results}
    title = " vs ".join(results)
    lines = [f"# {title} ({'quick' if args.quick else 'full'} size, seeds {args.seeds})", ""]
    for split in ("seen", "unseen", "train"):
        lines += [f"## {split}", "", compare_table(results, split), ""]
    lines += ["## seconds per Stage-2 update (median over updates 2..)", ""]
    lines += [time_table(seconds), ""]
    (out / "compare.md").write_text("\n".join(lines))
    summary = {"results": results, "seconds": seconds}
    (out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(lines))
    return 0
