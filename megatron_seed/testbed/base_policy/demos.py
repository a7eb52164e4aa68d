"""The base policy's data: its games, the environment's demonstrations rendered exactly as
the agent loop renders episodes, and analyzer examples with the oracle analyzer's skills."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.api import EnvSpec, user_message
from envs.spec import get_env
from megatron_seed.data import TrajectoryRecord
from megatron_seed.data.sequences import ChatBuilder, TokenSequence, insert_skill
from megatron_seed.testbed.base_policy.settings import BasePolicySettings, Rendering

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


# --------------------------------------------------------------------------- games


def prepare_games(
    shared: Path | None, own: Path, settings: BasePolicySettings, progress: bool = True
) -> tuple[list[Path], list[Path]]:
    """Training (``train``) and held-out (``seen``) games.

    Games already under ``shared`` (e.g. the default job's) are used first; whatever is
    missing is generated under ``own`` (the build's folder, never the shared one, so the job's
    game lists do not change) with the environment's test-bed options (`testbed.profiles`;
    ALFWorld: small rooms, the six families round-robin).
    """
    from megatron_seed.testbed.profiles import profile

    env = get_env(settings.env)
    options = profile(settings.env).generate_options(settings.families)
    wanted = {"train": settings.n_train_games, "seen": settings.n_eval_games}
    found: dict[str, list[Path]] = {}
    for split, n in wanted.items():
        games: list[Path] = []
        if shared is not None and n:
            try:
                games = env.list_tasks(shared, split)[:n]
            except ValueError:  # no such split folder
                games = []
        if len(games) < n:
            more = n - len(games)
            games += _generate(env, own, split, more, settings.seed, options, progress)
        found[split] = games
    return found["train"], found["seen"]


def _generate(
    env: EnvSpec,
    out: Path,
    split: str,
    n: int,
    seed: int,
    options: dict[str, Any],
    progress: bool,
) -> list[Path]:
    if env.generate_tasks is None:
        raise ValueError(f"environment {env.name!r} cannot generate tasks")
    from megatron_seed.progress import LiveBar

    with LiveBar(n, f"base policy: {split} games", enabled=progress) as bar:
        # a seed range of its own: never the same game as a job's own generated ones
        games = env.generate_tasks(out, split, n, 7_000_000 + seed, **options)
        bar.update(n)
    return games


# --------------------------------------------------------------------------- demonstrations


def _expert(env: str) -> Any:
    """The environment's demonstration players (`EnvSpec.demos`)."""
    spec = get_env(env)
    if spec.demos is None:
        raise ValueError(f"environment {env!r} has no demonstration players")
    return spec.demos


def collect_demos(
    games: Sequence[Path], settings: BasePolicySettings, progress: bool = True
) -> list[Any]:
    """Noisy no-hint and clean hinted demonstrations of every game (2 processes).

    Game ``i``'s demonstrations depend only on (settings, i): the result does not depend on
    how the games are split between processes.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    demo = settings.demo_settings()
    jobs = [(settings.env, str(g), i, demo) for i, g in enumerate(games)]
    demos: list[Any] = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as pool:
        results = pool.map(_game_demos, *zip(*jobs, strict=True), chunksize=4)
        for game_demos in tqdm(
            results, total=len(jobs), desc="demonstrations", disable=not progress, leave=False
        ):
            demos += game_demos
    return demos


def _game_demos(env: str, game: str, index: int, settings: dict[str, Any]) -> list[Any]:
    """One game's demonstrations (in a worker process)."""
    expert = _expert(env)
    return expert.game_demos(game, index, expert.DemoSettings(**settings))


def user_messages(demo: Any, how: Rendering, env: EnvSpec) -> list[str]:
    """The user message before each action of a demonstration, exactly as the agent loop
    renders it (window mode: one whole prompt per step), with the hint inserted by H."""
    style = env.prompts(how.prompt_style)
    out = []
    for i, (obs, adm) in enumerate(zip(demo.observations, demo.admissible, strict=True)):
        history = list(zip(demo.observations[:i], demo.actions[:i], strict=True))
        text = user_message(
            style, demo.goal, history, obs, adm, how.history_mode, how.history_window
        )
        if demo.hint is not None and (i == 0 or how.history_mode == "window"):
            text = insert_skill(text, demo.hint, "task_line", env.task_marker)
        out.append(text)
    return out


def action_text(action: str, env: EnvSpec) -> str:
    """The demonstrated reply: the action in the environment's answer format, no reasoning
    (its demonstration players' ``reply_text``; ALFWorld: ``<action>A</action>``)."""
    return _expert(env.name).reply_text(action)


