"""One (method, seed) job on a base model and its tasks: the family skill library, Stage 1,
Stage 2, evaluation and the run report, each phase resumable (OUT/progress.json records a
finished phase; Stage 2 resumes from its own checkpoints).

`seed compare` runs one per (method, seed); the test bed's default job (`seed run`) is one of
them on the tiny world. Methods are `megatron_seed.methods`' rows: a method that reads a family
skill library gets one written from Stage-1 annotations of the base policy (or the user's
folder); a method that trains nothing is the base evaluated as it is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from envs.spec import get_env
from megatron_seed.compare.report import BASE_LABEL, write_report
from megatron_seed.config import SeedConfig, differences
from megatron_seed.errors import CommandError
from megatron_seed.files import write_json
from megatron_seed.methods import METHODS, Method
from megatron_seed.startup import use_own_ray_token

EVAL_SEED = 1234  # sampled evaluation draws: the same for every model of a run


def method_of(algo: str) -> Method:
    """The method named `algo`; a clear error for an unknown name."""
    if algo not in METHODS:
        raise ValueError(f"unknown algorithm {algo!r}; choose one of {sorted(METHODS)}")
    return METHODS[algo]


def apply_method(cfg: SeedConfig, algo: str) -> SeedConfig:
    """``cfg`` with the method ``algo``'s changes (a method that trains nothing: unchanged)."""
    method = method_of(algo)
    if method.trains:
        cfg = method.config(cfg)
    if cfg.algo.advantage_reweight == "rlsd":
        # RLSD's lambda falls to 0 over the first 2/3 of the run, as the reference stack's
        # 100 of 150 updates (its default 100 would barely move in a short job)
        decay = max(1, round(cfg.updates * 2 / 3))
        cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, rlsd_decay_updates=decay))
    return cfg


class Phases:
    """``[phase k/n] name (t s)`` lines: where a long job is, out of how much."""

    def __init__(self, names: list[str], started: float | None = None) -> None:
        self.names, self.done = names, 0
        self.started = time.time() if started is None else started

    def start(self, name: str) -> None:
        """Announce phase ``name`` (one of ``names``, in order)."""
        self.done = self.names.index(name, self.done) + 1
        took = time.time() - self.started
        print(f"[phase {self.done}/{len(self.names)}] {name} ({took:.0f} s in)", flush=True)


def method_phases(method: Method, user_library: bool = False) -> list[str]:
    """The phases `run_method_job` runs for ``method``."""
    names = ["skill library"] if method.needs_library and not user_library else []
    names += ["stage 1"] if method.stage1 else []
    names += ["stage 2"] if method.trains else []
    return [*names, "evaluation", "report"]


