"""What keeps the policy's own analyzer valid: a finished run's analyses, re-asked.

The valid-skill rate of a Stage-2 run is a mix of the analyzer's rate on won and on lost
episodes, and on short and long ones. This probe takes run folders (the OUT of `seed run`,
or one job of `seed compare`: each with `stage2/`), loads the policy a run ended with
(`stage2/final_hf`: the analyzer shares the policy's weights), and re-analyses the
episodes its last `last` updates analysed (every one, as the run counted them), under the
run's own skill settings and under each variant of `VARIANTS` (the decoding settings:
sampling instead of greedy, re-asks with the parse error quoted, a larger token budget).
For every variant: the valid rate overall, on won and lost episodes, and per length of the
first ask's prompt (`LENGTH_BINS`), and the share of invalid replies per reason.

Same weights, same episodes, one engine: the variants differ only in how the analyzer is
asked. Episodes whose first prompt leaves no room for the largest variant's token budget
are left out of all (counted as ``too_long``). With T = 0 the "as run" row re-measures the
run's own rate (the last updates' analyses came from slightly earlier weights).

Usage: seed bench analyzer --runs RUN [RUN ...] [--last 4] [--out bench/analyzer.json]
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import gc
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron_seed.config import SkillConfig
    from megatron_seed.data import TrajectoryRecord

# variant name -> the run's skill settings -> the changes to ask under (decoding only)
VARIANTS: dict[str, Callable[[SkillConfig], dict[str, Any]]] = {
    "as run": lambda s: {},
    "T=1": lambda s: {"temperature": 1.0},
    "2 re-asks": lambda s: {"max_retries": 2},
    "2x tokens": lambda s: {"max_tokens": 2 * s.max_tokens},
}
LENGTH_BINS = (600, 800)  # first-ask prompt tokens: < 600, 600-799, >= 800


def check_run(run_dir: Path, last: int) -> None:
    """A `CommandError` unless ``run_dir`` holds what the probe reads, each of its kind (before
    any engine): the run's config, its final policy (`validate_policy_dir`), and the
    trajectory records of its last ``last`` updates."""
    from megatron_seed.config import SeedConfig
    from megatron_seed.data.records import read_jsonl
    from megatron_seed.errors import CommandError
    from megatron_seed.models.checks import validate_policy_dir

    if not run_dir.is_dir():
        raise CommandError(f"{run_dir} is not a directory (a finished Stage-2 run expected)")
    for need in ("stage2/config.json", "stage2/final_hf/config.json"):
        if not (run_dir / need).is_file():
            raise CommandError(f"{run_dir}: no {need} (not a finished Stage-2 run)")
    SeedConfig.load(run_dir / "stage2" / "config.json")
    validate_policy_dir(run_dir / "stage2" / "final_hf")
    files = sorted((run_dir / "stage2" / "trajectories").glob("update_*.jsonl"))
    if not files:
        raise CommandError(f"{run_dir}: no stage2/trajectories/update_*.jsonl")
    for path in files[-last:]:
        for _ in read_jsonl(path):  # a record cut short or of another schema: file and line
            pass


def analysed_records(run_dir: Path, last: int) -> list[TrajectoryRecord]:
    """The episodes the run's last ``last`` updates had its analyzer analyse, from
    OUT/stage2/trajectories; a `CommandError` when there are none."""
    from megatron_seed.data.records import read_jsonl
    from megatron_seed.errors import CommandError

    files = sorted((run_dir / "stage2" / "trajectories").glob("update_*.jsonl"))
    records = [
        r
        for path in files[-last:]
        for r in read_jsonl(path)
        if r.analysis is not None and r.analysis.source == "analyzer"
    ]
    if not records:
        raise CommandError(f"{run_dir}: its last {last} updates analysed no episode")
    return records


def length_bin(prompt_tokens: int) -> str:
    """The `LENGTH_BINS` label of an analyzer prompt length."""
    lo = 0
    for hi in LENGTH_BINS:
        if prompt_tokens < hi:
            return f"{lo}-{hi - 1}"
        lo = hi
    return f">={lo}"


def tally(records: list[TrajectoryRecord], lengths: list[int]) -> dict[str, Any]:
    """Valid rates of analysed ``records``: overall, by outcome, by the length of each one's
    first-ask prompt (``lengths``, aligned), and the invalid replies' reasons (digits folded
    to N) with their shares."""

    def rate(rs: list[Any]) -> dict[str, float]:
        return {"valid": sum(r.analysis.valid for r in rs) / len(rs), "n": len(rs)} if rs else {}

    by_length: dict[str, list[Any]] = collections.defaultdict(list)
    for r, tokens in zip(records, lengths, strict=True):
        by_length[length_bin(tokens)].append(r)
    invalid = [r for r in records if not r.analysis.valid]
    reasons = collections.Counter(re.sub(r"\d+", "N", r.analysis.error or "?") for r in invalid)
    return {
        "all": rate(records),
        "won": rate([r for r in records if r.won]),
        "lost": rate([r for r in records if not r.won]),
        "by_prompt_tokens": {k: rate(v) for k, v in sorted(by_length.items())},
        "invalid_reasons": {k: n / len(invalid) for k, n in reasons.most_common()},
    }


def probe_run(
    run_dir: Path, last: int, variants: dict[str, Callable[[SkillConfig], dict[str, Any]]]
) -> dict[str, Any]:
    """Re-analyse one run's last analysed episodes with its final policy under each
    variant (see the module docstring)."""
    from transformers import AutoTokenizer

    from megatron_seed.config import SeedConfig
    from megatron_seed.data.requests import request_ids
    from megatron_seed.rollout.analyzer import analyze_records
    from megatron_seed.rollout.engine import VLLMEngine
    from megatron_seed.rollout.session import engine_spec
    from megatron_seed.skills.parse import build_requests

    cfg = SeedConfig.load(run_dir / "stage2" / "config.json")
    model = run_dir / "stage2" / "final_hf"
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    spec = engine_spec(cfg, model)
    # every variant asks about the same episodes, and with the run's selection already made
    skills = {
        name: dataclasses.replace(cfg.skill, **{"select": "all", **change(cfg.skill)})
        for name, change in variants.items()
    }
    limit = spec.max_model_len - max(s.max_tokens for s in skills.values())
    records = analysed_records(run_dir, last)
    requests = build_requests(records, cfg.skill.analyzer_layout, cfg.skill.min_words)
    first = [len(request_ids(tokenizer, q)) for q in requests]
    kept = [i for i, n in enumerate(first) if n <= limit]
    records, lengths = [records[i] for i in kept], [first[i] for i in kept]
    out: dict[str, Any] = {"episodes": len(records), "too_long": len(first) - len(kept)}
    out["variants"] = {}
    engine = VLLMEngine.from_spec(str(model), spec)
    for name, skill in skills.items():
        asked = [dataclasses.replace(copy.deepcopy(r), skill=None, analysis=None) for r in records]
        analyze_records(engine, tokenizer, asked, skill, max_prompt_tokens=limit)
        out["variants"][name] = tally(asked, lengths)
        print(f"[{run_dir.name}] {name}: valid {out['variants'][name]['all']['valid']:.3f}")
    del engine  # one engine at a time: the next run's starts after this one is freed
    gc.collect()
    return out


def pooled(per_run: dict[str, dict[str, Any]], variant: str, key: str, sub: str = "") -> str:
    """A variant's valid rate over every run's episodes of one stratum, "x % (n)"."""
    valid = n = 0.0
    for run in per_run.values():
        cell = run["variants"][variant][key]
        cell = cell.get(sub, {}) if sub else cell
        if cell:
            valid += cell["valid"] * cell["n"]
            n += cell["n"]
    return f"{100 * valid / n:.0f} ({n:.0f})" if n else "–"


def table(per_run: dict[str, dict[str, Any]]) -> str:
    """Valid % (episodes) per variant: overall, won, lost, each prompt-length bin; pooled
    over the runs."""
    lengths = sorted(
        {b for r in per_run.values() for v in r["variants"].values() for b in v["by_prompt_tokens"]}
    )
    heads = ["all", "won", "lost", *[f"prompt {b}" for b in lengths]]
    lines = ["| variant | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * len(heads)]
    variants = next(iter(per_run.values()))["variants"]
    for name in variants:
        cells = [pooled(per_run, name, k) for k in ("all", "won", "lost")]
        cells += [pooled(per_run, name, "by_prompt_tokens", b) for b in lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(work: list[str], last: int, out: Path) -> dict[str, Any]:
    """Probe every run folder in ``work``; print the pooled table and write ``out``."""
    for w in work:  # every folder checked before the first engine starts
        check_run(Path(w), last)
    per_run = {str(w): probe_run(Path(w), last, VARIANTS) for w in work}
    text = table(per_run)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"last_updates": last, "runs": per_run, "table": text}, indent=2))
    print(f"wrote {out}")
    return per_run
