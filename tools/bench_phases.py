"""Where a Stage-2 update's wall time goes, SEED vs GRPO, on this machine.

    python tools/bench_phases.py [--updates 3] [--out bench/phases.json]

Builds the tiny test world (generated ALFWorld games, a tokenizer trained on their prompts,
a random tiny Qwen2), runs `seed train` twice with the same games, seeds and budget
(B=4 tasks x N=4 episodes per update) — once SEED, once GRPO (`--grpo`) — and reads the
per-phase seconds each update logged (`time/<phase>` in metrics.jsonl). Prints and writes
the share of each phase, the episodes/s and rollout tokens/s, and the SEED/GRPO ratio of
the mean update time (update 1, which carries engine warm-up, is excluded when there are
more). The policy is random, so episodes run to the step budget: a cost measurement only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHASES = ("sync", "rollout", "analyze", "train", "checkpoint")


def _run(root: Path, name: str, updates: int, extra: list[str]) -> list[dict]:
    from megatron_seed.testbed.tiny_world import train_command

    out = root / name
    cfg = {"rollout": {"tasks_per_update": 4, "group_size": 4}, "save_every": 0}
    cmd = train_command(root, out, cfg, "--updates", str(updates), *extra)
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def summarize(rows: list[dict]) -> dict:
    """Mean seconds and share per phase over the measured updates."""
    rows = rows[1:] if len(rows) > 1 else rows
    total = statistics.fmean(r["time/update"] for r in rows)
    out = {"updates_measured": len(rows), "update_seconds_mean": total, "phases": {}}
    for p in PHASES:
        sec = statistics.fmean(r.get(f"time/{p}", 0.0) for r in rows)
        out["phases"][p] = {"seconds": sec, "share": sec / total}
    roll = statistics.fmean(r["time/rollout"] for r in rows)
    out["episodes_per_s"] = statistics.fmean(r["rollout/episodes"] for r in rows) / roll
    out["rollout_tokens_per_s"] = (
        statistics.fmean(r["rollout/generated_tokens"] for r in rows) / roll
    )
    return out


def main() -> int:
    """Run both algorithms and report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--out", default="bench/phases.json")
    args = parser.parse_args()
    from megatron_seed.testbed.tiny_world import make_tiny_world

    root = make_tiny_world(Path(tempfile.mkdtemp(prefix="seed-phases-")))
    result = {
        "seed": summarize(_run(root, "seed", args.updates, [])),
        "grpo": summarize(_run(root, "grpo", args.updates, ["--grpo"])),
    }
    result["seed_over_grpo_update_time"] = (
        result["seed"]["update_seconds_mean"] / result["grpo"]["update_seconds_mean"]
    )
    print(f"{'phase':12s} {'SEED s':>8s} {'share':>6s} {'GRPO s':>8s} {'share':>6s}")
    for p in PHASES:
        s, g = result["seed"]["phases"][p], result["grpo"]["phases"][p]
        print(
            f"{p:12s} {s['seconds']:8.2f} {s['share']:6.1%} {g['seconds']:8.2f} {g['share']:6.1%}"
        )
    for k in ("seed", "grpo"):
        r = result[k]
        print(
            f"{k}: update {r['update_seconds_mean']:.2f} s, {r['episodes_per_s']:.2f} episodes/s, "
            f"{r['rollout_tokens_per_s']:.0f} rollout tokens/s"
        )
    print(f"SEED / GRPO update time: {result['seed_over_grpo_update_time']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
