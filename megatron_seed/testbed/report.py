"""The run report: a Markdown table laid out like the paper's Table 1 (the environment's
columns: ALFWorld's six families, search-QA's seven datasets, ...), training curves as PNG,
and pointers to the metrics and the exact config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envs.spec import DEFAULT_ENV, get_env
from megatron_seed.testbed.profiles import profile


def family_columns(env: str = DEFAULT_ENV) -> tuple[tuple[str, str], ...]:
    """(family, label) columns of the environment's report (ALFWorld: the paper's Table 1)."""
    return get_env(env).report_columns


def table(rows: dict[str, dict[str, Any]], split: str, env: str = DEFAULT_ENV) -> str:
    """Markdown table: one row per method, success (%) per family and the average."""
    columns = family_columns(env)
    head = "| Method | " + " | ".join(c for _, c in columns) + " | Avg | Len |"
    sep = "| --- |" + " ---: |" * (len(columns) + 2)
    lines = [head, sep]
    for method, result in rows.items():
        r = result[split]
        cells = [
            f"{100 * r['per_family'][f]:.1f}" if f in r["per_family"] else "–" for f, _ in columns
        ]
        lines.append(
            f"| {method} | "
            + " | ".join(cells)
            + f" | {100 * r['macro_avg']:.1f} | {r['episode_length']:.1f} |"
        )
    return "\n".join(lines)


def plot_curves(metrics_path: Path, out_png: Path) -> Path | None:
    """Success, episode length, OPD loss and gate statistics per update."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("rollout/success", "rollout success"),
        ("rollout/episode_length", "episode length"),
        ("train/loss/opd", "OPD loss"),
        ("train/opd/gate_mean", "gate mean"),
        ("train/opd/frac_delta_pos", "fraction Δ > 0"),
        ("analyze/valid_rate", "skill validity"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    steps = [r["step"] for r in rows]
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        ys = [r.get(key) for r in rows]
        if any(y is not None for y in ys):
            ax.plot(steps, [float("nan") if y is None else y for y in ys], marker="o")
        ax.set_title(title)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def write_report(
    out_dir: Path, evaluations: dict[str, dict], facts: dict[str, Any], env: str = DEFAULT_ENV
) -> Path:
    """OUT/report.md (+ curves.png) from the evaluations and the run's facts."""
    out_dir = Path(out_dir)
    png = None
    metrics = out_dir / "stage2" / "metrics.jsonl"
    if metrics.is_file():
        png = plot_curves(metrics, out_dir / "curves.png")
    lines = ["# megatron-seed default job: report", ""]
    lines += [f"- {k}: {json.dumps(v) if isinstance(v, dict) else v}" for k, v in facts.items()]
    lines += [
        "",
        "Success rate (%) without skills at evaluation (rows marked * play with the skill "
        "library's text in every prompt); Len = mean episode length (steps).",
        "",
    ]
    name = profile(env).title
    titles = {
        "seen": f"{name} (seen)",
        "unseen": f"{name} (unseen)",
        "train": "Stage-2 training games",
    }
    for split, title in titles.items():
        if all(split in r for r in evaluations.values()):
            decoding = next(iter(evaluations.values()))[split].get("decoding", "greedy")
            lines += [f"## {title} ({decoding})", "", table(evaluations, split, env), ""]
    if png is not None:
        lines += ["## Training curves (Stage 2)", "", "![curves](curves.png)", ""]
    lines += [
        "Files: `stage2/metrics.jsonl` (every update), `stage2/config.json` (the exact "
        "config), `stage1/annotated.jsonl`, `eval.json`.",
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
