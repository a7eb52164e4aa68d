"""The default job: SEED end to end on one CPU machine (`seed run [--quick] [--env NAME]`).

Phases, each resumable (a finished phase is recorded in OUT/progress.json and skipped on a
rerun; Stage 2 resumes from its own checkpoints):

  games    the environment's tasks generated offline: train / seen / unseen (OUT/games, or a
           shared folder; `games/done` marks a finished set)
  base     the tiny base policy (tokenizer + Qwen2, behaviour cloning; cached): the job's
           training games are among the cloned ones (see `base_policy`)
  collect  Stage 1: K0 rollouts per task of the base policy, no skills
  annotate Stage 1: the environment's oracle analyzer -> skills; invalid ones dropped
  sft      Stage 1: NLL on the skill answers -> theta_sft (actor and analyzer)
  stage2   Stage 2: SEED (or GRPO) updates with the fleet and the Megatron trainer
  evaluate episodes without skills: greedy on seen and unseen games, sampled (the rollout
           temperature, fixed seed) on the training games
  report   OUT/report.md (Table-1 layout), OUT/curves.png, OUT/eval.json

`--algo` picks the method (`megatron_seed.methods`): SEED, or any row of the paper's Table 1
(vanilla, skill-prompt, grpo, skill-grpo, opsd, opsd-paper, grpo-opsd, skill-sd, rlsd, sdar)
or of its Table 2 (no-sft, no-opd, static-skills), or seed-replay (SEED with analyzer
replay). Methods that read a family skill library get one written from Stage-1 annotations of
the base policy (`library` phase: K0 rollouts, the oracle analyzer, per family a success's
and a failure's skill; shared by the methods of a seed in `seed compare`), or the user's
folder (`--skill-library`). Methods that train nothing are the base evaluated as it is (with
the library's skill for Skill-Prompt*).

`job_config` is the job's recipe (`megatron_seed.recipes`: `default`, `default-quick`; it
states only what differs from the paper's defaults, and why) for one method, seed and
environment. The environment (`--env`: alfworld, search, sokoban) brings its rollout budgets
(under the recipe) and, from `testbed.profiles`, its sizes and the tiny policy's limits. ALFWorld's sizes: FULL (all six families, 16 training
games, a base cloned on 200 games) and QUICK (Pick only, 6 training games, a base cloned on
those 6 games alone: too little compute for it to play unseen games).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from envs.spec import get_env
from megatron_seed.config import SeedConfig
from megatron_seed.methods import METHODS, Method
from megatron_seed.testbed import ENV
from megatron_seed.testbed.profiles import ALFWORLD, JobSize, profile

FULL = ALFWORLD.full  # ALFWorld's sizes (`testbed.profiles` has every environment's)
QUICK = ALFWORLD.quick
EVAL_SEED = 1234  # sampled evaluation draws: the same for every model of a run


def method_of(algo: str) -> Method:
    """The method named `algo`; a clear error for an unknown name."""
    if algo not in METHODS:
        raise ValueError(f"unknown algorithm {algo!r}; choose one of {sorted(METHODS)}")
    return METHODS[algo]


def job_config(
    size: JobSize,
    algo: str = "seed",
    seed: int = 0,
    env: str = ENV,
    updates: int | None = None,
) -> SeedConfig:
    """The default job's config: its recipe (`megatron_seed.recipes`) over the
    environment's rollout budgets, for this method and seed (the environment's
    `testbed.profiles` rollout settings on top); ``updates``: Stage-2 updates instead of the
    recipe's."""
    from megatron_seed import recipes

    cfg = recipes.on_env(recipes.get(size.recipe).config, get_env(env).rollout)
    if updates is not None:
        cfg = cfg.with_changes({"updates": updates})
    method = method_of(algo)
    if method.trains:
        cfg = method.config(cfg)
    if cfg.algo.advantage_reweight == "rlsd":
        # RLSD's lambda falls to 0 over the first 2/3 of the run, as the reference stack's
        # 100 of 150 updates (its default 100 would barely move in a short job)
        decay = max(1, round(cfg.updates * 2 / 3))
        cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, rlsd_decay_updates=decay))
    rollout = dataclasses.replace(cfg.rollout, **profile(env).rollout)
    env_cfg = dataclasses.replace(cfg.env, name=env)
    return dataclasses.replace(cfg, rollout=rollout, env=env_cfg, seed=seed)


