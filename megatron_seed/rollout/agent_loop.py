"""The multi-turn agent loop: B tasks x N samples chat with environment workers.

The environment is an `envs.spec.EnvSpec`: its prompt style renders the user messages, its
action parser reads the replies, its task marker tells H where a skill goes. Every live
episode's prompt is built as token ids by `ChatBuilder` (the same code that later builds the
training sequences), all prompts of a turn go to the generation engine in one batch, and
each turn stores the exact sampled ids and their log-probs next to what the environment said
(observation, admissible actions) and what was executed. Finished episodes become
`TrajectoryRecord`s: the trainer scores the very ids the engine produced.

Episodes end when the environment says done (won, or its step budget ran out), when the
prompt outgrows `max_prompt_tokens` (status `truncated`), or when the env or engine fails
for that episode (status `env_error` / `engine_error`; the other episodes go on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from envs.api import EnvSpec, user_message
from megatron_seed.config import RolloutConfig
from megatron_seed.data import Status, TrajectoryRecord, Turn
from megatron_seed.data.sequences import ChatBuilder, insert_skill


class Engine(Protocol):
    """What the loop needs from a generation engine (the vLLM fleet, or one engine).

    An engine with ``accepts_views = True`` (a scripted policy) also gets ``views``: one
    `EpisodeView` per prompt, the environment's facts the prompt was rendered from.
    """

    def generate(self, prompts: list[list[int]], spec: Any) -> list[Any]: ...


@dataclass(frozen=True)
class EpisodeView:
    """What the environment has said so far in one episode (for scripted engines)."""

    task: Task
    goal: str
    observation: str
    admissible: list[str] | None
    step: int  # actions taken so far


@dataclass(frozen=True)
class Task:
    """One task (for ALFWorld, a game) to play `group_size` times.

    skill: a skill H inserts into the task-line prompts (skills in context at rollout);
    meta: environment-specific extras copied into each record's `meta`.
    """

    task_id: str
    game: str
    family: str = ""
    goal: str = ""  # used when the environment's reset info names no task
    skill: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def make_tasks(
    env: EnvSpec, games: list[str], skills: Mapping[str, str] | None = None
) -> list[Task]:
    """One `Task` per task id of environment `env` (id: the last path component); with
    `skills`, each task's `skill` is its game's entry (None where it has none)."""
    skills = skills or {}
    return [Task(Path(g).name, str(g), env.family(str(g)), skill=skills.get(str(g))) for g in games]


@dataclass
class _Live:
    """An episode in flight."""

    task: Task
    group_id: str
    env_id: int
    chat: ChatBuilder | None
    goal: str = ""
    turns: list[Turn] = field(default_factory=list)
    history: list[tuple[str, str]] = field(default_factory=list)  # (observation, action)
    observation: str = ""
    admissible: list[str] | None = None
    pending_user: str = ""  # the user message the next action answers
    invalid: int = 0
    cut_responses: int = 0
    reward: float = 0.0  # the sum of the environment's rewards so far
    won: bool = False
    done: bool = False
    status: Status = Status.OK
    error: str | None = None


@dataclass
class RolloutStats:
    """Counts of one rollout phase (metrics)."""

    episodes: int = 0
    turns: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    invalid_actions: int = 0
    # the turn-synchronous loop's driver waiting on the engines / on the env workers
    engine_wait_s: float = 0.0
    env_wait_s: float = 0.0


@dataclass
class PlayResult:
    """One rollout phase: a record per episode in task order and its counts; an overlapped
    phase also gives the `AnalysisResult` of every analysed record (record order) and its
    timing (`rollout.overlap.OverlapTiming`)."""

    records: list[TrajectoryRecord]
    stats: RolloutStats
    analyses: list[Any] = field(default_factory=list)
    timing: Any = None


def _env_status(result: Any) -> Status | None:
    status = getattr(result.status, "value", result.status)
    return {"error": Status.ENV_ERROR, "truncated": Status.MAX_STEPS}.get(status)


class AgentLoop:
    """Plays episodes of environment `env` with an engine against an `EnvPool`-like pool."""

    def __init__(self, engine: Engine, pool: Any, tokenizer: Any, cfg: RolloutConfig, env: EnvSpec):
        self.engine = engine
        self.pool = pool
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.env = env
        self.prompts = env.prompts(cfg.prompt_style)

    # ------------------------------------------------------------ user messages

    def _user(self, ep: _Live) -> str:
        cfg = self.cfg
        return user_message(
            self.prompts, ep.goal, ep.history, ep.observation, ep.admissible,
            cfg.history_mode, cfg.history_window,
        )  # fmt: skip

    def _prompt_ids(self, ep: _Live) -> list[int]:
        """The ids the engine continues for this episode's next action.

        A task whose ``skill`` is set plays with that skill inserted by H into every prompt
        that holds the task line (the first one; every one in window mode): skills in
        context at rollout (Skill-GRPO, Skill-Prompt*, evaluation with skills).
        """
        system = self.prompts.system_prompt
        if self.cfg.history_mode == "window" or not ep.turns:
            text = self._user(ep)
            if ep.task.skill:
                text = insert_skill(text, ep.task.skill, "task_line", self.env.task_marker)
            ep.chat = ChatBuilder(self.tokenizer, system)
            ep.pending_user = text
            return ep.chat.prompt_ids(text)
        ep.pending_user = self._user(ep)
        assert ep.chat is not None
        return ep.chat.append_user(ep.pending_user)

    # ------------------------------------------------------------ the loop

    def run(
        self,
        tasks: list[Task],
        group_size: int,
        spec: Any,
        update: int = 0,
        on_done: Callable[[int], None] | None = None,
    ) -> PlayResult:
        """Play `group_size` episodes of every task; return one record per episode.
        ``on_done(n)``: called after each turn with the episodes that turn ended (progress)."""
        episodes = self._start(tasks, group_size, update)
        stats = RolloutStats(episodes=len(episodes))
        done = sum(ep.done for ep in episodes)
        while live := [ep for ep in episodes if not ep.done]:
            self._turn(live, spec, stats)
            if on_done is not None:
                now = sum(ep.done for ep in episodes)
                on_done(now - done)
                done = now
        return PlayResult([self._record(ep) for ep in episodes], stats)

    def _start(self, tasks: list[Task], group_size: int, update: int) -> list[_Live]:
        """Reset one environment episode per (task, sample), in task order."""
        games = [t.game for t in tasks for _ in range(group_size)]
        results = self.pool.reset(games)
        episodes: list[_Live] = []
        for i, res in enumerate(results):
            task = tasks[i // group_size]
            ep = _Live(task, f"u{update}/{task.task_id}", res.episode_id, None)
            ep.goal = res.info.get("task", "") or task.goal
            ep.observation = res.observation
            ep.admissible = _admissible(res.info, None)
            if _env_status(res) is Status.ENV_ERROR:
                ep.done, ep.status, ep.error = True, Status.ENV_ERROR, res.error
            episodes.append(ep)
        return episodes

    def _generate(self, asking: list[_Live], prompts: list[list[int]], spec: Any) -> list[Any]:
        if not getattr(self.engine, "accepts_views", False):
            return self.engine.generate(prompts, spec)
        views = [
            EpisodeView(ep.task, ep.goal, ep.observation, ep.admissible, len(ep.turns))
            for ep in asking
        ]
        return self.engine.generate(prompts, spec, views=views)

    def _turn(self, live: list[_Live], spec: Any, stats: RolloutStats) -> None:
        """One generation batch and one env step for every live episode."""
        prompts, asking = [], []
        for ep in live:
            ids = self._ask(ep)
            if ids is not None:
                prompts.append(ids)
                asking.append(ep)
        if not asking:
            return
        t0 = time.perf_counter()
        try:
            generations = self._generate(asking, prompts, spec)
        except Exception as err:  # the engine gave up (after its own restarts)
            for ep in asking:
                ep.done, ep.status, ep.error = True, Status.ENGINE_ERROR, str(err)
            return
        finally:
            stats.engine_wait_s += time.perf_counter() - t0
        actions: dict[int, str] = {}
        for ep, ids, gen in zip(asking, prompts, generations, strict=True):
            action = self._act(ep, ids, gen, stats)
            if action is not None:
                actions[ep.env_id] = action
        stats.turns += len(actions)
        by_id = {ep.env_id: ep for ep in asking}
        t0 = time.perf_counter()
        results = self.pool.step(actions)
        stats.env_wait_s += time.perf_counter() - t0
        for env_id, res in results.items():
            self._observe(by_id[env_id], res)

    # ------------------------------------------------------------ one episode's steps
    # (the turn-synchronous loop above and `rollout.overlap`'s event loop share them)

    def _ask(self, ep: _Live) -> list[int] | None:
        """The prompt ids of the episode's next action, or None (the episode ends,
        `truncated`) when the prompt leaves no room for a reply."""
        ids = self._prompt_ids(ep)
        if len(ids) + 1 > self.cfg.max_prompt_tokens:
            ep.done, ep.status = True, Status.TRUNCATED
            return None
        return ids

    def _act(self, ep: _Live, ids: list[int], gen: Any, stats: RolloutStats) -> str | None:
        """Store the sampled reply as the episode's next turn; return the action to execute
        (None: an empty generation ended the episode)."""
        stats.prompt_tokens += len(ids)
        stats.generated_tokens += len(gen.token_ids)
        if not gen.token_ids:
            ep.done, ep.status, ep.error = True, Status.ENGINE_ERROR, "empty generation"
            return None
        action, valid = self.env.parse_action(gen.text)
        ep.invalid += 0 if valid else 1
        stats.invalid_actions += 0 if valid else 1
        executed = action if action is not None else gen.text
        shown = self.prompts.lists_admissible(len(ep.turns), self.cfg.history_mode)
        ep.turns.append(
            Turn(
                ep.pending_user,
                gen.text,
                list(gen.token_ids),
                list(gen.logprobs),
                observation=ep.observation,
                admissible=ep.admissible if shown else None,
                executed=executed,
                valid=valid,
            )
        )
        assert ep.chat is not None
        ep.chat.append_action(list(gen.token_ids), list(gen.logprobs))
        ep.history.append((ep.observation, action or gen.text.strip()))
        if gen.finish_reason == "length":
            ep.cut_responses += 1  # an unfinished response is just an invalid action
        return executed

    def _observe(self, ep: _Live, res: Any) -> None:
        """Take the environment's answer to the episode's last action."""
        ep.observation = res.observation
        ep.admissible = _admissible(res.info, ep.admissible)
        ep.reward += float(res.reward)
        ep.won = ep.won or res.won
        if res.done:
            ep.done = True
            ep.status = Status.OK if res.won else (_env_status(res) or Status.OK)
            ep.error = res.error
            if ep.status is Status.ENV_ERROR:
                return
        if not ep.done and len(ep.turns) >= self.cfg.max_steps:
            ep.done, ep.status = True, Status.MAX_STEPS

    def _record(self, ep: _Live) -> TrajectoryRecord:
        status = ep.status
        if status.trainable and not ep.turns:
            status = Status.ENV_ERROR if ep.error else Status.TRUNCATED
        return TrajectoryRecord(
            task_id=ep.task.task_id,
            group_id=ep.group_id,
            game=ep.task.game,
            family=ep.task.family,
            turns=ep.turns,
            reward=ep.reward - self.cfg.invalid_action_penalty * ep.invalid,
            won=ep.won,
            status=status,
            env=self.env.name,
            history_mode=self.cfg.history_mode,
            system_prompt=self.prompts.system_prompt,
            task_marker=self.env.task_marker,
            goal=ep.goal,
            final_observation=ep.observation if ep.turns else None,
            invalid_actions=ep.invalid,
            cut_responses=ep.cut_responses,
            error=ep.error,
            meta=dict(ep.task.meta),
        )


def _admissible(info: dict[str, Any], previous: list[str] | None) -> list[str] | None:
    """The admissible actions an env reported (its previous list if this reply has none)."""
    listed = info.get("admissible_actions")
    return list(listed) if listed is not None else previous