def run_method_job(
    out: Path,
    base: Path,
    games: dict[str, list[str]],
    cfg: SeedConfig,
    algo: str,
    *,
    stage1_tasks: int,
    train_eval_episodes: int,
    heldout_episodes: int = 0,
    facts: dict[str, Any],
    base_root: Path | None = None,
    library_dir: str | Path | None = None,
    user_library: str | Path | None = None,
    title: str | None = None,
    phases: Phases | None = None,
    curve_every: int = 0,
    own_base: bool = False,
) -> dict[str, Any]:
    """Run (or resume) method ``algo`` from the ``base`` HF folder on ``games`` (train, seen,
    unseen task paths) with ``cfg`` (`apply_method`'s); returns the evaluations and facts of
    the report (OUT/report.md, OUT/eval.json).

    ``stage1_tasks``: training tasks of Stage 1 and of the library's annotations;
    ``train_eval_episodes``: sampled evaluation episodes per training task;
    ``heldout_episodes``: sampled episodes per seen and unseen task (0: one greedy);
    ``base_root``: where the base's evaluation is cached for the jobs that share it;
    ``library_dir``: where the family skill library is built (default OUT/library),
    ``user_library``: a library folder to use instead;
    ``title``: the environment's name in the report (default its registry name);
    ``phases``: the job's phase lines, whose start is the job's (default: this method's
    phases, starting now); ``curve_every``: Stage 2 evaluates its policy on the training
    games every that many updates with the final evaluation's draws (0: never);
    ``own_base``: ``base`` is the user's model (`--model`), not one the job built: the job
    folder records it and refuses another (the base's cached evaluation is kept per job
    folder's base)."""
    method = method_of(algo)
    phases = phases or Phases(method_phases(method, bool(user_library)))
    out.mkdir(parents=True, exist_ok=True)
    check_same_config(out, cfg, base if own_base else None)
    fleet = JobFleet(base, cfg)
    try:
        library = None
        if method.needs_library:
            library = Path(user_library) if user_library else Path(library_dir or out / "library")
            if not user_library:
                phases.start("skill library")
                stage1_games = games["train"][:stage1_tasks]
                facts["library"] = build_library(library, base, stage1_games, cfg, fleet)
        init = base
        if method.stage1:
            phases.start("stage 1")
            init = run_stage1(out, base, games["train"][:stage1_tasks], cfg, fleet)
            facts["stage1"] = _progress(out)["sft"]
        models: dict[str, tuple[Path, bool]] = {BASE_LABEL: (base, False)}
        final = base
        if method.trains:
            phases.start("stage 2")
            curve = (curve_every, train_eval_episodes)
            final = run_stage2_job(out, init, games["train"], cfg, fleet, library, curve)
            if method.stage1:
                models["Stage-1 SFT"] = (init, False)
            if method.eval_plain:
                models[method.label] = (final, False)
        if method.eval_skill_label:
            models[method.eval_skill_label] = (final, True)
        phases.start("evaluation")
        evaluations = evaluate_models(
            out, models, games, train_eval_episodes, cfg, fleet, library, base_root,
            heldout_episodes, model=base if own_base else None,
        )  # fmt: skip
    finally:
        fleet.close()
    write_json(out / "eval.json", evaluations)
    if "wall_minutes" not in _progress(out):  # the run that finished the job, not a rerun
        _mark(out, "wall_minutes", round((time.time() - phases.started) / 60, 1))
    facts["wall_minutes"] = _progress(out)["wall_minutes"]
    phases.start("report")
    report = write_report(out, evaluations, facts, cfg.env.name, title)
    print(f"report: {report}")
    return {"evaluations": evaluations, "facts": facts}


JOB_CONFIG = "job_config.json"  # the config a job folder was started with


def check_same_config(out: Path, cfg: SeedConfig, model: str | Path | None = None) -> None:
    """Record ``cfg`` (and ``model``, a pretrained base from outside the job's folders) in a
    new job folder; in a folder that holds a job of another config (another method, `--set`,
    size) or model, a one-line `CommandError` naming what differs, before anything resumes:
    its finished phases would be reported under the new config."""
    path = out / JOB_CONFIG
    mine = json.loads(json.dumps(cfg.to_dict()))  # tuples as lists, as read back
    if model is not None:
        mine["base_model"] = str(Path(model).resolve())
    if not path.is_file():
        write_json(path, mine)
        return
    theirs = json.loads(path.read_text())
    if theirs != mine:
        differ = sorted(differences(theirs, mine))
        raise CommandError(
            f"{out} holds a job of another config ({', '.join(differ[:4])}"
            f"{', ...' if len(differ) > 4 else ''} differ): choose another --out"
        )


def _progress(out: Path) -> dict[str, Any]:
    path = out / "progress.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _mark(out: Path, phase: str, value: Any = True) -> None:
    state = _progress(out)
    state[phase] = value
    write_json(out / "progress.json", state)


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
            from megatron_seed.progress import LiveBar
            from megatron_seed.rollout.session import start_fleet

            n = self.cfg.fleet.engines
            with LiveBar(1, f"fleet: starting {n} vLLM engine{'s' if n > 1 else ''}") as bar:
                ray_init()
                self._fleet = start_fleet(self.cfg, self.model_dir)
                bar.update()
        return self._fleet

    def close(self) -> None:
        """Stop the engines (if they were started)."""
        if self._fleet is not None:
            self._fleet.close()
            self._fleet = None


def ray_init() -> str:
    """Start Ray on this machine (once) and return its address."""
    import ray

    if not ray.is_initialized():
        use_own_ray_token()  # its token: not in the home folder
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            _temp_dir=tempfile.mkdtemp(prefix="seed-ray-"),
        )
    return ray.get_runtime_context().gcs_address


