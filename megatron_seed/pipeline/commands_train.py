"""`seed train`: Stage 2 of SEED (Algorithm 1) with the vLLM fleet and the Megatron trainer.

    seed train --model DIR --games DIR --out DIR [--recipe NAME] [--config-json JSON|FILE]
               [--env NAME] [--updates N] [--tp T --pp P --dp D] [--engines E]
               [--env-workers W] [--grpo] [--method NAME] [--skill-library PATH]
               [--replay-data annotated.jsonl]

`--method` applies one of the paper's methods (`megatron_seed.methods`: grpo, skill-grpo,
opsd, opsd-paper, grpo-opsd, skill-sd, rlsd, sdar, seed, seed-replay, no-sft, no-opd,
static-skills) on top of the recipe; a method with fixed skills reads them from
`--skill-library` (a folder of general.md + FAMILY.md, or for static-skills Stage-1
annotations) or, for opsd-paper, from the environment's expert plans. `--replay-data` gives
analyzer replay (seed-replay, or algo.replay_weight > 0) its Stage-1 annotations.

Config: the environment's rollout budgets <- recipe <- method <- --config-json <- flags
(`build_config`); every value is range-checked before anything starts (a bad one is a
one-line error, exit code 2).

Paths may also come from SEED_MODEL_DIR / SEED_GAMES_DIR / SEED_OUT_DIR (launched jobs).
Under torchrun every rank runs the loop itself; otherwise this command spawns T x P x D
trainer processes. Re-running the same command resumes from OUT/checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from envs.spec import ENV_HELP, EnvSpecError, get_env
from megatron_seed.errors import CommandError, output_dir, positive
from megatron_seed.methods import METHODS, get_method


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument(
        "--model", default=os.environ.get("SEED_MODEL_DIR"), help="HF checkpoint + tokenizer"
    )
    parser.add_argument(
        "--games", default=os.environ.get("SEED_GAMES_DIR"), help="game folder (train split)"
    )
    parser.add_argument("--eval-games", default=None, help="game folder for periodic evaluation")
    parser.add_argument(
        "--eval-every", type=int, default=0, help="evaluate every N updates (0: never)"
    )
    parser.add_argument(
        "--out",
        default=os.environ.get("SEED_OUT_DIR", "runs/train"),
        help="run folder (or $SEED_OUT_DIR)",
    )
    parser.add_argument("--recipe", default=None, help="a recipe from megatron_seed/recipes.py")
    parser.add_argument("--config-json", default=None, help="config changes (JSON text or file)")
    parser.add_argument(
        "--updates", type=int, default=None, help="Stage-2 updates (default: the config's)"
    )
    parser.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel size (default: the config's)"
    )
    parser.add_argument(
        "--pp", type=int, default=None, help="pipeline-parallel size (default: the config's)"
    )
    parser.add_argument("--dp", type=positive, default=1, help="data-parallel size")
    parser.add_argument("--env", default=None, help=ENV_HELP + " (default: the config's)")
    parser.add_argument("--engines", type=int, default=None, help="vLLM engines (fleet.engines)")
    parser.add_argument("--env-workers", type=int, default=None, help="env worker processes")
    parser.add_argument("--grpo", action="store_true", help="plain GRPO (no analyzer, no OPD)")
    parser.add_argument(
        "--method",
        default=None,
        choices=[m for m, v in METHODS.items() if v.trains],
        help="one of the paper's methods (megatron_seed/methods.py), applied on the recipe",
    )
    parser.add_argument(
        "--skill-library",
        default=None,
        help="fixed skills: a folder of general.md + FAMILY.md, or Stage-1 annotations (JSONL)",
    )
    parser.add_argument(
        "--replay-data", default=None, help="Stage-1 annotations (JSONL) for analyzer replay"
    )


def build_config(args: argparse.Namespace):
    """Environment budgets <- recipe <- method <- --config-json <- flags (the environment
    is the one these name, `envs.spec.DEFAULT_ENV` when none does)."""
    from megatron_seed import recipes
    from megatron_seed.config import SeedConfig

    cfg = SeedConfig()
    if args.recipe:
        try:
            cfg = recipes.get(args.recipe).config
        except KeyError as err:
            raise CommandError(str(err).strip("'\"")) from None
    if args.method:
        cfg = get_method(args.method).config(cfg)
    changes = []
    if args.config_json:
        literal = args.config_json.lstrip().startswith("{")
        label = "bad --config-json" + ("" if literal else f" {args.config_json}")
        changes.append((label, _config_json(args.config_json)))
    flags = {
        "updates": args.updates,
        "parallel": {"tp": args.tp, "pp": args.pp},
        "fleet": {"engines": args.engines},
        "env": {"name": args.env, "workers": args.env_workers},
        "algo": {"use_opd": False if args.grpo else None},
    }
    changes.append(("bad flag value", _given(flags)))
    try:
        env = get_env(_changed(cfg, changes).env.name)
    except EnvSpecError as err:
        raise CommandError(str(err)) from None
    cfg = _changed(recipes.on_env(cfg, env.rollout), changes)
    if args.method and (undone := _undone(cfg, args.method)):
        raise CommandError(
            f"--config-json or --grpo sets {', '.join(undone)}, which --method {args.method} "
            "decides: drop one of them"
        )
    return cfg


def _config_json(value: str) -> dict:
    """``--config-json``'s changes: JSON text (an object, ``{...}``) or a file holding it."""
    text = value
    if not value.lstrip().startswith("{"):
        path = Path(value)
        if not path.is_file():
            raise CommandError(f"--config-json {value}: no such file (nor a JSON object)")
        text = path.read_text()
    where = "" if text is value else f" {value}"
    try:
        changes = json.loads(text)
    except ValueError as err:
        raise CommandError(f"bad --config-json{where}: {err}") from None
    if not isinstance(changes, dict):
        raise CommandError(
            f"bad --config-json{where}: an object expected, got {type(changes).__name__}"
        )
    return changes