def _progress(out: Path) -> dict[str, Any]:
    path = out / "progress.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _mark(out: Path, phase: str, value: Any = True) -> None:
    state = _progress(out)
    state[phase] = value
    (out / "progress.json").write_text(json.dumps(state, indent=2) + "\n")


def _games(root: Path, size: JobSize, seed: int, env_name: str) -> dict[str, list[str]]:
    """The job's games (generated once; ``root/done`` marks a finished set)."""
    env = get_env(env_name)
    if not (root / "done").is_file():
        if root.exists():
            shutil.rmtree(root)  # a generation that died
        # the task options the base policy is built for (ALFWorld: small rooms)
        options = profile(env_name).generate_options(size.families)
        for split, n in (("train", size.n_train), ("seen", size.n_eval), ("unseen", size.n_eval)):
            env.generate_tasks(root, split, n, seed, **options)
        (root / "done").write_text("")
    return {s: [str(g) for g in env.list_tasks(root, s)] for s in ("train", "seen", "unseen")}


class JobFleet:
    """The job's one fleet of vLLM engines, started when a phase first needs it and shared
    by Stage 1, Stage 2 (another process; it connects by address) and the evaluation: each
    phase loads its own weights, so the engines start once (they are most of a phase's
    fixed cost on 2 cores)."""

    def __init__(self, model_dir: Path, cfg: SeedConfig) -> None:
        self.model_dir, self.cfg = model_dir, cfg
        self._fleet: Any = None

    def get(self) -> Any:
        """The running fleet (started on the first call)."""
        if self._fleet is None:
            from megatron_seed.rollout.session import start_fleet

            _ray_init()
            self._fleet = start_fleet(self.cfg, self.model_dir)
        return self._fleet

    def close(self) -> None:
        """Stop the engines (if they were started)."""
        if self._fleet is not None:
            self._fleet.close()
            self._fleet = None


def _ray_init() -> str:
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=tempfile.mkdtemp(prefix="seed-ray-"),
        )
    return ray.get_runtime_context().gcs_address