def build_library(
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
    write_json(done, facts, indent=None)
    return facts


def run_stage1(out: Path, base: Path, games: list[str], cfg: SeedConfig, fleet: JobFleet) -> Path:
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


def run_stage2_job(
    out: Path,
    init: Path,
    games: list[str],
    cfg: SeedConfig,
    fleet: JobFleet,
    library: Path | None = None,
    curve: tuple[int, int] = (0, 0),
) -> Path:
    """The method's Stage-2 updates with the fleet and the Megatron trainer -> the final HF
    folder. Fixed skills: the family ``library`` folder, or this job's Stage-1 annotations
    (``static-skills``), or the expert plans (`skills.library.game_skills`). ``curve``:
    (every, episodes): evaluate on the training games every that many updates, that many
    sampled episodes per game, with the final evaluation's draws."""
    from megatron_seed.models.parallel import spawn
    from megatron_seed.pipeline.job import check_resume
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
            ray_address=ray_init(),
            fleet_address=fleet.get().address,
            skill_library=game_skills(cfg, get_env(cfg.env.name), games, source),
            replay_data=str(annotated) if cfg.algo.replay_weight else None,
            eval_games=games if curve[0] else [],
            eval_every=curve[0],
            eval_episodes=curve[1] if curve[0] else 0,
            eval_seed=EVAL_SEED,
        )
        check_job(job)
        check_resume(job)
        spawn(run_stage2, 1, job)
        _mark(out, "stage2")
    return out / "stage2" / "final_hf"


def evaluate_models(
    out: Path,
    models: dict[str, tuple[Path, bool]],
    games: dict[str, list[str]],
    train_episodes: int,
    cfg: SeedConfig,
    fleet: JobFleet,
    library: Path | None = None,
    base_root: Path | None = None,
    heldout_episodes: int = 0,
    model: str | Path | None = None,
) -> dict[str, Any]:
    """Every model (label -> (folder, with the library's skill)): sampled at the rollout
    temperature on the training games (``train_episodes`` per game) and, with
    ``heldout_episodes``, on seen and unseen (that many per game; 0: greedy, one per game);
    the skilled rows with each game's family skill in every prompt (a family the library
    lacks plays without). The base's skill-free evaluation is cached beside it
    (``base_root``), keyed by the games and episodes (and ``model``, a user's pretrained
    base), for the jobs that share it."""
    from megatron_seed.pipeline.evaluate import evaluate_policies
    from megatron_seed.skills.library import SkillLibrary

    evaluations = _progress(out).get("evaluate") or {}
    key = _games_key(games, train_episodes, heldout_episodes, cfg, model)
    cache = base_root / f"eval-{key}.json" if base_root else None
    base_label = BASE_LABEL
    if base_label not in evaluations and cache is not None and cache.is_file():
        evaluations[base_label] = json.loads(cache.read_text())
    splits = {"seen": games["seen"], "unseen": games["unseen"], "train": games["train"]}
    sampled = evaluation_draws(cfg.rollout.temperature, train_episodes, heldout_episodes)
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
        write_json(cache, evaluations[base_label])
    return {name: evaluations[name] for name in models}


def evaluation_draws(
    temperature: float, train_episodes: int, heldout_episodes: int = 0
) -> dict[str, tuple[float, int, int]]:
    """`evaluate_policies`' ``sampled``: split -> (temperature, episodes per game, seed) for
    the splits played sampled; a split it lacks (held-out without ``heldout_episodes``) is
    played greedily, one episode per game."""
    if train_episodes < 1 or heldout_episodes < 0:
        raise ValueError(
            f"need train_episodes >= 1 and heldout_episodes >= 0, got {train_episodes} "
            f"and {heldout_episodes}"
        )
    draws = {"train": (temperature, train_episodes, EVAL_SEED)}
    if heldout_episodes:
        draws |= {s: (temperature, heldout_episodes, EVAL_SEED) for s in ("seen", "unseen")}
    return draws


def _games_key(
    games: dict[str, list[str]],
    episodes: int,
    heldout: int = 0,
    cfg: SeedConfig | None = None,
    model: str | Path | None = None,
) -> str:
    """A short digest of the evaluation's games and sampled episodes per training and per
    held-out game, and of how episodes are played (``cfg``'s rollout and environment
    sections: `--set rollout.temperature=...` is another evaluation). Without ``cfg``, or
    greedy held-out games, the key is what it was before those entered it, so earlier caches
    still match; ``model`` (a pretrained base's folder) enters it too."""
    import hashlib

    names = {k: [Path(g).name for g in v] for k, v in sorted(games.items())}
    key = {**names, "episodes": episodes} | ({"heldout": heldout} if heldout else {})
    if cfg is not None:
        key["play"] = {"rollout": cfg.to_dict()["rollout"], "env": cfg.to_dict()["env"]}
    if model is not None:
        key["model"] = str(Path(model).resolve())
    text = json.dumps(key)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
