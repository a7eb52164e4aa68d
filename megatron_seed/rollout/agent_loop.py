"""The multi-turn agent loop: B tasks x N samples chat with environment workers.

Every live episode's prompt is built as token ids by `ChatBuilder` (the same code that
later builds the training sequences), all prompts of a turn go to the generation engine in
one batch, and each turn stores the exact sampled ids and their log-probs. Finished
episodes become `TrajectoryRecord`s: the trainer scores the very ids the engine produced.

Episodes end when the environment says done (won, or its step budget ran out), when the
prompt outgrows `max_prompt_tokens` (status `truncated`), or when the env or engine fails
for that episode (status `env_error` / `engine_error`; the other episodes go on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from megatron_seed.config import RolloutConfig
from megatron_seed.data import Status, TrajectoryRecord, Turn
from megatron_seed.data.sequences import ChatBuilder, insert_skill


class Engine(Protocol):
    """What the loop needs from a generation engine (the vLLM fleet, or one engine)."""

    def generate(self, prompts: list[list[int]], spec: Any) -> list[Any]: ...


@dataclass(frozen=True)
class Task:
    """One game to play `group_size` times."""

    task_id: str
    game: str
    family: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


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
    admissible: list[str] = field(default_factory=list)
    pending_user: str = ""  # the user message the next action answers
    invalid: int = 0
    cut_responses: int = 0
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


def _env_status(result: Any) -> Status | None:
    status = getattr(result.status, "value", result.status)
    return {"error": Status.ENV_ERROR, "truncated": Status.MAX_STEPS}.get(status)


class AgentLoop:
    """Plays episodes with an engine against an `envs.workers.EnvPool`-like pool."""

    def __init__(
        self, engine: Engine, pool: Any, tokenizer: Any, cfg: RolloutConfig, prompts: Any = None
    ):
        from envs.alfworld_prompt import prompt_style

        self.engine = engine
        self.pool = pool
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.prompts = prompts or prompt_style(cfg.prompt_style)

    # ------------------------------------------------------------ user messages

    def _first_user(self, ep: _Live) -> str:
        return self.prompts.render_first_observation(ep.goal, ep.observation, ep.admissible)

    def _next_user(self, ep: _Live) -> str:
        step = len(ep.turns)
        if self.cfg.history_mode == "window":
            history = ep.history[-self.cfg.history_window :] if self.cfg.history_window else []
            return self.prompts.render_window_prompt(
                ep.goal, history, ep.observation, step, ep.admissible
            )
        return self.prompts.render_step_observation(step, ep.observation, ep.admissible)

    def _prompt_ids(self, ep: _Live) -> list[int]:
        """The ids the engine continues for this episode's next action.

        A task whose ``meta["skill"]`` is set plays with that skill inserted by H into every
        prompt that holds the task line (the first one; every one in window mode): skills
        in context at rollout, for probes and ablations; Stage 2 never sets it.
        """
        system = self.prompts.SYSTEM_PROMPT
        if self.cfg.history_mode == "window" or not ep.turns:
            text = self._first_user(ep) if not ep.turns else self._next_user(ep)
            if ep.task.meta.get("skill"):
                text = insert_skill(text, ep.task.meta["skill"], "task_line")
            ep.chat = ChatBuilder(self.tokenizer, system)
            ep.pending_user = text
            return ep.chat.prompt_ids(text)
        ep.pending_user = self._next_user(ep)
        assert ep.chat is not None
        return ep.chat.append_user(ep.pending_user)

    # ------------------------------------------------------------ the loop

    def run(
        self, tasks: list[Task], group_size: int, spec: Any, update: int = 0
    ) -> tuple[list[TrajectoryRecord], RolloutStats]:
        """Play `group_size` episodes of every task; return one record per episode."""
        games = [t.game for t in tasks for _ in range(group_size)]
        results = self.pool.reset(games)
        episodes: list[_Live] = []
        for i, res in enumerate(results):
            task = tasks[i // group_size]
            ep = _Live(task, f"u{update}/{task.task_id}", res.episode_id, None)
            ep.goal = res.info.get("task", "") or task.meta.get("goal", "")
            ep.observation = res.observation
            ep.admissible = list(res.info.get("admissible_actions", []))
            if _env_status(res) is Status.ENV_ERROR:
                ep.done, ep.status, ep.error = True, Status.ENV_ERROR, res.error
            episodes.append(ep)
        stats = RolloutStats(episodes=len(episodes))
        while live := [ep for ep in episodes if not ep.done]:
            self._turn(live, spec, stats)
        return [self._record(ep) for ep in episodes], stats

    def _turn(self, live: list[_Live], spec: Any, stats: RolloutStats) -> None:
        """One generation batch and one env step for every live episode."""
        from envs.alfworld_prompt import parse_action

        prompts, asking = [], []
        for ep in live:
            ids = self._prompt_ids(ep)
            if len(ids) + 1 > self.cfg.max_prompt_tokens:
                ep.done, ep.status = True, Status.TRUNCATED
                continue
            prompts.append(ids)
            asking.append(ep)
        if not asking:
            return
        try:
            generations = self.engine.generate(prompts, spec)
        except Exception as err:  # the engine gave up (after its own restarts)
            for ep in asking:
                ep.done, ep.status, ep.error = True, Status.ENGINE_ERROR, str(err)
            return
        actions: dict[int, str] = {}
        for ep, ids, gen in zip(asking, prompts, generations, strict=True):
            stats.prompt_tokens += len(ids)
            stats.generated_tokens += len(gen.token_ids)
            if not gen.token_ids:
                ep.done, ep.status, ep.error = True, Status.ENGINE_ERROR, "empty generation"
                continue
            action, valid = parse_action(gen.text)
            ep.invalid += 0 if valid else 1
            stats.invalid_actions += 0 if valid else 1
            ep.turns.append(
                Turn(ep.pending_user, gen.text, list(gen.token_ids), list(gen.logprobs))
            )
            assert ep.chat is not None
            ep.chat.append_action(list(gen.token_ids), list(gen.logprobs))
            ep.history.append((ep.observation, action or gen.text.strip()))
            if gen.finish_reason == "length":
                ep.cut_responses += 1  # an unfinished response is just an invalid action
            actions[ep.env_id] = action if action is not None else gen.text
        stats.turns += len(actions)
        by_id = {ep.env_id: ep for ep in asking}
        for env_id, res in self.pool.step(actions).items():
            ep = by_id[env_id]
            ep.observation = res.observation
            ep.admissible = list(res.info.get("admissible_actions", ep.admissible))
            ep.won = ep.won or res.won
            if res.done:
                ep.done = True
                ep.status = Status.OK if res.won else (_env_status(res) or Status.OK)
                ep.error = res.error
                if ep.status is Status.ENV_ERROR:
                    continue
            if not ep.done and len(ep.turns) >= self.cfg.max_steps:
                ep.done, ep.status = True, Status.MAX_STEPS

    def _record(self, ep: _Live) -> TrajectoryRecord:
        reward = (1.0 if ep.won else 0.0) - self.cfg.invalid_action_penalty * ep.invalid
        meta = dict(ep.task.meta)
        meta.update(
            goal=ep.goal,
            invalid_actions=ep.invalid,
            cut_responses=ep.cut_responses,
            final_observation=ep.observation,
        )
        if ep.error:
            meta["error"] = ep.error
        status = ep.status
        if status.trainable and not ep.turns:
            status = Status.ENV_ERROR if ep.error else Status.TRUNCATED
        return TrajectoryRecord(
            task_id=ep.task.task_id,
            group_id=ep.group_id,
            game=ep.task.game,
            family=ep.task.family,
            turns=ep.turns,
            reward=reward,
            won=ep.won,
            status=status,
            history_mode=self.cfg.history_mode,
            system_prompt=self.prompts.SYSTEM_PROMPT,
            meta=meta,
        )