def run_default_job(
    out_dir: str | Path,
    quick: bool = False,
    seed: int = 0,
    algo: str = "seed",
    base_dir: str | Path | None = None,
    games_dir: str | Path | None = None,
    env: str = ENV,
    library_dir: str | Path | None = None,
    user_library: str | Path | None = None,
    updates: int | None = None,
    eval_episodes: int | None = None,
) -> dict[str, Any]:
    """Run (or resume) the whole job on ``env``; returns the evaluations and facts of the
    report. ``updates``: Stage-2 updates instead of the recipe's; ``eval_episodes``: sampled
    evaluation episodes per training game instead of the size's.

    ``base_dir`` / ``games_dir`` / ``library_dir`` (default under ``out_dir``): where the base
    policy (with its cached evaluation), the games and the family skill library built from
    Stage-1 annotations live, so that several jobs (``seed compare``) can share them.
    ``user_library``: a family library folder to use instead of building one.
    """
    from megatron_seed.testbed.base_policy import build_base_policy, read_manifest
    from megatron_seed.testbed.report import write_report

    method = method_of(algo)
    size = profile(env).size(quick)
    if eval_episodes is not None:
        size = dataclasses.replace(size, train_eval_episodes=eval_episodes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = job_config(size, algo, seed, env, updates)
    t0 = time.time()
    games_root = Path(games_dir or out / "games")
    games = _games(games_root, size, seed, env)
    print(
        f"[games] train {len(games['train'])}, seen {len(games['seen'])}, "
        f"unseen {len(games['unseen'])}"
    )
    base_root = Path(base_dir or out / "base")
    # the Stage-2 training games are among the base policy's behaviour-cloning games
    base = build_base_policy(
        base_root, quick=quick, seed=seed, games_dir=games_root, measure=False, env=env
    )
    facts: dict[str, Any] = {"environment": env, "size": size.name, "algorithm": algo}
    facts["seed"] = seed
    facts["base_policy"] = _base_facts(read_manifest(base_root))
    fleet = JobFleet(base, cfg)
    try:
        library = None
        if method.needs_library:
            library = Path(user_library) if user_library else Path(library_dir or out / "library")
            if not user_library:
                stage1_games = games["train"][: size.stage1_tasks]
                facts["library"] = _library(library, base, stage1_games, cfg, fleet)
        init = base
        if method.stage1:
            init = _stage1(out, base, games["train"][: size.stage1_tasks], size, cfg, fleet)
            facts["stage1"] = _progress(out)["sft"]
        models: dict[str, tuple[Path, bool]] = {"Base (Vanilla)": (base, False)}
        final = base
        if method.trains:
            final = _stage2(out, init, games["train"], cfg, fleet, library)
            if method.stage1:
                models["Stage-1 SFT"] = (init, False)
            if method.eval_plain:
                models[method.label] = (final, False)
        if method.eval_skill_label:
            models[method.eval_skill_label] = (final, True)
        evaluations = _evaluate(out, models, games, size, cfg, fleet, library, base_root)
    finally:
        fleet.close()
    (out / "eval.json").write_text(json.dumps(evaluations, indent=2) + "\n")
    if "wall_minutes" not in _progress(out):  # the run that finished the job, not a rerun
        _mark(out, "wall_minutes", round((time.time() - t0) / 60, 1))
    facts["wall_minutes"] = _progress(out)["wall_minutes"]
    report = write_report(out, evaluations, facts, env)
    print(f"report: {report}")
    return {"evaluations": evaluations, "facts": facts}


def _library(
    root: Path, base: Path, games: list[str], cfg: SeedConfig, fleet: JobFleet
) -> dict[str, Any]:
    """The family skill library written from Stage-1 annotations of the base policy (K0
    rollouts per task, the environment's oracle analyzer) into ``root`` (built once;
    ``root/done`` holds what the report says about it)."""
    from megatron_seed.data import write_jsonl
    from megatron_seed.pipeline import stage1
    from megatron_seed.skills.library import SkillLibrary

    done = root / "done"
    if done.is_file():
        return json.loads(done.read_text())
    records = stage1.collect(base, games, root / "trajectories.jsonl", cfg, fleet=fleet.get())
    annotated, am = stage1.annotate_oracle(records, cfg)
    write_jsonl(annotated, root / "annotated.jsonl")
    library = SkillLibrary.from_annotations(annotated)
    library.save(root)
    facts = {
        "rollouts": len(records),
        "acceptance_rate": am.get("analyze/valid_rate", 0.0),
        "families": sorted(library.families),
        "words": {f: len(t.split()) for f, t in sorted(library.families.items())},
    }
    done.write_text(json.dumps(facts) + "\n")
    return facts


def _base_facts(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the report says about the base policy's build."""
    train = manifest.get("train", {})
    return {
        "games": len(manifest.get("games", {}).get("train", [])),
        "demonstrations": manifest.get("demos"),
        "analysis_examples": train.get("analysis_examples"),
        "bc_nll_last": train.get("nll_last10"),
        "build_seconds": manifest.get("timings_s", {}).get("build"),
    }


def _stage1(
    out: Path, base: Path, games: list[str], size: JobSize, cfg: SeedConfig, fleet: JobFleet
) -> Path:
    """Collect K0 rollouts per task, annotate with the oracle analyzer, SFT -> theta_sft."""
    from megatron_seed.data import write_jsonl
    from megatron_seed.pipeline import stage1

    sft_dir = out / "stage1" / "sft"
    if _progress(out).get("sft"):
        return sft_dir / "hf"
    trajectories = out / "stage1" / "trajectories.jsonl"
    records = stage1.collect(base, games, trajectories, cfg, fleet=fleet.get())
    annotated, am = stage1.annotate_oracle(records, cfg)
    write_jsonl(annotated, out / "stage1" / "annotated.jsonl")
    result = stage1.run_sft(base, annotated, sft_dir, cfg)
    _mark(
        out,
        "sft",
        {
            "rollouts": len(records),
            "rollout_success": round(sum(r.won for r in records) / max(1, len(records)), 3),
            "acceptance_rate": am.get("analyze/valid_rate", 0.0),
            "examples": result["examples"],
            "nll_first": round(result["curve"][0]["nll"], 4),
            "nll_last": round(result["curve"][-1]["nll"], 4),
        },
    )
    return sft_dir / "hf"


def _stage2(
    out: Path,
    init: Path,
    games: list[str],
    cfg: SeedConfig,
    fleet: JobFleet,
    library: Path | None = None,
) -> Path:
    """The method's Stage-2 updates with the fleet and the Megatron trainer -> the final HF
    folder. Fixed skills: the family ``library`` folder, or this job's Stage-1 annotations
    (``static-skills``), or the expert plans (`skills.library.game_skills`)."""
    from megatron_seed.models.parallel import spawn
    from megatron_seed.pipeline.stage2 import Stage2Job, check_job, run_stage2
    from megatron_seed.skills.library import game_skills

    annotated = out / "stage1" / "annotated.jsonl"
    if not _progress(out).get("stage2"):
        source = annotated if cfg.skill.teacher_source == "stage1_library" else library
        job = Stage2Job(
            model_dir=str(init),
            games=games,
            out_dir=str(out / "stage2"),
            cfg=cfg,
            ray_address=_ray_init(),
            fleet_address=fleet.get().address,
            skill_library=game_skills(cfg, get_env(cfg.env.name), games, source),
            replay_data=str(annotated) if cfg.algo.replay_weight else None,
        )
        check_job(job)
        spawn(run_stage2, 1, job)
        _mark(out, "stage2")
    return out / "stage2" / "final_hf"


def _evaluate(
    out: Path,
    models: dict[str, tuple[Path, bool]],
    games: dict[str, list[str]],
    size: JobSize,
    cfg: SeedConfig,
    fleet: JobFleet,
    library: Path | None = None,
    base_root: Path | None = None,
) -> dict[str, Any]:
    """Every model (label -> (folder, with the library's skill)): greedy on seen and unseen,
    sampled on the training games; the skilled rows with each game's family skill in every
    prompt (a family the library lacks plays without). The base's skill-free evaluation is
    cached beside it (``base_root``), keyed by the games, for the jobs that share it."""
    from megatron_seed.pipeline.evaluate import evaluate_policies
    from megatron_seed.skills.library import SkillLibrary

    evaluations = _progress(out).get("evaluate") or {}
    key = _games_key(games, size.train_eval_episodes)
    cache = base_root / f"eval-{key}.json" if base_root else None
    base_label = "Base (Vanilla)"
    if base_label not in evaluations and cache is not None and cache.is_file():
        evaluations[base_label] = json.loads(cache.read_text())
    splits = {"seen": games["seen"], "unseen": games["unseen"], "train": games["train"]}
    sampled = {"train": (cfg.rollout.temperature, size.train_eval_episodes, EVAL_SEED)}
    for skilled in (False, True):
        todo = [n for n, (_, sk) in models.items() if sk == skilled and n not in evaluations]
        if not todo:
            continue
        skills = None
        if skilled:
            assert library is not None  # Method.needs_library
            every = [g for split in splits.values() for g in split]
            env = get_env(cfg.env.name)
            skills = SkillLibrary.load(library).for_games(every, env.family, strict=False)
        results = evaluate_policies(
            [models[n][0] for n in todo],
            splits,
            cfg,
            sampled=sampled,
            fleet=fleet.get(),
            skills=skills,
        )
        evaluations.update(zip(todo, results, strict=True))
        _mark(out, "evaluate", evaluations)
    if cache is not None and not cache.is_file():
        cache.write_text(json.dumps(evaluations[base_label], indent=2) + "\n")
    return {name: evaluations[name] for name in models}


def _games_key(games: dict[str, list[str]], episodes: int) -> str:
    """A short digest of the evaluation's games and sampled episodes per training game (the
    base's cached evaluation is theirs)."""
    import hashlib

    names = {k: [Path(g).name for g in v] for k, v in sorted(games.items())}
    text = json.dumps({**names, "episodes": episodes})
    return hashlib.sha256(text.encode()).hexdigest()[:12]
