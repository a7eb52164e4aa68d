"""Reports of runs and comparisons, laid out like the paper's Table 1 (the environment's
columns: ALFWorld's six families, search-QA's seven datasets, ...).

A run's report (OUT/report.md: one row per evaluated model, training curves, the facts) and a
comparison's (OUT/compare.md + compare.json: each cell the mean over seeds with its 95 %
interval from `compare.stats`, paired differences to the reference method, per-phase
seconds, the analyzer's skill rates).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from envs.spec import DEFAULT_ENV, get_env
from megatron_seed.compare.stats import paired_difference, t_interval, tost, wilson
from megatron_seed.config import assignments
from megatron_seed.errors import CommandError
from megatron_seed.files import write_json


def family_columns(env: str = DEFAULT_ENV) -> tuple[tuple[str, str], ...]:
    """(family, label) columns of the environment's report (ALFWorld: the paper's Table 1)."""
    return get_env(env).report_columns


def method_table(
    rows: dict[str, list[str]], env: str = DEFAULT_ENV, extra: tuple[str, ...] = ()
) -> str:
    """The Table-1 layout: one row per method (its cells: one per family column, the
    average, then the ``extra`` columns), the environment's family columns."""
    columns = family_columns(env)
    heads = [c for _, c in columns] + ["Avg", *extra]
    lines = ["| Method | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * len(heads)]
    lines += [f"| {method} | " + " | ".join(cells) + " |" for method, cells in rows.items()]
    return "\n".join(lines)


BASE_LABEL = "Base (Vanilla)"  # the base policy's row in every evaluation

# the report's one sentence on what a single run's numbers can and cannot conclude
WHAT_IT_SHOWS = (
    "What these numbers can conclude: they are one run (one seed), and an interval holds "
    "only the evaluation's sampling noise, so rows whose intervals overlap are not told "
    "apart, and a gap smaller than a method's spread between seeds (11.6 points in the "
    "tiny world's quick size over 3 seeds, docs/results.md; another world or model has its "
    "own) says nothing about one method against another: that takes `seed compare` over "
    "several seeds."
)


def table(rows: dict[str, dict[str, Any]], split: str, env: str = DEFAULT_ENV) -> str:
    """Markdown table: one row per method, success (%) per family with its episodes in
    parentheses, the average over families, the success over all the row's episodes with
    its 95 % (Wilson) interval, the mean episode length and the episodes."""
    cells = {}
    for method, result in rows.items():
        r = result[split]
        counts = r.get("per_family_episodes", {})
        n = r["episodes"]
        low, high = wilson(round(r["success"] * n), n) if n else (0.0, 1.0)
        pooled = f"{100 * r['success']:.1f} [{100 * low:.0f}, {100 * high:.0f}]"
        cells[method] = [
            _rate(r["per_family"][f], counts.get(f)) if f in r["per_family"] else "–"
            for f, _ in family_columns(env)
        ] + [f"{100 * r['macro_avg']:.1f}", pooled, f"{r['episode_length']:.1f}", str(n)]
    return method_table(cells, env, extra=("All [95 %]", "Len", "Episodes"))


def _rate(rate: float, episodes: int | None) -> str:
    """A success rate in %, with the episodes behind it where they are known."""
    return f"{100 * rate:.1f}" + (f" ({episodes})" if episodes is not None else "")


def _fact(value: Any) -> str:
    """A fact of the run as text: a nested dict as ``key value; key value`` (nested in
    parentheses), numbers as they are."""
    if isinstance(value, dict):
        parts = [f"{k.replace('_', ' ')} {_fact(v)}" for k, v in value.items()]
        return "; ".join(parts) if parts else "–"
    if isinstance(value, list | tuple):
        return ", ".join(_fact(v) for v in value)
    return str(value)


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
    out_dir: Path,
    evaluations: dict[str, dict],
    facts: dict[str, Any],
    env: str = DEFAULT_ENV,
    title: str | None = None,
) -> Path:
    """OUT/report.md (+ curves.png) from the evaluations and the run's facts; ``title``: the
    environment's name in the headings (default ``env``)."""
    out_dir = Path(out_dir)
    png = None
    metrics = out_dir / "stage2" / "metrics.jsonl"
    if metrics.is_file():
        png = plot_curves(metrics, out_dir / "curves.png")
    lines = ["# megatron-seed default job: report", ""]
    for key, value in facts.items():
        if isinstance(value, dict):  # a block of its own, one line per entry
            lines.append(f"- {key.replace('_', ' ')}:")
            lines += [f"  - {k.replace('_', ' ')}: {_fact(v)}" for k, v in value.items()]
        else:
            lines.append(f"- {key.replace('_', ' ')}: {_fact(value)}")
    legend = (
        "Success rate (%) at evaluation, with the episodes behind it in parentheses; Avg = "
        "the mean over the families played; All = the success over all the row's episodes "
        "with its 95 % interval (Wilson); Len = mean episode length (steps); Episodes = "
        "all episodes of the row; – = no task of that family in this split."
    )
    if any("*" in name for name in evaluations):
        legend += " Rows marked * play with the skill library's text in every prompt."
    lines += ["", legend, ""]
    name = title or env
    titles = {
        "seen": f"{name} (seen)",
        "unseen": f"{name} (unseen)",
        "train": "Stage-2 training games",
    }
    for split, title in titles.items():
        if all(split in r for r in evaluations.values()):
            decoding = next(iter(evaluations.values()))[split].get("decoding", "greedy")
            lines += [f"## {title} ({decoding})", "", table(evaluations, split, env), ""]
    lines += against_base(evaluations)
    lines += [WHAT_IT_SHOWS, ""]
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


