"""`seed eval`: play a policy on an environment's tasks without training; success per family.

    seed eval --env NAME --games DIR [--split S] --policy expert|random|MODEL_DIR
              [--episodes N] [--temperature T] [--seed S] [--max-steps N]
              [--recipe NAME] [--config-json JSON|FILE] [--skill-library PATH] [--out FILE]

Policies:
- ``expert``: the environment's expert plan of each task (`EnvSpec.expert_plan`), sent as
  the reply that demonstrates each action and parsed like a model's reply: an upper bound
  and a check that the tasks are solvable.
- ``random``: the environment's uniformly random policy (its demonstration players'
  ``random_reply``; ALFWorld: a random admissible action), seeded: a lower bound.
- a model folder (HF checkpoint + tokenizer): the rollout fleet and agent loop of training,
  greedy with one episode per task unless ``--temperature`` or ``--episodes`` say otherwise
  (sampled episodes draw from ``--seed``). With ``--skill-library`` (a family library
  folder, or Stage-1 annotations to build one from) every episode plays with its task's
  family skill inserted by H (the paper's starred rows: Skill-Prompt*, Skill-GRPO*); a task
  whose family the library lacks plays without.

Rollout settings (episode budget, prompt style, history, lengths) come from ``--recipe`` /
``--config-json`` as for `seed train`, and ``--max-steps`` on top.

Expert and random episodes play in this process; a model's play on Ray (a local one is
started when none is given by RAY_ADDRESS). The table gives, per family, the episodes, the
success rate and the mean episode reward (the score of environments with shaped rewards),
and the family-balanced average (for search-QA: the dataset-balanced mean). ``--out`` writes
the same as JSON, with every episode's outcome.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.spec import DEFAULT_ENV, ENV_HELP, EnvSpecError, get_env
from megatron_seed.errors import CommandError, output_file
from megatron_seed.files import write_json
from megatron_seed.progress import LiveBar

SCRIPTED = ("expert", "random")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument("--env", default=DEFAULT_ENV, help=ENV_HELP)
    parser.add_argument("--games", required=True, help="task folder (as `seed games` writes)")
    parser.add_argument("--split", default=None, help="one split of the folder (default: all)")
    parser.add_argument(
        "--policy", required=True, help="expert, random, or a model folder (HF checkpoint)"
    )
    parser.add_argument("--episodes", type=int, default=1, help="episodes per task")
    parser.add_argument("--temperature", type=float, default=None, help="model sampling")
    parser.add_argument(
        "--seed", type=int, default=0, help="sampling seed (and the random policy's)"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="episode budget (default: the config's rollout.max_steps: the environment's, "
        "ALFWorld 30, search 4, Sokoban 15, unless the recipe or --config-json set it)",
    )
    parser.add_argument("--recipe", default=None, help="a recipe from megatron_seed/recipes.py")
    parser.add_argument("--config-json", default=None, help="config changes (JSON text or file)")
    parser.add_argument(
        "--skill-library",
        default=None,
        help="a model plays with its family's skill: a library folder or annotations (JSONL)",
    )
    parser.add_argument("--out", default=None, help="write the results as JSON")


@dataclass
class Episode:
    """One played episode's outcome."""

    task: str
    family: str
    won: bool
    reward: float
    steps: int
    invalid: int = 0


def play_scripted(
    spec: Any,
    tasks: list[str],
    choose: Callable[[str, int, str, str, list[str] | None], str],
    episodes: int,
    max_steps: int,
) -> list[Episode]:
    """Play ``episodes`` episodes of each task with ``choose(task, step, goal, observation,
    admissible) -> reply``, each reply parsed by the environment as a model's would be."""
    env = spec.make_env(max_steps)
    out = []
    for task in tasks:
        for _ in range(episodes):
            observation, info = env.reset(task)
            goal = info.get("task", "")
            admissible = info.get("admissible_actions")
            won, reward, steps, invalid, done = False, 0.0, 0, 0, False
            while not done and steps < max_steps:
                reply = choose(task, steps, goal, observation, admissible)
                action, valid = spec.parse_action(reply)
                observation, r, done, info = env.step(action if action is not None else reply)
                admissible = info.get("admissible_actions", admissible)
                reward, steps = reward + float(r), steps + 1
                won, invalid = won or bool(info.get("won")), invalid + (not valid)
            out.append(Episode(str(task), spec.family(str(task)), won, reward, steps, invalid))
    return out


def scripted_policy(spec: Any, name: str, seed: int) -> Callable[..., str]:
    """The ``expert`` or ``random`` policy of ``spec`` as ``choose(task, step, goal, obs,
    admissible) -> reply``."""
    players = spec.demos
    if players is None:
        raise CommandError(f"environment {spec.name!r} has no scripted players (EnvSpec.demos)")
    if name == "random":
        rng = random.Random(seed)
        return lambda task, step, goal, obs, adm: players.random_reply(goal, obs, adm, rng)
    plans: dict[str, list[str]] = {}

    def expert(task: str, step: int, goal: str, obs: str, adm: list[str] | None) -> str:
        if task not in plans:
            plan = spec.expert_plan(task)
            if not plan:
                raise CommandError(f"{task}: the environment has no expert plan for this task")
            plans[task] = plan
        plan = plans[task]
        return players.reply_text(plan[min(step, len(plan) - 1)])

    return expert


