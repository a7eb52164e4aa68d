"""Build (or reuse) the tiny base policy: the phases of one build, and the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron_seed.testbed import ENV
from megatron_seed.testbed.base_policy.demos import collect_demos, prepare_games
from megatron_seed.testbed.base_policy.measure import measure_base_policy
from megatron_seed.testbed.base_policy.settings import (
    FORMAT_VERSION,
    MANIFEST,
    MODEL_SUBDIR,
    TOKENIZER_SUBDIR,
    BasePolicyCacheError,
    BasePolicySettings,
)
from megatron_seed.testbed.base_policy.training import train_policy


def cache_key(settings: BasePolicySettings, games_dir: Path | None) -> dict[str, Any]:
    """What a cached build must match to be reused (as JSON holds it: tuples are lists)."""
    from megatron_seed.testbed.profiles import profile

    key = {
        "format_version": FORMAT_VERSION,
        "settings": dataclasses.asdict(settings),
        "task_options": profile(settings.env).generate_options(settings.families),
        "games_dir": str(games_dir.resolve()) if games_dir is not None else None,
    }
    return json.loads(json.dumps(key))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_table(root: Path) -> dict[str, list[Any]]:
    """{relative path: [size, sha256]} of the model and tokenizer files."""
    table: dict[str, list[Any]] = {}
    for sub in (MODEL_SUBDIR, TOKENIZER_SUBDIR):
        for f in sorted((root / sub).rglob("*")):
            if f.is_file():
                table[str(f.relative_to(root))] = [f.stat().st_size, _sha256(f)]
    return table


def load_cached(out: Path, key: dict[str, Any]) -> Path | None:
    """The cached model dir if ``out`` holds a complete build with this key; None if ``out``
    does not exist; BasePolicyCacheError for anything else (never silently reused)."""
    if not out.exists():
        return None
    path = out / MANIFEST
    if not path.is_file():
        raise BasePolicyCacheError(
            f"{out} exists but has no {MANIFEST}: not a finished base-policy build; delete it"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BasePolicyCacheError(f"{path} is not JSON ({err}); delete {out}") from err
    if manifest.get("key") != key:
        old = manifest.get("key", {})
        diff = sorted(
            k
            for k in set(old.get("settings", {})) | set(key["settings"])
            if old.get("settings", {}).get(k) != key["settings"].get(k)
        )
        keys = ("format_version", "games_dir", "task_options")
        other = [k for k in keys if old.get(k) != key[k]]
        raise BasePolicyCacheError(
            f"{out} holds a base policy built with other settings (differs in "
            f"{', '.join(other + diff) or 'its key'}); use another out_dir or delete it"
        )
    for rel, (size, sha) in manifest.get("files", {}).items():
        f = out / rel
        if not f.is_file() or f.stat().st_size != size or _sha256(f) != sha:
            raise BasePolicyCacheError(f"{out}: {rel} is missing or changed; delete {out}")
    if not manifest.get("files"):
        raise BasePolicyCacheError(f"{path} lists no files; delete {out}")
    return out / MODEL_SUBDIR


def read_manifest(out_dir: str | Path) -> dict[str, Any]:
    """The manifest of a finished build (settings, timings, measured success rates)."""
    return json.loads((Path(out_dir) / MANIFEST).read_text())


def build_base_policy(
    out_dir: str | Path,
    *,
    size: str = "full",
    seed: int = 0,
    games_dir: str | Path | None = None,
    progress: bool = True,
    measure: bool = True,
    settings: BasePolicySettings | None = None,
    env: str = ENV,
) -> Path:
    """Build (or reuse) the tiny base policy; returns its HF model folder.

    ``games_dir``: training (``train``) and held-out (``seen``) games to use first; missing
    ones are generated inside the build. ``measure``: also play the held-out
    games with vLLM, without and with the plan as a hint (``manifest.json`` -> ``measured``).
    ``settings``: explicit settings (tests, experiments) instead of ``size`` (a
    `testbed.profiles` size), ``seed`` and ``env`` (the environment whose demonstrations are
    cloned).
    """
    settings = settings or BasePolicySettings.for_run(size, seed, env)
    settings.check()
    out = Path(out_dir)
    games_root = Path(games_dir) if games_dir is not None else None
    key = cache_key(settings, games_root)
    cached = load_cached(out, key)
    if cached is not None:
        if progress:
            print(f"base policy: reusing {cached}")
        return cached
    work = out.with_name(out.name + ".partial")
    if work.exists():
        shutil.rmtree(work)  # a build that died; ours by its name
    work.mkdir(parents=True)
    manifest = _build(work, settings, games_root, progress, measure)
    manifest.update(key=key, files=_file_table(work))
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    work.rename(out)
    if progress:
        print(f"base policy: built {out / MODEL_SUBDIR} in {manifest['timings_s']['total']} s")
    return out / MODEL_SUBDIR


def _build(
    work: Path, settings: BasePolicySettings, games_root: Path | None, progress: bool, measure: bool
) -> dict[str, Any]:
    """The phases of one build, each timed; returns the manifest (without key and files)."""
    timings: dict[str, float] = {}
    start = time.perf_counter()

    def lap(name: str, t0: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - t0, 1)
        return now

    t = start
    train_games, eval_games = prepare_games(games_root, work / "games", settings, progress)
    t = lap("games", t)
    demos = collect_demos(train_games, settings, progress)
    t = lap("demos", t)
    model_dir, train_stats = train_policy(demos, settings, work, progress)
    t = lap("train", t)
    timings["build"] = round(t - start, 1)
    measured: dict[str, Any] = {}
    if measure and eval_games:
        # greedy only: a temperature-1 pass with 2 samples per game hung the in-process
        # vLLM CPU engine once (docs/benchmarks.md)
        conditions = [(False, 0.0, 1), (True, 0.0, 1)]
        measured = measure_base_policy(model_dir, eval_games, settings, conditions)
        t = lap("measure", t)
    timings["total"] = round(t - start, 1)
    noisy = [d for d in demos if d.hint is None]

    def rel(paths: Sequence[Path]) -> list[str]:
        return [str(p.relative_to(work)) if p.is_relative_to(work) else str(p) for p in paths]

    return {
        "model_dir": MODEL_SUBDIR,
        "tokenizer_dir": TOKENIZER_SUBDIR,
        "games": {"train": rel(train_games), "eval": rel(eval_games)},
        "demos": {
            "noisy": len(noisy),
            "hinted": len(demos) - len(noisy),
            "mistakes_per_noisy_demo": round(sum(d.mistakes for d in noisy) / len(noisy), 3),
            "actions_per_demo": round(sum(len(d.actions) for d in demos) / len(demos), 2),
        },
        "train": train_stats,
        "measured": measured,
        "timings_s": timings,
    }