def against_base(evaluations: dict[str, dict], split: str = "train") -> list[str]:
    """Report lines: each other model's success on ``split`` minus the base's, over all
    episodes, with a 95 % t interval paired by game (both played the same games with the same
    draws: each game's difference of success rates is one observation); [] where the split
    has no per-game results or one game."""
    base = evaluations.get(BASE_LABEL, {}).get(split, {}).get("per_game")
    if not base or len(base) < 2:
        return []
    lines = ["## Against the base on the training games", ""]
    for label, result in evaluations.items():
        games = result.get(split, {}).get("per_game") or {}
        if label == BASE_LABEL or set(games) != set(base):
            continue
        diffs = [games[g][0] / games[g][1] - base[g][0] / base[g][1] for g in sorted(base)]
        mean, half = t_interval(diffs)
        verdict = "above" if mean - half > 0 else "below" if mean + half < 0 else "not told from"
        lines.append(
            f"- {label} - base: {100 * mean:+.1f} points [{100 * (mean - half):+.1f}, "
            f"{100 * (mean + half):+.1f}] (95 % t, paired over {len(diffs)} games): "
            f"{verdict} the base in this run"
        )
    return [*lines, ""] if len(lines) > 2 else []


def cell(rates: list[float], episodes: list[int]) -> str:
    """``mean ± half (n)`` in %: t over seeds; ``mean [low, high] (n)``: Wilson's interval
    over the episodes, for one seed, or when every seed gave the same rate (the t interval
    would claim a certainty of 0 width: 0/7 three times is not a 0 % rate)."""
    if not rates:
        return "–"
    n = sum(episodes)
    mean, half = t_interval(rates)
    if n == 0 and len(rates) == 1:  # no episode count recorded: the rate alone
        return f"{100 * mean:.1f}"
    if len(rates) == 1 or (half == 0.0 and n > 0):
        won = round(sum(r * e for r, e in zip(rates, episodes, strict=True)))
        low, high = wilson(won, n)
        return f"{100 * mean:.1f} [{100 * low:.0f}, {100 * high:.0f}] ({n})"
    return f"{100 * mean:.1f} ± {100 * half:.1f} ({n})"


def compare_table(results: dict[str, list[dict]], split: str, env: str = DEFAULT_ENV) -> str:
    """Success (%) per family and on average: mean over seeds, 95 % interval, episodes."""
    rows = {}
    for method, runs in results.items():
        cells = []
        for fam, _ in family_columns(env):
            have = [r[split] for r in runs if fam in r[split]["per_family"]]
            rates = [r["per_family"][fam] for r in have]
            counts = [r.get("per_family_episodes", {}).get(fam, 0) for r in have]
            cells.append(cell(rates, counts))
        cells.append(
            cell([r[split]["macro_avg"] for r in runs], [r[split]["episodes"] for r in runs])
        )
        rows[method] = cells
    return method_table(rows, env)


BASE = BASE_LABEL
EQUIVALENCE_MARGIN = 0.10  # the TOST margin of "no difference" lines: 10 points