def summarize_episodes(episodes: list[Episode], columns: tuple[tuple[str, str], ...]) -> dict:
    """Per family: episodes, success, mean reward; the family-balanced average."""
    per: dict[str, dict[str, float]] = {}
    order = [f for f, _ in columns] + sorted({e.family for e in episodes} - {f for f, _ in columns})
    for fam in order:
        es = [e for e in episodes if e.family == fam]
        if es:
            per[fam] = {
                "episodes": len(es),
                "success": sum(e.won for e in es) / len(es),
                "reward": sum(e.reward for e in es) / len(es),
                "steps": sum(e.steps for e in es) / len(es),
            }
    return {
        "episodes": len(episodes),
        "per_family": per,
        "macro_avg": sum(p["success"] for p in per.values()) / max(1, len(per)),
        "success": sum(e.won for e in episodes) / max(1, len(episodes)),
        "reward": sum(e.reward for e in episodes) / max(1, len(episodes)),
    }


def eval_config(args: argparse.Namespace, env: str) -> Any:
    """The run's config as `seed train` builds it (defaults <- recipe <- --config-json), on
    ``env``, with ``--max-steps`` on top."""
    from megatron_seed.pipeline.commands_train import build_config

    ns = argparse.Namespace(
        recipe=args.recipe, config_json=args.config_json, updates=None, tp=None, pp=None,
        engines=None, env=env, env_workers=None, grpo=False, method=None,
    )  # fmt: skip
    cfg = build_config(ns)
    if args.max_steps is not None:
        try:
            cfg = cfg.with_changes({"rollout": {"max_steps": args.max_steps}})
        except ValueError as err:
            raise CommandError(f"bad --max-steps: {err}") from None
    return cfg


def _check_model(policy: str) -> None:
    """``--policy``, when not a scripted player: a model folder that `validate_base_model`
    accepts (checkpoint, tokenizer, chat template)."""
    from megatron_seed.models.checks import validate_base_model

    if not Path(policy).exists():
        raise CommandError(f"--policy {policy}: not expert, random or a model folder")
    validate_base_model(policy)


def _model_episodes(args: argparse.Namespace, cfg: Any, tasks: list[str]) -> list[Episode]:
    """The model's episodes through the rollout fleet (as training plays them)."""
    from megatron_seed.rollout.engine import SamplingSpec
    from megatron_seed.rollout.session import RolloutSession

    model = Path(args.policy)
    temperature = 0.0 if args.temperature is None else args.temperature
    sampling = SamplingSpec(
        temperature=temperature, max_tokens=cfg.rollout.max_response_tokens, seed=args.seed
    )
    skills = None
    if args.skill_library:
        from megatron_seed.skills.library import library_flag

        library = library_flag(args.skill_library)
        skills = library.for_games(tasks, get_env(cfg.env.name).family, strict=False)
    with RolloutSession(cfg, model) as session:
        session.fleet.reseed(args.seed)
        tasks_ = session.tasks(tasks, skills)
        with LiveBar(len(tasks_) * args.episodes, "episodes") as bar:
            records = session.play(tasks_, args.episodes, sampling, -1, bar.update).records
    return [
        Episode(r.game, r.family, r.won, r.reward, len(r.turns), r.invalid_actions) for r in records
    ]


def table(summary: dict, columns: tuple[tuple[str, str], ...]) -> str:
    """The results as a Markdown table."""
    labels = dict(columns)
    lines = [
        "| family | episodes | success % | reward | steps |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for fam, p in summary["per_family"].items():
        lines.append(
            f"| {labels.get(fam, fam)} | {p['episodes']} | {100 * p['success']:.1f} | "
            f"{p['reward']:.2f} | {p['steps']:.1f} |"
        )
    lines.append(
        f"| **average** (family-balanced) | {summary['episodes']} | "
        f"{100 * summary['macro_avg']:.1f} | {summary['reward']:.2f} | |"
    )
    return "\n".join(lines)


def env_spec(name: str) -> Any:
    """The environment ``name`` (`envs.spec`), or a one-line error."""
    try:
        return get_env(name)
    except EnvSpecError as err:
        raise CommandError(str(err)) from None


def env_tasks(spec: Any, games: str, split: str | None) -> list[str]:
    """The tasks of the folder ``games`` (one ``split``, None: all), or a one-line error."""
    try:
        return [str(t) for t in spec.list_tasks(Path(games), split)]
    except (ValueError, FileNotFoundError) as err:
        raise CommandError(f"--games {games}: {err}") from None


def run(args: argparse.Namespace) -> int:
    """Play the policy, print the table, write ``--out``."""
    if args.episodes < 1:
        raise CommandError(f"--episodes must be at least 1, got {args.episodes}")
    if args.out:
        output_file(args.out)
    spec = env_spec(args.env)
    tasks = env_tasks(spec, args.games, args.split)
    if not tasks:
        raise CommandError(f"no {spec.name} tasks under {args.games}")
    cfg = eval_config(args, spec.name)
    if args.policy in SCRIPTED and args.skill_library:
        raise CommandError("--skill-library is for a model policy, not expert or random")
    if args.policy not in SCRIPTED:  # the model and its skills are checked before any play
        _check_model(args.policy)
        if args.skill_library:
            from megatron_seed.skills.library import library_flag

            library_flag(args.skill_library)
    start = time.perf_counter()
    if args.policy in SCRIPTED:
        choose = scripted_policy(spec, args.policy, args.seed)
        episodes = play_scripted(spec, tasks, choose, args.episodes, cfg.rollout.max_steps)
    else:
        episodes = _model_episodes(args, cfg, tasks)
    seconds = time.perf_counter() - start
    summary = summarize_episodes(episodes, spec.report_columns)
    print(
        f"{args.policy} on {len(tasks)} {spec.name} tasks, {len(episodes)} episodes, {seconds:.1f}s"
    )
    print(table(summary, spec.report_columns))
    if args.out:
        result = {
            "env": spec.name, "games": str(args.games), "split": args.split,
            "policy": args.policy, "seconds": round(seconds, 2), **summary,
            "episodes_played": [vars(e) for e in episodes],
        }  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(args.out), result)
    return 0
