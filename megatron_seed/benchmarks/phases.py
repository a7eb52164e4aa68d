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
synchronous and overlapped, and overlapped GRPO / synchronous GRPO, of the medians and
paired (the median of the per-round ratios). Over each update's rollout and analysis, the
CPU seconds of the engines and of the env workers and the machine's idle share (Stage 2's
`cpu/` metrics): whether a path uses the cores better or only differently. Results go to a
JSON file and are printed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

from envs.spec import DEFAULT_ENV as ENV

_OVERLAP = {"rollout": {"overlap": True}}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {  # name: (method, config changes)
    "grpo/sync": ("grpo", {}),
    "seed/sync": ("seed", {}),
    "grpo/overlap": ("grpo", _OVERLAP),
    "seed/overlap": ("seed", _OVERLAP),
}
# more, on request (`--extra`): the other overlap pacing, selective analysis, the paper's two
# analyzer retries (an invalid reply is asked again, quoting the error: the chain the last
# analyses make; the quick recipe has none)
EXTRA: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo/overlap-free": ("grpo", {"rollout": {"overlap": True, "overlap_pacing": "free"}}),
    "seed/overlap-free": ("seed", {"rollout": {"overlap": True, "overlap_pacing": "free"}}),
    "seed/overlap-mixed": ("seed", {**_OVERLAP, "skill": {"select": "mixed_groups"}}),
    "seed/overlap-uncertain": ("seed", {**_OVERLAP, "skill": {"select": "uncertain"}}),
    "seed/overlap-retry": ("seed", {**_OVERLAP, "skill": {"max_retries": 2}}),
}
PHASES = ("rollout", "analyze", "train")


FROZEN_LR = 1e-12  # `frozen`: Adam's steps of ~lr leave theta_sft as it is, to fp32 precision