def difference_lines(results: dict[str, list[dict]], split: str) -> list[str]:
    """Each method's average minus the reference's (GRPO), then each trained method's minus
    the base's, paired by seed, with its 95 % interval; "~" marks a difference not
    distinguishable from noise, and such a line says whether a TOST bounds it within
    +-10 points (90 % interval)."""
    methods = list(results)
    if not methods:
        return []
    ref = "GRPO" if "GRPO" in methods else methods[-1]
    against_base = BASE in methods and ref != BASE
    pairs = [(m, ref) for m in methods if m != ref and not (against_base and m == BASE)]
    if against_base:
        pairs += [(m, BASE) for m in methods if m not in (BASE, "Stage-1 SFT")]
    return [_difference_line(results, split, m, other) for m, other in pairs]


def _difference_line(results: dict[str, list[dict]], split: str, m: str, ref: str) -> str:
    a = [r[split]["macro_avg"] for r in results[m]]
    b = [r[split]["macro_avg"] for r in results[ref]]
    if len(a) != len(b):  # merged comparisons where one of the two was not run
        return f"- {m} − {ref}: n/a ({len(a)} vs {len(b)} seeds)"
    mean, half, real = paired_difference(a, b)
    if half != half:
        return f"- {m} − {ref}: {100 * mean:+.1f} ± n/a (one seed) points"
    line = f"- {m} − {ref}: {100 * mean:+.1f} ± {100 * half:.1f} points"
    if real:
        return line
    _, low, high, within = tost([x - y for x, y in zip(a, b, strict=True)], EQUIVALENCE_MARGIN)
    bound = "within" if within else "not shown within"
    tost_text = f"TOST: {bound} ±{100 * EQUIVALENCE_MARGIN:.0f} (90 % [{100 * low:+.1f}, {100 * high:+.1f}])"
    return f"{line} ~ (not distinguishable from noise; {tost_text})"


PHASES = ("sync", "rollout", "analyze", "train", "update")


