"""`seed compare [--quick] [--env NAME] [--seeds 0 1 2] [--methods ...] [--out DIR]`: methods
side by side, same budget.

Each (method, seed) is one default job (`seed run`) in its own folder; the base policy (and
its evaluation), the games and the family skill library of a seed are shared by the methods,
so they start from the same place and see the same tasks, skills and evaluation draws. The
methods are `megatron_seed.methods`' (every row of the paper's Table 1, its Table-2
ablations, seed-replay); the baselines start from the base policy, SEED from its own Stage-1
SFT. A method evaluated with skills adds its starred row. The side-by-side table goes to
OUT/compare.md and OUT/compare.json; re-running resumes. `--merge DIR ...` runs nothing and
writes one table from earlier comparisons' compare.json (seeds run apart, e.g. one per
machine or session).

Every cell is the mean over seeds with its 95 % interval (`testbed.stats`: Student's t over
seeds; with one seed, Wilson's interval over that seed's episodes) and the number of episodes
behind it. Each method's average is compared with the reference method's (GRPO, else the last
one) seed by seed: a paired difference whose interval holds 0 is marked "~" (not
distinguishable from noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from envs.spec import DEFAULT_ENV
from megatron_seed.errors import output_dir
from megatron_seed.methods import METHODS
from megatron_seed.testbed.profiles import PROFILES
from megatron_seed.testbed.report import family_columns
from megatron_seed.testbed.stats import paired_difference, t_interval, wilson


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--env", choices=sorted(PROFILES), default=DEFAULT_ENV)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["seed", "grpo"],
        choices=list(METHODS),
        metavar="METHOD",
        help="any of: " + ", ".join(METHODS) + " (megatron_seed/methods.py; default: seed grpo)",
    )
    parser.add_argument(
        "--skill-library", default=None, help="a family library folder (default: built)"
    )
    parser.add_argument("--out", default=None, help="default runs/compare[-ENV]")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="run nothing: merge the compare.json of earlier comparisons (each its own "
        "seeds, e.g. one seed per session) into one table in --out",
    )


def cell(rates: list[float], episodes: list[int]) -> str:
    """``mean ± half (n)`` in %: t over seeds; ``mean [low, high] (n)``: Wilson's interval
    over the episodes, for one seed, or when every seed gave the same rate (the t interval
    would claim a certainty of 0 width: 0/7 three times is not a 0 % rate)."""
    if not rates:
        return "–"
    n = sum(episodes)
    mean, half = t_interval(rates)
    if len(rates) == 1 or (half == 0.0 and n > 0):
        won = round(sum(r * e for r, e in zip(rates, episodes, strict=True)))
        low, high = wilson(won, n)
        return f"{100 * mean:.1f} [{100 * low:.0f}, {100 * high:.0f}] ({n})"
    return f"{100 * mean:.1f} ± {100 * half:.1f} ({n})"


def compare_table(results: dict[str, list[dict]], split: str, env: str = DEFAULT_ENV) -> str:
    """Success (%) per family and on average: mean over seeds, 95 % interval, episodes."""
    columns = family_columns(env)
    head = "| Method | " + " | ".join(c for _, c in columns) + " | Avg |"
    lines = [head, "| --- |" + " ---: |" * (len(columns) + 1)]
    for method, runs in results.items():
        cells = []
        for fam, _ in columns:
            have = [r[split] for r in runs if fam in r[split]["per_family"]]
            rates = [r["per_family"][fam] for r in have]
            counts = [r.get("per_family_episodes", {}).get(fam, 0) for r in have]
            cells.append(cell(rates, counts))
        cells.append(
            cell([r[split]["macro_avg"] for r in runs], [r[split]["episodes"] for r in runs])
        )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def difference_lines(results: dict[str, list[dict]], split: str) -> list[str]:
    """Each method's average minus the reference's, paired by seed, with its 95 % interval;
    "~" marks a difference not distinguishable from noise."""
    methods = list(results)
    ref = "GRPO" if "GRPO" in methods else methods[-1]
    lines = []
    for m in (m for m in methods if m != ref):
        a = [r[split]["macro_avg"] for r in results[m]]
        b = [r[split]["macro_avg"] for r in results[ref]]
        if len(a) != len(b):  # merged comparisons where one of the two was not run
            lines.append(f"- {m} − {ref}: n/a ({len(a)} vs {len(b)} seeds)")
            continue
        mean, half, real = paired_difference(a, b)
        mark = "" if real else " ~ (not distinguishable from noise)"
        width = "n/a (one seed)" if half != half else f"{100 * half:.1f}"
        lines.append(f"- {m} − {ref}: {100 * mean:+.1f} ± {width} points{mark}")
    return lines


PHASES = ("sync", "rollout", "analyze", "train", "update")


def phase_seconds(metrics_path: Path) -> dict[str, float]:
    """Median seconds per update of each phase (update 1, the engines' warm-up, excluded
    when there are more)."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    rows = rows[1:] if len(rows) > 1 else rows
    return {phase: statistics.median(r.get(f"time/{phase}", 0.0) for r in rows) for phase in PHASES}