def run_phases(
    work: Path,
    rounds: int,
    seed: int = 0,
    extra: list[str] | None = None,
    frozen: bool = False,
) -> dict[str, Any]:
    """Build or reuse the world under `work`, run `rounds` updates of every variant (the
    four of `VARIANTS`, and the named ones of `EXTRA`), interleaved; return the per-update
    rows, medians and ratios. `frozen`: every update trains with lr `FROZEN_LR`, so every
    variant keeps sampling from theta_sft (the same work per update, and the same policy:
    without it each variant's policy drifts its own way from the second update on, and
    with it the lengths of its episodes and skills)."""
    from megatron_seed.compare.job import JobFleet, ray_init, run_stage1
    from megatron_seed.models.parallel import spawn
    from megatron_seed.pipeline.stage2 import Stage2Job, run_stage2
    from megatron_seed.testbed.base_policy import build_base_policy
    from megatron_seed.testbed.default_job import _games, job_config
    from megatron_seed.testbed.profiles import profile

    size = profile(ENV).size("quick")
    games = _games(work / "games", size, seed, ENV)
    base = build_base_policy(
        work / "base", size="quick", seed=seed, games_dir=work / "games", measure=False
    )
    cfg = job_config(size, "seed", seed)
    unknown = sorted(set(extra or ()) - set(EXTRA))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {sorted(EXTRA)}")
    variants = {**VARIANTS, **{name: EXTRA[name] for name in extra or ()}}
    fleet = JobFleet(base, cfg)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    try:
        stage1_games = games["train"][: size.stage1_tasks]
        init = run_stage1(work / "stage1-job", base, stage1_games, cfg, fleet)
        # the Stage-2 runs start afresh: an earlier bench's run would resume, and its
        # metrics rows would be read as this one's
        shutil.rmtree(work / "stage2", ignore_errors=True)
        names = list(variants)
        for r in range(1, rounds + 1):
            turn = names[(r - 1) % len(names) :] + names[: (r - 1) % len(names)]
            for name in turn:
                method, changes = variants[name]
                vcfg = job_config(size, method, seed).with_changes(changes)
                # every update steps: a skipped step (algo.no_signal) would shorten the
                # train phase by chance and skew the SEED / GRPO timings
                vcfg = vcfg.with_changes({"algo": {"no_signal": "step"}})
                if frozen:
                    vcfg = vcfg.with_changes({"optim": {"lr": FROZEN_LR}})
                vcfg = dataclasses.replace(vcfg, updates=r)
                out = work / "stage2" / name.replace("/", "-")
                job = Stage2Job(
                    model_dir=str(init),
                    games=games["train"],
                    out_dir=str(out),
                    cfg=vcfg,
                    ray_address=ray_init(),
                    fleet_address=fleet.get().address,
                )
                spawn(run_stage2, 1, job)
                metrics = _rows(out / "metrics.jsonl")
                rows[name].append(metrics[r - 1])
                line = " ".join(f"{p} {metrics[r - 1].get(f'time/{p}', 0.0):5.2f}" for p in PHASES)
                print(f"[round {r}/{rounds}] {name:13s} {line}", flush=True)
    finally:
        fleet.close()
    return {**summarize(rows), "frozen": frozen}


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per variant and phase the median seconds over the updates, `work` (rollout +
    analyze + train per update, median), and the ratios the target is stated in."""
    medians: dict[str, dict[str, float]] = {}
    for name, updates in rows.items():
        med = {p: statistics.median(u.get(f"time/{p}", 0.0) for u in updates) for p in PHASES}
        med["work"] = statistics.median(_work(u) for u in updates)
        for extra in ("sync", "checkpoint", "update"):
            med[extra] = statistics.median(u.get(f"time/{extra}", 0.0) for u in updates)
        for kind in ("engine", "env"):  # summed over the actors: cpu/engine0_s, cpu/env1_s, ...
            actor = re.compile(rf"cpu/{kind}\d+_s")
            med[f"cpu/{kind}s_s"] = statistics.median(
                sum(v for k, v in u.items() if actor.fullmatch(k)) for u in updates
            )
        tail = [u["overlap/analysis_tail_s"] for u in updates if "overlap/analysis_tail_s" in u]
        if tail:
            med["analysis_tail"] = statistics.median(tail)
        # the work itself: the policies of SEED and GRPO differ from the second update on
        for key in (
            "rollout/turns",
            "rollout/generated_tokens",
            "analyze/completion_tokens",
            "analyze/selected_share",
            "train/opd/token_frac",
            "cpu/machine_busy_s",
            "cpu/machine_idle_share",
        ):
            med[key] = statistics.median(u.get(key, 0.0) for u in updates)
        medians[name] = med
    pairs = {  # ratio name: (numerator, denominator)
        "seed/grpo sync": ("seed/sync", "grpo/sync"),
        "seed/grpo overlap": ("seed/overlap", "grpo/overlap"),
        "grpo overlap/sync": ("grpo/overlap", "grpo/sync"),
        "seed overlap/sync": ("seed/overlap", "seed/sync"),
    }
    for name in set(medians) - set(VARIANTS):  # an extra variant: against its method's
        method = name.split("/")[0]
        pairs[f"{name}/{method}/overlap"] = (name, f"{method}/overlap")
        if method == "seed":
            pairs[f"{name}/grpo/overlap"] = (name, "grpo/overlap")
    ratios = {k: medians[a]["work"] / medians[b]["work"] for k, (a, b) in pairs.items()}
    # the same ratios per round (the two updates ran side by side), then their median: a
    # machine whose speed drifts over the run moves both sides of each pair alike
    paired = {
        k: statistics.median(_work(x) / _work(y) for x, y in zip(rows[a], rows[b], strict=False))
        for k, (a, b) in pairs.items()
    }
    updates = {name: len(u) for name, u in rows.items()}
    return {
        "updates": updates,
        "medians": medians,
        "ratios": ratios,
        "paired": paired,
        "rows": rows,
    }


def _work(update: dict[str, float]) -> float:
    """Rollout + analyze + train seconds of one update."""
    return sum(update.get(f"time/{p}", 0.0) for p in PHASES)


def print_summary(result: dict[str, Any]) -> None:
    """The medians table and the ratios."""
    cols = (*PHASES, "work", "sync", "checkpoint")
    print(f"{'variant':23s}" + "".join(f"{c:>11s}" for c in cols) + "   (seconds, median)")
    for name, med in result["medians"].items():
        print(f"{name:23s}" + "".join(f"{med[c]:11.2f}" for c in cols))
    print(f"{'variant':23s}{'turns':>11s}{'act tokens':>11s}{'skill tok':>11s}   (median)")
    for name, med in result["medians"].items():
        counts = [med[k] for k in ("rollout/turns", "rollout/generated_tokens")]
        counts.append(med["analyze/completion_tokens"])
        print(f"{name:23s}" + "".join(f"{c:11.0f}" for c in counts))
    cpu = ("cpu/machine_busy_s", "cpu/machine_idle_share", "cpu/engines_s", "cpu/envs_s")
    print(
        f"{'variant':23s}{'busy CPU-s':>11s}{'idle':>11s}{'engines':>11s}{'envs':>11s}   (median)"
    )
    for name, med in result["medians"].items():
        print(f"{name:23s}" + "".join(f"{med[k]:11.2f}" for k in cpu))
    print(f"  {'ratio of work':40s} {'medians':>7s} {'paired':>7s}")
    for name, value in result["ratios"].items():
        print(f"  {name:40s} {value:6.2f}x {result['paired'][name]:6.2f}x")