def phase_seconds(metrics_path: Path) -> dict[str, float]:
    """Median seconds per update of each phase (update 1, the engines' warm-up, excluded
    when there are more)."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    rows = rows[1:] if len(rows) > 1 else rows
    return {phase: statistics.median(r.get(f"time/{phase}", 0.0) for r in rows) for phase in PHASES}


SKILL_KEYS = (
    ("analyze/valid_rate", "valid %"),
    ("valid_won", "valid % (won)"),
    ("valid_lost", "valid % (lost)"),
    ("lost_share", "lost share %"),
    ("analyze/degenerate_rate", "degenerate %"),
    ("train/opd/token_frac", "OPD token share %"),
)


def skill_rows(metrics_path: Path) -> list[dict[str, float]]:
    """Per update, one run's analyzer metrics: the valid and degenerate skill rates, the
    valid rate split by the analysed episode's outcome with the lost episodes' share (from
    the run's trajectories: the analyzer's valid rate is a mix of the two, so a change in
    outcomes moves it without the analyzer changing), and the share of the update's
    response tokens the teacher scored (the OPD term's reach). [] when it ran no analyzer;
    NaN where the update analysed no episode of that outcome."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if not rows or "analyze/degenerate_rate" not in rows[0]:  # fixed skills: no analyzer
        return []
    out = []
    for r in rows:
        row = {key: r.get(key, math.nan) for key, _ in SKILL_KEYS}
        # update `step` (1-based) wrote its trajectories, before training, as step - 1
        out.append(row | _validity_by_outcome(metrics_path.parent, int(r["step"]) - 1))
    return out


def _validity_by_outcome(run_dir: Path, update: int) -> dict[str, float]:
    """One update's valid rate over its analysed won and lost episodes and the lost share
    (NaN without the update's trajectories file or such episodes)."""
    from megatron_seed.data.records import read_jsonl

    path = run_dir / "trajectories" / f"update_{update:05d}.jsonl"
    if not path.is_file():
        return {}
    analysed = [r for r in read_jsonl(path) if r.analysis is not None]
    won = [r.analysis.valid for r in analysed if r.won]
    lost = [r.analysis.valid for r in analysed if not r.won]

    def rate(xs: list[bool]) -> float:
        return sum(xs) / len(xs) if xs else math.nan

    return {
        "valid_won": rate(won),
        "valid_lost": rate(lost),
        "lost_share": len(lost) / len(analysed) if analysed else math.nan,
    }


def success_curve(metrics_path: Path) -> list[float]:
    """One run's rollout success (fraction of the update's episodes won) per update."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    return [float(r.get("rollout/success", math.nan)) for r in rows]


def fixed_curve(metrics_path: Path) -> list[list[float]]:
    """One run's fixed-game learning curve: [update, success] for each update at which
    Stage 2 evaluated its policy (`evaluate/success`: the same games and draws each time)."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    return [[int(r["step"]), float(r["evaluate/success"])] for r in rows if "evaluate/success" in r]


def fixed_curve_table(
    fixed: dict[str, list[list[list[float]]]], starts: dict[str, list[dict]] | None = None
) -> str:
    """Success (%) on the training games at the updates Stage 2 evaluated, mean over seeds
    with the lowest and highest seed; update 0 is the final evaluation (same draws) of the
    model Stage 2 started from (``starts``: per method, its start's results per seed: the
    base's, or the Stage-1 model's for a method with a Stage 1)."""
    fixed = {m: runs for m, runs in fixed.items() if runs and all(runs)}
    if not fixed:
        return ""
    steps = sorted({int(s) for runs in fixed.values() for run in runs for s, _ in run})
    head = "| method | " + " | ".join(f"update {s}" for s in [0, *steps]) + " |"
    lines = [head, "| --- |" + " ---: |" * (len(steps) + 1)]
    for method, runs in fixed.items():
        start = [
            100 * r["train"]["success"] for r in (starts or {}).get(method, []) if "train" in r
        ]
        cells = [_spread(start) if start else "–"]
        for step in steps:
            values = [100 * v for run in runs for s, v in run if int(s) == step]
            cells.append(_spread(values) if len(values) == len(runs) else "–")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _curve_starts(
    results: dict[str, list[dict]], fixed: dict[str, list[Any]]
) -> dict[str, list[dict]]:
    """Per method label of ``fixed``, the results rows of the model its Stage 2 started
    from: the Stage-1 model's for a method with a Stage 1, else the base's."""
    from megatron_seed.methods import METHODS

    stage1 = {m.label for m in METHODS.values() if m.stage1}
    start = {label: "Stage-1 SFT" if label in stage1 else BASE for label in fixed}
    return {label: results.get(row, []) for label, row in start.items()}


def _spread(values: list[float]) -> str:
    """'mean [lowest, highest]' of per-seed values (%)."""
    return f"{statistics.fmean(values):.1f} [{min(values):.1f}, {max(values):.1f}]"


def plot_learning_curves(curves: dict[str, list[list[float]]], out_png: Path) -> Path | None:
    """Each method's rollout success per Stage-2 update: the mean over its seeds, and a band
    from the lowest to the highest seed (None when no method has a curve)."""
    curves = {m: runs for m, runs in curves.items() if runs and all(runs)}
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, runs in curves.items():
        n = min(len(r) for r in runs)
        steps = list(range(1, n + 1))
        per_update = [[100 * r[u] for r in runs] for u in range(n)]
        mean = [statistics.fmean(v) for v in per_update]
        line = ax.plot(steps, mean, marker="o", label=f"{method} ({len(runs)} seeds)")[0]
        low, high = [min(v) for v in per_update], [max(v) for v in per_update]
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("Stage-2 update")
    ax.set_ylabel("rollout success (%)")
    ax.set_title("learning curves: mean over seeds, band = lowest to highest seed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def skill_table(runs: dict[str, list[list[dict[str, float]]]]) -> str:
    """Per update, each method's `SKILL_KEYS` (mean over seeds, %; a row only where some
    seed has it): the policy's own analyzer eroding, or kept by analyzer replay, on won and
    lost episodes, and how much of each update the teacher still reaches."""
    runs = {m: r for m, r in runs.items() if r and all(r)}
    if not runs:
        return ""
    updates = min(len(rows) for seeds in runs.values() for rows in seeds)
    head = "| method | skill metric | " + " | ".join(str(u + 1) for u in range(updates)) + " |"
    lines = [head, "| --- | --- |" + " ---: |" * updates]
    for method, seeds in runs.items():
        for key, name in SKILL_KEYS:
            cells = [
                _percent([rows[u].get(key, math.nan) for rows in seeds]) for u in range(updates)
            ]
            if any(c != "–" for c in cells):
                lines.append(f"| {method} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _percent(values: list[float]) -> str:
    """The mean of the seeds' values that are numbers, in %; "–" when none is."""
    known = [v for v in values if not math.isnan(v)]
    return f"{100 * statistics.fmean(known):.0f}" if known else "–"


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


# compare.json's sections: per method (label) a list of one entry per seed
PER_METHOD = ("results", "seconds", "skills", "curves", "fixed_curves")


def read_comparison(path: Path) -> dict[str, Any]:
    """A comparison's compare.json (`write_summary`), checked before anything reads it:
    `FileNotFoundError` if there is none, a one-line `CommandError` naming the file and the
    field for a cut or malformed one."""
    if not path.is_file():
        raise FileNotFoundError(f"no compare.json at {path}")
    try:
        summary = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CommandError(f"{path}: not a comparison (cut short or not JSON: {err})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("results"), dict):
        raise CommandError(f"{path}: not a comparison (no results object)")
    for key in PER_METHOD:
        section = summary.get(key, {})
        if not isinstance(section, dict) or not all(
            isinstance(runs, list) for runs in section.values()
        ):
            raise CommandError(f"{path}: {key} must map each method to a list of its seeds' runs")
    if not all(isinstance(r, dict) for runs in summary["results"].values() for r in runs):
        raise CommandError(f"{path}: results must hold one object per run")
    for key in ("seeds", "settings"):
        if not isinstance(summary.get(key, []), list):
            raise CommandError(f"{path}: {key} must be a list")
    return summary


def merge_summaries(paths: list[Path]) -> dict[str, Any]:
    """One summary from the compare.json of several comparisons: per method the runs of
    every input, in input order (a method an input lacks has fewer runs); seeds likewise.
    "size": the inputs' size (None if none records one); inputs of different sizes are
    refused."""
    merged: dict[str, Any] = {
        "results": {}, "seconds": {}, "skills": {}, "curves": {}, "fixed_curves": {}, "seeds": [],
    }  # fmt: skip
    for path in paths:
        file = path / "compare.json" if path.is_dir() else path
        summary = read_comparison(file if file.is_file() else path)
        for key in PER_METHOD:
            for label, runs in summary.get(key, {}).items():
                merged[key].setdefault(label, []).extend(runs)
        merged["seeds"].extend(summary.get("seeds", []))
        size = summary.get("size")
        if size is not None and merged.setdefault("size", size) != size:
            raise CommandError(
                f"{file}: a {size}-size comparison, the first input's {merged['size']}: merge "
                "only comparisons of one size"
            )
        settings = summary.get("settings", [])
        if assignments(merged.setdefault("settings", settings)) != assignments(settings):
            raise CommandError(
                f"{file}: run with --set {settings or 'nothing'}, the first input with "
                f"{merged['settings'] or 'nothing'}: merge only comparisons of one config"
            )
    merged.setdefault("settings", [])
    merged.setdefault("size", None)
    return merged


def write_summary(
    out: Path,
    results: dict[str, list[dict]],
    seconds: dict[str, list[dict[str, float]]],
    skills: dict[str, list[list[dict[str, float]]]],
    env: str,
    size: str,
    seeds: list[Any],
    curves: dict[str, list[list[float]]] | None = None,
    settings: list[str] | None = None,
    fixed: dict[str, list[list[list[float]]]] | None = None,
) -> int:
    """OUT/compare.md (the tables; with `curves`, each method's rollout success per update
    and seed, the learning curves in OUT/curves.png) and OUT/compare.json (what they were
    made from). ``settings``: the ``--set`` changes every job ran with; ``fixed``: each
    method's fixed-game learning curve per seed (`fixed_curve`)."""
    out.mkdir(parents=True, exist_ok=True)
    title = " vs ".join(results)
    lines = [f"# {title} on {env} ({size} size, seeds {seeds})", ""]
    if settings:
        lines += ["Config changes over the recipe (`--set`): " + ", ".join(settings), ""]
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
    if table := fixed_curve_table(fixed or {}, _curve_starts(results, fixed or {})):
        lines += ["## learning curves on fixed games (training games, same draws each time)", ""]
        lines += ["Success (%) at each evaluated update: mean over seeds [lowest, highest].", ""]
        lines += [table, ""]
    if plot_learning_curves(curves or {}, out / "curves.png"):
        lines += ["## learning curves (rollout success per Stage-2 update)", ""]
        lines += ["![learning curves](curves.png)", ""]
    (out / "compare.md").write_text("\n".join(lines))
    summary = {
        "results": results, "seconds": seconds, "skills": skills, "curves": curves or {},
        "seeds": seeds, "settings": list(settings or []), "fixed_curves": fixed or {},
        "size": size,
    }  # fmt: skip
    write_json(out / "compare.json", summary)
    print("\n".join(lines))
    return 0