def _undone(cfg, method: str) -> list[str]:
    """The fields of ``cfg`` that differ from what ``method`` sets (a saved config of another
    method, or ``--grpo`` on a method with a teacher, overrode them after it)."""
    from megatron_seed.config import differences

    again = get_method(method).config(cfg)
    return sorted(differences(cfg.to_dict(), again.to_dict()))


def _changed(cfg, changes: list[tuple[str, dict]]):
    """``cfg`` with each (error prefix, changes) applied in order."""
    for what, change in changes:
        try:
            cfg = cfg.with_changes(change)
        except (ValueError, TypeError) as err:
            raise CommandError(f"{what}: {err}") from None
    return cfg


def _given(changes: dict) -> dict:
    """The flags that were given (None: not given), nested like the config."""
    out = {}
    for key, value in changes.items():
        if isinstance(value, dict):
            value = _given(value)
            if value:
                out[key] = value
        elif value is not None:
            out[key] = value
    return out


def build_job(args: argparse.Namespace):
    """Validate paths and assemble the Stage2Job (fail loud before any compute)."""
    from megatron_seed.models.checks import validate_policy_dir
    from megatron_seed.pipeline.stage2 import Stage2Job

    if not args.model:
        raise CommandError("--model DIR is required (or set SEED_MODEL_DIR)")
    if not args.games:
        raise CommandError("--games DIR is required (or set SEED_GAMES_DIR)")
    if args.eval_every < 0:
        raise CommandError(f"--eval-every must be at least 0, got {args.eval_every}")
    cfg = build_config(args)
    import torch

    from megatron_seed.models.parallel import DeviceError, resolve_device
    from megatron_seed.train.trainer import DIST_OPT_ON_CPU

    try:
        resolve_device(cfg.parallel.device)
    except DeviceError as err:
        raise CommandError(str(err)) from None

    if cfg.parallel.distributed_optimizer and not torch.cuda.is_available():
        raise CommandError(DIST_OPT_ON_CPU)
    validate_policy_dir(args.model, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.ep)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # torchrun's world sets DP there
    if not launched and args.dp % cfg.parallel.ep:
        raise CommandError(f"parallel.ep={cfg.parallel.ep} must divide the data-parallel size "
                           f"(--dp {args.dp}): the experts are split over DP ranks")  # fmt: skip
    try:
        env = get_env(cfg.env.name)
        games = [str(g) for g in env.list_tasks(args.games, None)]
        eval_games = (
            [str(g) for g in env.list_tasks(args.eval_games, None)] if args.eval_games else []
        )
    except (EnvSpecError, ValueError) as err:
        raise CommandError(str(err)) from None
    if not games:
        raise CommandError(f"no games under {args.games} (no {env.name} tasks found)")
    from megatron_seed.pipeline.job import check_resume
    from megatron_seed.pipeline.stage2 import check_job
    from megatron_seed.skills.library import game_skills

    if args.replay_data:
        _check_records(Path(args.replay_data), "--replay-data")
    try:
        job = Stage2Job(
            model_dir=str(args.model),
            games=games,
            out_dir=str(output_dir(args.out)),
            cfg=cfg,
            eval_games=eval_games,
            eval_every=args.eval_every,
            skill_library=game_skills(cfg, env, games, args.skill_library),
            replay_data=args.replay_data,
        )
        check_job(job)
        check_resume(job)
    except ValueError as err:
        raise CommandError(str(err)) from None
    return job


def _check_records(path: Path, flag: str) -> None:
    """Every line of ``path`` is a trajectory record of this schema (read before any work)."""
    from megatron_seed.data import read_jsonl

    if not path.is_file():
        raise CommandError(f"{flag} {path} is not a file")
    for _ in read_jsonl(path):  # a line that is no record: one line naming it
        pass


def run(args: argparse.Namespace) -> int:
    """Run (or resume) Stage 2."""
    from megatron_seed.models.parallel import spawn
    from megatron_seed.pipeline.roles import PREEMPTED
    from megatron_seed.pipeline.stage2 import run_stage2

    job = build_job(args)
    world = job.cfg.parallel.tp * job.cfg.parallel.pp * args.dp
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        run_stage2(job)  # launched by torchrun: this process is one rank
    else:
        spawn(run_stage2, world, job)
    note = Path(job.out_dir) / PREEMPTED
    if note.is_file():  # SIGTERM: stopped at an update boundary with a checkpoint
        step = json.loads(note.read_text())["step"]
        print(f"preempted after update {step}: rerun the same command to resume")
        return PREEMPTED_EXIT
    print(f"done: metrics in {Path(job.out_dir) / 'metrics.jsonl'}")
    return 0


PREEMPTED_EXIT = 143  # 128 + SIGTERM: the job stopped on request and can be requeued