def corpus(demos: Iterable[Any], how: Rendering, env: EnvSpec) -> Iterable[str]:
    """Texts the tokenizer is trained on: every message as the chat holds it."""
    yield env.prompts(how.prompt_style).system_prompt
    for demo in demos:
        yield from user_messages(demo, how, env)
        yield from (action_text(a, env) for a in demo.actions)


def demo_sequences(
    demo: Any, tokenizer: PreTrainedTokenizerFast, how: Rendering, env: EnvSpec
) -> list[TokenSequence]:
    """The token ids of a demonstration as the trainer scores an episode (one chat in full
    mode, one sequence per step in window mode); loss tokens = the action ids + <|im_end|>."""
    system = env.prompts(how.prompt_style).system_prompt
    users = user_messages(demo, how, env)
    window = how.history_mode == "window"
    sequences: list[TokenSequence] = []
    chat = ChatBuilder(tokenizer, system)
    for i, action in enumerate(demo.actions):
        if i == 0 or window:
            chat = ChatBuilder(tokenizer, system)
            chat.prompt_ids(users[i])
        else:
            chat.append_user(users[i])
        ids = tokenizer.encode(action_text(action, env), add_special_tokens=False)
        ids.append(chat.im_end_id)
        chat.append_action(ids, [0.0] * len(ids))
        if window or i == len(demo.actions) - 1:
            sequences.append(chat.sequence())
    return sequences


def demo_record(
    demo: Any, how: Rendering, env: EnvSpec, cut: int | None = None
) -> TrajectoryRecord:
    """A no-hint demonstration as the agent loop records an episode; ``cut`` keeps the first
    ``cut`` actions only (the step budget ran out: a failure). The action ids are a
    placeholder until ``_retokenize``."""
    from megatron_seed.data import Status, Turn

    if demo.hint is not None:
        raise ValueError("analysis examples come from episodes without a hint")
    n = len(demo.actions) if cut is None else cut
    users = user_messages(demo, how, env)
    style = env.prompts(how.prompt_style)
    turns = [
        Turn(
            users[i],
            action_text(demo.actions[i], env),
            [0],
            [0.0],
            observation=demo.observations[i],
            admissible=(
                list(demo.admissible[i])
                if demo.admissible[i] is not None and style.lists_admissible(i, how.history_mode)
                else None
            ),
            executed=demo.actions[i],
        )
        for i in range(n)
    ]
    won = demo.won and n == len(demo.actions)
    final = demo.final_observation if n == len(demo.actions) else demo.observations[n]
    return TrajectoryRecord(
        task_id=Path(demo.game).name,
        group_id="demo",
        game=demo.game,
        family=env.family(demo.game),
        turns=turns,
        reward=float(won),
        won=won,
        status=Status.OK if won else Status.MAX_STEPS,
        env=env.name,
        history_mode=how.history_mode,  # type: ignore[arg-type]
        system_prompt=env.prompts(how.prompt_style).system_prompt,
        task_marker=env.task_marker,
        goal=demo.goal,
        final_observation=final,
    )


def _retokenize(record: TrajectoryRecord, tokenizer: PreTrainedTokenizerFast) -> TrajectoryRecord:
    """The record with its action ids re-encoded by ``tokenizer`` (same texts)."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = []
    for t in record.turns:
        ids = [*tokenizer.encode(t.action, add_special_tokens=False), im_end]
        turns.append(dataclasses.replace(t, action_ids=ids, logprobs=[0.0] * len(ids)))
    return dataclasses.replace(record, turns=turns)


def analysis_records(demos: Sequence[Any], settings: BasePolicySettings) -> list[TrajectoryRecord]:
    """Records of no-hint demonstrations, whole (successes) or cut short (failures), with
    the oracle analyzer's skills: the base policy also learns to write skills, as an
    instruction-tuned LLM can before Stage 1 sharpens it."""
    from megatron_seed.config import SkillConfig
    from megatron_seed.skills.oracle import oracle_analyzer
    from megatron_seed.skills.parse import analyze_with_retries, apply_results

    env = get_env(settings.env)
    analyzer = oracle_analyzer(env)

    rng = random.Random(f"analysis:{settings.seed}")
    by_game: dict[str, list[Any]] = {}
    for demo in demos:
        if demo.hint is None:
            by_game.setdefault(demo.game, []).append(demo)
    records = []
    for i, game_demos in enumerate(by_game.values()):
        for k in range(settings.analysis_per_game):
            demo = game_demos[k % len(game_demos)]
            fail = (i + k) % 2 == 1 and len(demo.actions) > 1
            cut = rng.randrange(1, len(demo.actions)) if fail else None
            records.append(demo_record(demo, settings.rendering, env, cut))
    cfg = SkillConfig(analyzer_layout=settings.analyzer_layout)  # type: ignore[arg-type]
    results = analyze_with_retries(analyzer, records, cfg)
    return [r for r in apply_results(records, results) if r.has_teacher]