SKILL_KEYS = (
    ("analyze/valid_rate", "valid %"),
    ("analyze/degenerate_rate", "degenerate %"),
)


def skill_rows(metrics_path: Path) -> list[dict[str, float]]:
    """Per update, the analyzer's skill metrics of one run ([] when it ran no analyzer)."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if not rows or "analyze/degenerate_rate" not in rows[0]:  # fixed skills: no analyzer
        return []
    return [{key: r.get(key, 0.0) for key, _ in SKILL_KEYS} for r in rows]


def skill_table(runs: dict[str, list[list[dict[str, float]]]]) -> str:
    """Per update, each method's valid and degenerate skill rates (mean over seeds, %): the
    policy's own analyzer eroding, or kept by analyzer replay."""
    runs = {m: r for m, r in runs.items() if r and all(r)}
    if not runs:
        return ""
    updates = min(len(rows) for seeds in runs.values() for rows in seeds)
    head = "| method | skill metric | " + " | ".join(str(u + 1) for u in range(updates)) + " |"
    lines = [head, "| --- | --- |" + " ---: |" * updates]
    for method, seeds in runs.items():
        for key, name in SKILL_KEYS:
            cells = [
                f"{100 * statistics.fmean(rows[u][key] for rows in seeds):.0f}"
                for u in range(updates)
            ]
            lines.append(f"| {method} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def merge_summaries(paths: list[Path]) -> dict[str, Any]:
    """One summary from the compare.json of several comparisons: per method the runs of
    every input, in input order (a method an input lacks has fewer runs); seeds likewise."""
    merged: dict[str, Any] = {"results": {}, "seconds": {}, "skills": {}, "seeds": []}
    for path in paths:
        file = path / "compare.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no compare.json at {path}")
        summary = json.loads(file.read_text())
        for key in ("results", "seconds", "skills"):
            for label, runs in summary.get(key, {}).items():
                merged[key].setdefault(label, []).extend(runs)
        merged["seeds"].extend(summary.get("seeds", []))
    return merged


def run(args: argparse.Namespace) -> int:
    """Run every (method, seed) job (or `--merge` earlier ones), then write the side-by-side
    table."""
    out = output_dir(
        args.out or ("runs/compare" + ("" if args.env == DEFAULT_ENV else f"-{args.env}"))
    )
    if args.merge:
        merged = merge_summaries([Path(p) for p in args.merge])
        seeds = merged["seeds"] or args.merge
        summary = (merged["results"], merged["seconds"], merged["skills"])
        return write_summary(out, *summary, args.env, "quick" if args.quick else "full", seeds)
    from megatron_seed.testbed.default_job import run_default_job

    results: dict[str, list[dict]] = {}
    seconds: dict[str, list[dict[str, float]]] = {}
    skills: dict[str, list[list[dict[str, float]]]] = {}
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
                env=args.env,
                library_dir=out / f"library-seed{seed}",
                user_library=args.skill_library,
            )
            evals = job["evaluations"]
            for label, result in evals.items():
                if label not in ("Base (Vanilla)", "Stage-1 SFT"):
                    results.setdefault(label, []).append(result)
            metrics = out / f"{method}-seed{seed}" / "stage2" / "metrics.jsonl"
            if metrics.is_file():
                seconds.setdefault(METHODS[method].label, []).append(phase_seconds(metrics))
                skills.setdefault(METHODS[method].label, []).append(skill_rows(metrics))
            if method == args.methods[0]:
                baseline.append(evals["Base (Vanilla)"])
    results = {"Base (Vanilla)": baseline, **results}
    size = "quick" if args.quick else "full"
    return write_summary(out, results, seconds, skills, args.env, size, list(args.seeds))


def write_summary(
    out: Path,
    results: dict[str, list[dict]],
    seconds: dict[str, list[dict[str, float]]],
    skills: dict[str, list[list[dict[str, float]]]],
    env: str,
    size: str,
    seeds: list[Any],
) -> int:
    """OUT/compare.md (the tables) and OUT/compare.json (what they were made from)."""
    out.mkdir(parents=True, exist_ok=True)
    title = " vs ".join(results)
    lines = [f"# {title} on {env} ({size} size, seeds {seeds})", ""]
    lines += [
        "Success (%): mean over seeds ± the 95 % t interval (one seed, or the same rate from "
        "every seed: [Wilson's interval] over the pooled episodes), episodes in parentheses.",
        "",
    ]
    for split in ("seen", "unseen", "train"):
        lines += [f"## {split}", "", compare_table(results, split, env), ""]
        lines += [*difference_lines(results, split), ""]
    if seconds:
        lines += ["## seconds per Stage-2 update (median over updates 2..)", ""]
        lines += [time_table(seconds), ""]
    if table := skill_table(skills):
        lines += ["## the policy's own skills per Stage-2 update (mean over seeds)", ""]
        lines += [table, ""]
    (out / "compare.md").write_text("\n".join(lines))
    summary = {"results": results, "seconds": seconds, "skills": skills, "seeds": seeds}
    (out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(lines))
    return 0
