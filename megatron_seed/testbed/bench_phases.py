"""`seed bench phases`: what a SEED update costs next to a GRPO update, with the phases run
turn-synchronously (`rollout.overlap` off) and overlapped (on).

The quick default job's world (its games, its base policy and Stage-1 SFT model, built or
reused under WORK) and one engine fleet serve four Stage-2 runs from the same theta_sft:
GRPO and SEED, each synchronous and overlapped, with the quick recipe's budget and seed.
The runs take turns, one update each per round (the order rotates every round), so machine
noise falls on all four alike; every update is a fresh `run_stage2` call that resumes its
run's checkpoint, like a preempted job would.

Per phase (`time/rollout`, `time/analyze`, `time/train`) the median over the rounds, and
per update the sum of the three (`work`): the sync that starts each resumed update and the
checkpoint after it are the same for every run and are reported apart. Ratios: SEED / GRPO
synchronous and overlapped, and overlapped GRPO / synchronous GRPO. Results go to a JSON
file and are printed.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

VARIANTS = {  # name: (method, overlap)
    "grpo/sync": ("grpo", False),
    "seed/sync": ("seed", False),
    "grpo/overlap": ("grpo", True),
    "seed/overlap": ("seed", True),
}
PHASES = ("rollout", "analyze", "train")


def run_phases(work: Path, rounds: int, seed: int = 0) -> dict[str, Any]:
    """Build or reuse the world under `work`, run `rounds` updates of every variant,
    interleaved; return the per-update rows, medians and ratios."""
    from megatron_seed.models.parallel import spawn
    from megatron_seed.pipeline.stage2 import Stage2Job, run_stage2
    from megatron_seed.testbed.base_policy import build_base_policy
    from megatron_seed.testbed.default_job import (
        JobFleet,
        _games,
        _ray_init,
        _stage1,
        job_config,
    )
    from megatron_seed.testbed.profiles import profile

    size = profile("alfworld").size(True)
    games = _games(work / "games", size, seed, "alfworld")
    base = build_base_policy(
        work / "base", quick=True, seed=seed, games_dir=work / "games", measure=False
    )
    cfg = job_config(size, "seed", seed)
    fleet = JobFleet(base, cfg)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    try:
        stage1_games = games["train"][: size.stage1_tasks]
        init = _stage1(work / "stage1-job", base, stage1_games, size, cfg, fleet)
        names = list(VARIANTS)
        for r in range(1, rounds + 1):
            turn = names[(r - 1) % len(names) :] + names[: (r - 1) % len(names)]
            for name in turn:
                method, overlap = VARIANTS[name]
                vcfg = job_config(size, method, seed)
                vcfg = dataclasses.replace(
                    vcfg,
                    updates=r,
                    rollout=dataclasses.replace(vcfg.rollout, overlap=overlap),
                )
                out = work / "stage2" / name.replace("/", "-")
                job = Stage2Job(
                    model_dir=str(init),
                    games=games["train"],
                    out_dir=str(out),
                    cfg=vcfg,
                    ray_address=_ray_init(),
                    fleet_address=fleet.get().address,
                )
                spawn(run_stage2, 1, job)
                metrics = _rows(out / "metrics.jsonl")
                rows[name].append(metrics[r - 1])
                line = " ".join(f"{p} {metrics[r - 1].get(f'time/{p}', 0.0):5.2f}" for p in PHASES)
                print(f"[round {r}/{rounds}] {name:13s} {line}", flush=True)
    finally:
        fleet.close()
    return summarize(rows)


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per variant and phase the median seconds over the updates, `work` (rollout +
    analyze + train per update, median), and the ratios the target is stated in."""
    medians: dict[str, dict[str, float]] = {}
    for name, updates in rows.items():
        med = {p: statistics.median(u.get(f"time/{p}", 0.0) for u in updates) for p in PHASES}
        med["work"] = statistics.median(
            sum(u.get(f"time/{p}", 0.0) for p in PHASES) for u in updates
        )
        for extra in ("sync", "checkpoint", "update"):
            med[extra] = statistics.median(u.get(f"time/{extra}", 0.0) for u in updates)
        tail = [u["overlap/analysis_tail_s"] for u in updates if "overlap/analysis_tail_s" in u]
        if tail:
            med["analysis_tail"] = statistics.median(tail)
        # the work itself: the policies of SEED and GRPO differ from the second update on
        for key in ("rollout/turns", "rollout/generated_tokens", "analyze/completion_tokens"):
            med[key] = statistics.median(u.get(key, 0.0) for u in updates)
        medians[name] = med
    work = {name: m["work"] for name, m in medians.items()}
    ratios = {
        "seed/grpo sync": work["seed/sync"] / work["grpo/sync"],
        "seed/grpo overlap": work["seed/overlap"] / work["grpo/overlap"],
        "grpo overlap/sync": work["grpo/overlap"] / work["grpo/sync"],
        "seed overlap/sync": work["seed/overlap"] / work["seed/sync"],
    }
    updates = {name: len(u) for name, u in rows.items()}
    return {"updates": updates, "medians": medians, "ratios": ratios, "rows": rows}


def print_summary(result: dict[str, Any]) -> None:
    """The medians table and the ratios."""
    cols = (*PHASES, "work", "sync", "checkpoint")
    print(f"{'variant':14s}" + "".join(f"{c:>11s}" for c in cols) + "   (seconds, median)")
    for name, med in result["medians"].items():
        print(f"{name:14s}" + "".join(f"{med[c]:11.2f}" for c in cols))
    print(f"{'variant':14s}{'turns':>11s}{'act tokens':>11s}{'skill tok':>11s}   (median)")
    for name, med in result["medians"].items():
        counts = [med[k] for k in ("rollout/turns", "rollout/generated_tokens")]
        counts.append(med["analyze/completion_tokens"])
        print(f"{name:14s}" + "".join(f"{c:11.0f}" for c in counts))
    for name, value in result["ratios"].items():
        print(f"  {name:22s} {value:5.2f}x")
