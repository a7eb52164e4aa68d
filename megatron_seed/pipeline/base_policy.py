"""The tiny base policy the default CPU job starts from: built here, cached on disk.

SEED starts from an instruction-tuned LLM that (a) succeeds only sometimes on ALFWorld (the
paper's untrained "Vanilla" row), (b) changes what it does when a skill is placed in its
context and (c) can already write a skill about an episode. No such model exists offline, so
the project builds one: a byte-level BPE tokenizer and a tiny Qwen2 model trained by
behaviour cloning (masked NLL with the project's Megatron trainer, ``SeedTrainer.nll_step``)
on demonstrations played in the real ALFWorld engine.

Choices (all recorded in ``manifest.json``; ``BasePolicySettings`` holds the numbers):

- Games: small rooms (``RoomSize(4, 1)``: four receptacles, one distractor), the six
  families round-robin. With ``games_dir`` (the default job's folder) its ``train`` games are
  used first (the job's Stage-2 training games are among the cloned ones); the rest are
  generated inside the build (2 processes), never in the shared folder.
- Rendering: exactly as the agent loop renders episodes (``Rendering``: the ``compact``
  prompt style, ``full`` history: one chat per episode, one training sequence per episode;
  ``window`` gives one per step); the targets are ``<action>A</action><|im_end|>``.
- Demonstrations per game:
  * noisy, no hint (``noisy_per_game``): a searching player (``play_noisy``): until the
    object is found it visits places in a random order, opening closed ones; afterwards it
    follows the planner (fast-downward ``policy_commands``, replanned from the state
    reached). With probability ``mistake_prob`` per step (at most ``max_mistakes``) the
    action is a random admissible one or the previous action again ("Nothing happens."),
    and the planner recovers. Every demonstration wins; the mistakes are cloned too.
  * hinted (``hinted_per_game``): the planner's plan played exactly, with a skill stating
    that plan inserted by H into every prompt ("Workflow: to heat some egg and put it in
    countertop, go to sinkbasin 1, take egg 1 from sinkbasin 1, ..."). Templates vary.
  * analysis (``analysis_per_game``): a no-hint demonstration, whole (a success) or cut
    short (a failure: the step budget ran out), as the analyzer request of
    ``analyzer_layout`` with the embedded analyzer's JSON answer as the target.
- Why it succeeds only sometimes: without a hint the object's place is unknown until
  visited and the clone samples the searcher's random order and its mistakes; a hint that
  names the place removes the search.
- Model: Qwen2, head_dim 32 (vLLM CPU supports 32/64), vocab = tokenizer length rounded up
  to a multiple of 4; one process, fp32, Adam, warm-up then cosine decay, length-bucketed
  batches; the weights are written back as a HF folder with the tokenizer files.
- Measurement (``measure_base_policy``, optional): the real ``AgentLoop`` with an
  in-process vLLM engine on held-out games, with and without the plan as a skill.

Cache: the build writes into ``<out_dir>.partial`` and renames it to ``out_dir`` at the end,
so ``out_dir`` is complete or absent. A rerun with the same settings returns the cached model
after checking every file recorded in the manifest (size and SHA-256); an ``out_dir`` without
a manifest, with different settings or with a changed file is an error, never reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.alfworld_env import AlfWorldEnv, expert_plan, find_games, game_family
from envs.alfworld_games import RoomSize, generate_games
from envs.alfworld_prompt import prompt_style
from megatron_seed.data import TrajectoryRecord
from megatron_seed.data.sequences import ChatBuilder, TokenSequence, insert_skill

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

MANIFEST = "manifest.json"
MODEL_SUBDIR = "model"
TOKENIZER_SUBDIR = "tokenizer"
FORMAT_VERSION = 2


class BasePolicyCacheError(RuntimeError):
    """A cache folder that cannot be reused (partial, corrupt, or built with other settings)."""


@dataclass(frozen=True)
class BasePolicySettings:
    """Everything that decides the built model (the cache key)."""

    n_train_games: int = 200
    n_eval_games: int = 0  # held-out games for ``measure`` (the default job evaluates itself)
    n_receptacles: int = 4
    n_distractors: int = 1
    families: tuple[str, ...] = ()  # task families of the generated games; () = all six
    prompt_style: str = "compact"
    history_mode: str = "full"
    history_window: int = 2
    analyzer_layout: str = "continuation"  # needs history_mode "full"
    noisy_per_game: int = 2
    hinted_per_game: int = 1
    analysis_per_game: int = 1  # analyzer examples (embedded analyzer's answers)
    search: bool = True  # noisy demos search for the object in a random order
    mistake_prob: float = 0.05
    max_mistakes: int = 1
    max_demo_steps: int = 20
    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 4096
    train_steps: int = 600
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    eval_max_steps: int = 15
    eval_max_prompt_tokens: int = 3072
    seed: int = 0

    @classmethod
    def for_run(cls, quick: bool, seed: int) -> BasePolicySettings:
        """The full default, or the ``--quick`` variant (about a minute)."""
        if not quick:
            return cls(seed=seed)
        # the job's own few training games cloned many times over (with ``games_dir``): it
        # plays those sometimes and nothing else (too little compute to learn to copy names)
        return cls(
            n_train_games=6,
            families=("pick",),
            noisy_per_game=8,
            hinted_per_game=2,
            analysis_per_game=8,  # 2 gave 0-8 % valid skills in Stage 2; 8 gives the format
            train_steps=200,
            seed=seed,
        )

    @property
    def rendering(self) -> Rendering:
        """How the demonstrations' user messages are rendered."""
        return Rendering(self.prompt_style, self.history_mode, self.history_window)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def check(self) -> None:
        """Fail loud on settings the engines cannot run."""
        if self.hidden_size % self.num_heads or self.head_dim not in (32, 64):
            raise ValueError(f"head_dim must be 32 or 64 for vLLM CPU, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.n_train_games < 1 or self.n_eval_games < 0 or self.train_steps < 1:
            raise ValueError("need at least one training game and one training step")


@dataclass(frozen=True)
class Rendering:
    """How the agent loop renders user messages (``RolloutConfig``'s fields of that name)."""

    prompt_style: str = "compact"
    history_mode: str = "full"
    history_window: int = 2


@dataclass
class Demo:
    """One demonstrated episode: what the environment said before each action, the actions,
    and the hint (a skill inserted by H) the episode follows, if any."""

    game: str
    goal: str
    observations: list[str]  # the environment's text before each action
    admissible: list[list[str]]  # the admissible actions before each action
    actions: list[str]
    hint: str | None = None
    mistakes: int = 0
    won: bool = False
    final_observation: str = ""  # the environment's answer to the last action

    def observe(self, observation: str, info: dict[str, Any]) -> None:
        """Record what the environment says before the next action."""
        self.observations.append(observation)
        self.admissible.append(list(info["admissible_actions"]))

    def user_messages(self, how: Rendering) -> list[str]:
        """The user message before each action, exactly as the agent loop renders it
        (window mode: one whole prompt per step), with the hint inserted by H."""
        style = prompt_style(how.prompt_style)
        out = []
        for i, (obs, adm) in enumerate(zip(self.observations, self.admissible, strict=True)):
            if i == 0:
                text = style.render_first_observation(self.goal, obs, adm)
            elif how.history_mode == "window":
                pairs = list(zip(self.observations[:i], self.actions[:i], strict=True))
                history = pairs[-how.history_window :] if how.history_window else []
                text = style.render_window_prompt(self.goal, history, obs, i, adm)
            else:
                text = style.render_step_observation(i, obs, adm)
            if self.hint is not None and (i == 0 or how.history_mode == "window"):
                text = insert_skill(text, self.hint, "task_line")
            out.append(text)
        return out


# --------------------------------------------------------------------------- games


def prepare_games(
    shared: Path | None, own: Path, settings: BasePolicySettings, progress: bool = True
) -> tuple[list[Path], list[Path]]:
    """Training (``train``) and held-out (``seen``) games.

    Games already under ``shared`` (e.g. the default job's) are used first; whatever is
    missing is generated under ``own`` (the build's folder, never the shared one, so the job's
    game lists do not change): small rooms, the six families round-robin.
    """
    room = RoomSize(settings.n_receptacles, settings.n_distractors)
    wanted = {"train": settings.n_train_games, "seen": settings.n_eval_games}
    found: dict[str, list[Path]] = {}
    for split, n in wanted.items():
        games: list[Path] = []
        if shared is not None and n:
            try:
                games = find_games(shared, split)[:n]
            except ValueError:  # no such split folder
                games = []
        if len(games) < n:
            more = n - len(games)
            games += _generate(own, split, more, settings.seed, room, settings.families, progress)
        found[split] = games
    return found["train"], found["seen"]


def _generate(
    out: Path,
    split: str,
    n: int,
    seed: int,
    room: RoomSize,
    families: tuple[str, ...],
    progress: bool,
) -> list[Path]:
    if progress:
        print(f"base policy: generating {n} {split} games (2 processes)")
    # a seed range of its own: never the same game as a job's own generated ones
    return generate_games(
        out, split, n, 7_000_000 + seed, room, list(families) or None, handcoded=False, workers=2
    )


# --------------------------------------------------------------------------- demonstrations


class _LoadOnce:
    """Delegates to a TextWorld env but skips ``load`` of the game already loaded.

    ``reset`` rebuilds the PDDL state from the loaded game data, so replaying one game many
    times needs one load (~0.2 s saved per episode in a small room).
    """

    def __init__(self, env: Any) -> None:
        self._inner = env
        self._loaded: str | None = None

    def load(self, path: str) -> None:
        if path != self._loaded:
            self._loaded = None
            self._inner.load(path)
            self._loaded = path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class PlanningEnv(AlfWorldEnv):
    """``AlfWorldEnv`` that also reports the planner's plan from the current state.

    Same engine, wrappers and texts as the agent's env; ``info["expert_plan"]`` is
    fast-downward's plan from the state reached (``policy_commands``), as alfworld's
    ``AlfredExpert(expert_type="planner")`` computes it (a few ms in small rooms).
    """

    def __init__(self, max_steps: int = 30) -> None:
        super().__init__(max_steps=max_steps)
        self._env.request_infos.policy_commands = True
        self._env = _LoadOnce(self._env)

    def _info(self, state: Any, truncated: bool) -> dict[str, Any]:
        info = super()._info(state, truncated)
        info["expert_plan"] = list(state.get("policy_commands") or [])
        return info


def play_clean(env: PlanningEnv, game: Path) -> Demo:
    """The planner's plan played exactly (no hint set yet)."""
    observation, info = env.reset(game)
    plan = list(info["expert_plan"]) or expert_plan(game, "planner")
    demo = Demo(str(game), info["task"], [], [], [])
    demo.observe(observation, info)
    for action in plan:
        observation, _, done, info = env.step(action)
        demo.actions.append(action)
        demo.final_observation = observation
        if done:
            break
        demo.observe(observation, info)
    demo.won = bool(info["won"])
    if not demo.won:
        raise RuntimeError(f"the planner's plan does not win {game}")
    return demo


def _search_step(
    plan: Sequence[str], observation: str, places: list[str], visited: set[str], rng: random.Random
) -> str | None:
    """The searcher's action before the object is found, or None to follow the plan.

    The planner knows where the object lies; a player does not. Until the planner's next
    move is to take something, a closed place just reached is opened to look inside, and
    each "go to" is to the planner's destination with probability 1/(unvisited places), else
    to a random other unvisited place: the object's place is found after a uniformly random
    number of visits, as a player searching without memory of this room would.
    """
    if not plan or plan[0].startswith("take "):
        return None
    closed = re.search(r"The (.+?) is closed\.", observation)
    if closed and not plan[0].startswith("open "):
        return f"open {closed.group(1)}"
    if not plan[0].startswith("go to "):
        return None
    target = plan[0].removeprefix("go to ")
    others = [p for p in places if p not in visited and p != target]
    if others and rng.random() >= 1 / (len(others) + 1):
        return f"go to {rng.choice(others)}"
    return None


def play_noisy(
    env: PlanningEnv,
    clean: Demo,
    rng: random.Random,
    mistake_prob: float,
    max_mistakes: int,
    max_steps: int,
    search: bool = True,
) -> Demo | None:
    """A searching player with random mistakes, replanning from the state reached.

    ``search``: the object is searched for (``_search_step``) until the first "take". At each
    step, with probability ``mistake_prob`` (at most ``max_mistakes`` times, and only while
    the step budget leaves room to recover), the action is a random admissible action other
    than the intended one; the planner then replans from the state the mistake leaves.
    None if the episode does not win within ``max_steps``.
    """
    observation, info = env.reset(clean.game)
    demo = Demo(clean.game, clean.goal, [], [], [])
    demo.observe(observation, info)
    places = [
        a.removeprefix("go to ") for a in info["admissible_actions"] if a.startswith("go to ")
    ]
    visited: set[str] = set()
    searching = search
    for step in range(max_steps):
        plan = info["expert_plan"]
        if not plan:
            return None
        action = plan[0]
        if searching:
            action = _search_step(plan, observation, places, visited, rng) or action
            searching = not action.startswith("take ")
        others = [a for a in info["admissible_actions"] if a != action]
        room = max_steps - step > len(plan) + 2
        if others and room and demo.mistakes < max_mistakes and rng.random() < mistake_prob:
            # half the mistakes repeat the last action (mostly "Nothing happens."), so the
            # clone also learns to move on after an action the environment rejected
            repeat = demo.actions and rng.random() < 0.5
            action = demo.actions[-1] if repeat else rng.choice(others)
            demo.mistakes += 1
        if action.startswith("go to "):
            visited.add(action.removeprefix("go to "))
        observation, _, done, info = env.step(action)
        demo.actions.append(action)
        demo.final_observation = observation
        if done:
            demo.won = bool(info["won"])
            return demo if demo.won else None
        demo.observe(observation, info)
    return None


_HINT_TEMPLATES = (
    "Workflow: to {goal}, {steps}.",
    "Workflow: {steps}.",
    "Workflow: to {goal}, {steps}. Follow these steps in order and do not wander.",
    "Avoid guessing where the {obj} is. Fix: {steps}.",
)


def join_steps(steps: Sequence[str]) -> str:
    """``a, b, then c`` (the embedded analyzer's workflow phrasing)."""
    if len(steps) == 1:
        return steps[0]
    return ", ".join(steps[:-1]) + ", then " + steps[-1]


def plan_hint(goal: str, plan: Sequence[str], template: int = 0) -> str:
    """A skill that states the plan: the hint the hinted demonstrations follow."""
    take = next((a for a in plan if a.startswith("take ")), "take the object from")
    obj = take.split(" from ")[0].removeprefix("take ").rstrip("0123456789 ") or "object"
    return _HINT_TEMPLATES[template % len(_HINT_TEMPLATES)].format(
        goal=goal.rstrip("."), steps=join_steps(plan), obj=obj
    )


def collect_demos(
    games: Sequence[Path], settings: BasePolicySettings, progress: bool = True
) -> list[Demo]:
    """Noisy no-hint and clean hinted demonstrations of every game (2 processes).

    Game ``i``'s demonstrations depend only on (settings, i): the result does not depend on
    how the games are split between processes.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    jobs = [(str(g), i, dataclasses.asdict(settings)) for i, g in enumerate(games)]
    demos: list[Demo] = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as pool:
        results = pool.map(_game_demos, *zip(*jobs, strict=True), chunksize=4)
        for game_demos in tqdm(
            results, total=len(jobs), desc="demonstrations", disable=not progress, leave=False
        ):
            demos += game_demos
    return demos


_ENV: PlanningEnv | None = None


def _game_demos(game: str, index: int, settings_dict: dict[str, Any]) -> list[Demo]:
    """The demonstrations of one game (runs in a worker process with its own env)."""
    global _ENV
    settings = BasePolicySettings(**settings_dict)
    if _ENV is None:
        _ENV = PlanningEnv(max_steps=settings.max_demo_steps + 1)
    rng = random.Random(f"demos:{settings.seed}:{index}")
    clean = play_clean(_ENV, Path(game))
    demos: list[Demo] = []
    for _ in range(settings.noisy_per_game):
        for _attempt in range(5):
            demo = play_noisy(
                _ENV,
                clean,
                rng,
                settings.mistake_prob,
                settings.max_mistakes,
                settings.max_demo_steps,
                settings.search,
            )
            if demo is not None:
                demos.append(demo)
                break
    for h in range(settings.hinted_per_game):
        hint = plan_hint(clean.goal, clean.actions, template=index + h)
        demos.append(dataclasses.replace(clean, hint=hint))
    return demos


def action_text(action: str) -> str:
    """The demonstrated reply: the action in the answer format, no reasoning."""
    return f"<action>{action}</action>"


def corpus(demos: Iterable[Demo], how: Rendering) -> Iterable[str]:
    """Texts the tokenizer is trained on: every message as the chat holds it."""
    yield prompt_style(how.prompt_style).SYSTEM_PROMPT
    for demo in demos:
        yield from demo.user_messages(how)
        yield from (action_text(a) for a in demo.actions)


def demo_sequences(
    demo: Demo, tokenizer: PreTrainedTokenizerFast, how: Rendering
) -> list[TokenSequence]:
    """The token ids of a demonstration as the trainer scores an episode (one chat in full
    mode, one sequence per step in window mode); loss tokens = the action ids + <|im_end|>."""
    system = prompt_style(how.prompt_style).SYSTEM_PROMPT
    users = demo.user_messages(how)
    window = how.history_mode == "window"
    sequences: list[TokenSequence] = []
    chat = ChatBuilder(tokenizer, system)
    for i, action in enumerate(demo.actions):
        if i == 0 or window:
            chat = ChatBuilder(tokenizer, system)
            chat.prompt_ids(users[i])
        else:
            chat.append_user(users[i])
        ids = tokenizer.encode(action_text(action), add_special_tokens=False)
        ids.append(chat.im_end_id)
        chat.append_action(ids, [0.0] * len(ids))
        if window or i == len(demo.actions) - 1:
            sequences.append(chat.sequence())
    return sequences


def demo_record(demo: Demo, how: Rendering, cut: int | None = None) -> TrajectoryRecord:
    """A no-hint demonstration as the agent loop records an episode; ``cut`` keeps the first
    ``cut`` actions only (the step budget ran out: a failure). The action ids are a
    placeholder until ``_retokenize``."""
    from megatron_seed.data import Status, Turn

    if demo.hint is not None:
        raise ValueError("analysis examples come from episodes without a hint")
    n = len(demo.actions) if cut is None else cut
    users = demo.user_messages(how)
    turns = [
        Turn(user, action_text(action), [0], [0.0])
        for user, action in zip(users[:n], demo.actions[:n], strict=True)
    ]
    won = demo.won and n == len(demo.actions)
    final = demo.final_observation if n == len(demo.actions) else demo.observations[n]
    return TrajectoryRecord(
        task_id=Path(demo.game).name,
        group_id="demo",
        game=demo.game,
        family=game_family(demo.game),
        turns=turns,
        reward=float(won),
        won=won,
        status=Status.OK if won else Status.MAX_STEPS,
        history_mode=how.history_mode,  # type: ignore[arg-type]
        system_prompt=prompt_style(how.prompt_style).SYSTEM_PROMPT,
        meta={"goal": demo.goal, "final_observation": final},
    )


def _retokenize(record: TrajectoryRecord, tokenizer: PreTrainedTokenizerFast) -> TrajectoryRecord:
    """The record with its action ids re-encoded by ``tokenizer`` (same texts)."""
    from megatron_seed.data import Turn

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = []
    for t in record.turns:
        ids = [*tokenizer.encode(t.action, add_special_tokens=False), im_end]
        turns.append(Turn(t.observation, t.action, ids, [0.0] * len(ids)))
    return dataclasses.replace(record, turns=turns)


def analysis_records(demos: Sequence[Demo], settings: BasePolicySettings) -> list[TrajectoryRecord]:
    """Records of no-hint demonstrations, whole (successes) or cut short (failures), with
    the embedded analyzer's skills: the base policy also learns to write skills, as an
    instruction-tuned LLM can before Stage 1 sharpens it."""
    from megatron_seed.config import SkillConfig
    from megatron_seed.skills.embedded import EmbeddedAnalyzer
    from megatron_seed.skills.parse import analyze_with_retries, apply_results

    rng = random.Random(f"analysis:{settings.seed}")
    by_game: dict[str, list[Demo]] = {}
    for demo in demos:
        if demo.hint is None:
            by_game.setdefault(demo.game, []).append(demo)
    records = []
    for i, game_demos in enumerate(by_game.values()):
        for k in range(settings.analysis_per_game):
            demo = game_demos[k % len(game_demos)]
            fail = (i + k) % 2 == 1 and len(demo.actions) > 1
            cut = rng.randrange(1, len(demo.actions)) if fail else None
            records.append(demo_record(demo, settings.rendering, cut))
    cfg = SkillConfig(analyzer_layout=settings.analyzer_layout)  # type: ignore[arg-type]
    results = analyze_with_retries(EmbeddedAnalyzer(), records, cfg)
    return [r for r in apply_results(records, results) if r.skill_valid]


# --------------------------------------------------------------------------- training


def model_overrides(settings: BasePolicySettings, vocab: int) -> dict[str, Any]:
    """Qwen2 config of the base policy; vocab rounded up to a multiple of 4."""
    return dict(
        vocab_size=-(-vocab // 4) * 4,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_kv_heads,
        max_position_embeddings=settings.max_position_embeddings,
    )


def lr_at(step: int, settings: BasePolicySettings) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    span = max(1, settings.train_steps - settings.warmup_steps)
    progress = min(1.0, (step - settings.warmup_steps) / span)
    floor = settings.min_lr_ratio
    return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def length_batches(
    lengths: Sequence[int], batch_size: int, steps: int, rng: random.Random
) -> list[list[int]]:
    """``steps`` batches of indices; each epoch is shuffled, then sorted by length within
    windows of 8 batches so that rows of a batch pad little."""
    batches: list[list[int]] = []
    window = batch_size * 8
    while len(batches) < steps:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        epoch = []
        for start in range(0, len(order), window):
            chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
            epoch += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
        rng.shuffle(epoch)
        batches += epoch
    return batches[:steps]


def _train_worker(
    init_dir: str, data_path: str, settings: dict[str, Any], out_dir: str, progress: bool
) -> dict[str, Any]:
    """Spawned (one process, fp32): behaviour cloning with ``SeedTrainer.nll_step``, then
    the weights written as a HF folder next to the tokenizer files."""
    import pickle

    import torch
    from tqdm import tqdm

    from megatron_seed.config import OptimConfig, ParallelConfig, SeedConfig
    from megatron_seed.data import collate
    from megatron_seed.models.convert import export_hf_weights, save_hf_checkpoint
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.trainer import SeedTrainer

    s = BasePolicySettings(**settings)
    with open(data_path, "rb") as f:
        data = pickle.load(f)
    sequences: list[TokenSequence] = data["sequences"]
    init_parallel(1, 1, seed=s.seed + 1)
    torch.manual_seed(s.seed)
    optim = OptimConfig(lr=s.lr, clip_grad=1.0, micro_batch_size=s.batch_size)
    cfg = SeedConfig(parallel=ParallelConfig(precision="fp32"), optim=optim)
    trainer = SeedTrainer(cfg, init_dir)
    rng = random.Random(f"batches:{s.seed}")
    plan = length_batches([len(q) for q in sequences], s.batch_size, s.train_steps, rng)
    losses: list[float] = []
    start = time.perf_counter()
    bar = tqdm(plan, desc="behaviour cloning", disable=not progress, leave=False)
    for step, rows in enumerate(bar):
        trainer.set_lr(lr_at(step, s))
        metrics = trainer.nll_step(collate([sequences[i] for i in rows], data["pad_id"]))
        losses.append(metrics["nll"])
        bar.set_postfix(nll=f"{metrics['nll']:.3f}")
    seconds = time.perf_counter() - start
    hf_config = json.loads((Path(init_dir) / "config.json").read_text())
    weights = export_hf_weights(trainer.model.module, trainer.spec, dtype=torch.float32)
    save_hf_checkpoint(weights, out_dir, hf_config, tokenizer_from=data["tokenizer_dir"])
    tail = losses[-10:]
    return {
        "train_seconds": round(seconds, 1),
        "nll_first": round(losses[0], 4),
        "nll_last10": round(sum(tail) / len(tail), 4),
        "nll_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 20)]],
    }


def _check_model_tokenizer(model_dir: Path, tokenizer: Any, probe: str) -> None:
    """Fail loud unless the model folder loads a tokenizer (as transformers and vLLM do:
    a qwen2 folder gets Qwen2Tokenizer) that encodes like the one the policy was trained with."""
    from transformers import AutoConfig, AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(model_dir)
    if loaded.encode(probe, add_special_tokens=False) != tokenizer.encode(
        probe, add_special_tokens=False
    ):
        raise RuntimeError(f"{model_dir} loads a tokenizer that encodes differently")
    if len(loaded) > AutoConfig.from_pretrained(model_dir).vocab_size:
        raise RuntimeError(f"{model_dir}: tokenizer larger than the model's vocabulary")


def train_policy(
    demos: Sequence[Demo],
    settings: BasePolicySettings,
    work: Path,
    progress: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Tokenizer + random tiny Qwen2 + behaviour cloning; returns (HF model dir, stats)."""
    import pickle

    from megatron_seed.data.tokenizer import build_tokenizer
    from megatron_seed.models.parallel import spawn
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.pipeline.stage1 import answer_text, sft_sequence
    from megatron_seed.skills.prompt import analyzer_messages

    tok_dir = work / TOKENIZER_SUBDIR
    texts = list(corpus(demos, settings.rendering))
    analyzed = analysis_records(demos, settings)
    layout = settings.analyzer_layout
    for r in analyzed:
        texts += [m["content"] for m in analyzer_messages(r, layout)]  # type: ignore[arg-type]
        texts.append(answer_text((r.meta.get("analysis") or {}).get("summary"), r.skill or ""))
    tokenizer = build_tokenizer(texts, settings.vocab_size, tok_dir)
    analyzed = [_retokenize(r, tokenizer) for r in analyzed]
    sequences = [q for d in demos for q in demo_sequences(d, tokenizer, settings.rendering)]
    sequences += [sft_sequence(tokenizer, r, layout) for r in analyzed]
    init_dir = make_tiny_qwen(
        work / "init", seed=settings.seed, **model_overrides(settings, len(tokenizer))
    )
    data_path = work / "demos.pkl"
    with open(data_path, "wb") as f:
        payload = {"sequences": sequences, "pad_id": tokenizer.pad_token_id}
        pickle.dump({**payload, "tokenizer_dir": str(tok_dir)}, f)
    model_dir = work / MODEL_SUBDIR
    (stats,) = spawn(
        _train_worker,
        1,
        str(init_dir),
        str(data_path),
        dataclasses.asdict(settings),
        str(model_dir),
        progress,
    )
    _check_model_tokenizer(model_dir, tokenizer, demos[0].user_messages(settings.rendering)[0])
    lengths = [len(q) for q in sequences]
    stats.update(
        analysis_examples=len(analyzed),
        tokenizer_len=len(tokenizer),
        sequences=len(sequences),
        tokens_per_sequence_mean=round(sum(lengths) / len(lengths), 1),
        tokens_per_sequence_max=max(lengths),
    )
    shutil.rmtree(init_dir)
    data_path.unlink()
    return model_dir, stats


# --------------------------------------------------------------------------- measurement


def eval_hints(games: Sequence[str]) -> dict[str, str]:
    """Game -> the correct plan as a hint (template 0)."""
    env = AlfWorldEnv()
    hints: dict[str, str] = {}
    for game in games:
        _, info = env.reset(game)
        hints[game] = plan_hint(info["task"], expert_plan(game, "planner"))
    return hints


def _measure_worker(
    model_dir: str, games: list[str], settings: dict[str, Any], conditions: list[list[Any]]
) -> dict[str, Any]:
    """Spawned: in-process vLLM + the real agent loop on in-process envs; success rates."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from envs.base import BatchedEnv
    from megatron_seed.config import RolloutConfig
    from megatron_seed.rollout.agent_loop import AgentLoop, Task
    from megatron_seed.rollout.engine import SamplingSpec, VLLMEngine

    s = BasePolicySettings(**settings)
    start = time.perf_counter()
    engine = VLLMEngine(model_dir, seed=s.seed, max_model_len=s.max_position_embeddings)
    hints = eval_hints(games)
    cfg = RolloutConfig(
        max_steps=s.eval_max_steps,
        max_prompt_tokens=s.eval_max_prompt_tokens,
        max_response_tokens=48,
        history_mode=s.history_mode,  # type: ignore[arg-type]
        history_window=s.history_window,
        prompt_style=s.prompt_style,  # type: ignore[arg-type]
    )
    pool = BatchedEnv(lambda: AlfWorldEnv(max_steps=s.eval_max_steps))
    results: dict[str, Any] = {}
    for hinted, temperature, group in conditions:
        tasks = [
            Task(f"eval{i}", g, game_family(g), {"skill": hints[g]} if hinted else {})
            for i, g in enumerate(games)
        ]
        loop = AgentLoop(engine, pool, engine.tokenizer, cfg)
        spec = SamplingSpec(temperature=temperature, max_tokens=48, seed=s.seed)
        records, stats = loop.run(tasks, group, spec)
        name = f"{'hint' if hinted else 'no_hint'}_t{temperature:g}"
        results[name] = {
            "success": round(sum(r.won for r in records) / len(records), 4),
            "episodes": len(records),
            "mean_turns": round(stats.turns / len(records), 2),
            "invalid_actions": stats.invalid_actions,
        }
    results["seconds"] = round(time.perf_counter() - start, 1)
    return results


def measure_base_policy(
    model_dir: str | Path,
    games: Sequence[str | Path],
    settings: BasePolicySettings,
    conditions: Sequence[tuple[bool, float, int]] = ((False, 0.0, 1), (True, 0.0, 1)),
) -> dict[str, Any]:
    """Success rate of the policy on ``games`` per (hinted, temperature, episodes per game),
    in a fresh process (in-process vLLM pins the threads of its process)."""
    from megatron_seed.models.parallel import spawn

    (result,) = spawn(
        _measure_worker,
        1,
        str(model_dir),
        [str(g) for g in games],
        dataclasses.asdict(settings),
        [list(c) for c in conditions],
    )
    return result


# --------------------------------------------------------------------------- build + cache


def cache_key(settings: BasePolicySettings, games_dir: Path | None) -> dict[str, Any]:
    """What a cached build must match to be reused (as JSON holds it: tuples are lists)."""
    key = {
        "format_version": FORMAT_VERSION,
        "settings": dataclasses.asdict(settings),
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
        other = [k for k in ("format_version", "games_dir") if old.get(k) != key[k]]
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
    quick: bool = False,
    seed: int = 0,
    games_dir: str | Path | None = None,
    progress: bool = True,
    measure: bool = True,
    settings: BasePolicySettings | None = None,
) -> Path:
    """Build (or reuse) the tiny base policy; returns its HF model folder.

    ``games_dir``: training (``train``) and held-out (``seen``) games to use first; missing
    ones are generated inside the build. ``measure``: also play the held-out
    games with vLLM, without and with the plan as a hint (``manifest.json`` -> ``measured``).
    ``settings``: explicit settings (tests, experiments) instead of ``quick`` and ``seed``.
    """
    settings = settings or BasePolicySettings.for_run(quick, seed)
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
