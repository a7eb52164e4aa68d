"""Episodes that advance on their own, and skills decoded as each episode ends
(`rollout.overlap`).

The turn-synchronous loop (`AgentLoop.run`) sends every live episode's prompt in one batch,
waits for the slowest reply, then steps every environment while the engines idle; the
analysis (`rollout.analyzer`) starts only after the last episode has ended. Here one driver
feeds each engine's running batch through vLLM's continuous batching (`VLLMEngine.advance`:
add requests, step until one, or a given set, has finished):

- an episode's next prompt goes to its engine as soon as its environment step returns;
- the actions one `advance` returned go to the env workers together (one call per worker);
- a finished episode's analyzer request (and the retry of an unparseable reply) goes to
  the episode's own engine (in the `continuation` layout its prompt starts with the
  episode's chat, which that engine's prefix cache holds). The episodes are the update's
  critical path; an analysis is not needed before the last episode ends, so it fills the
  capacity the episodes leave.

How the engines are driven (`rollout.overlap_pacing`):

- **free** (engines with their own accelerators): an engine returns replies as they finish
  (`LINGER_S` after the first) and takes new requests at once; a task's samples share an
  engine (their first prompt is the same: one prefill), and an episode moves to another
  engine when its own holds `MOVE_AT` more requests than the least loaded one (groups end
  at different times). Analyses wait in a backlog until an engine plays at most
  `ANALYZE_BELOW` episode turns (or every episode has ended), then decode whenever their
  engine steps.
- **paced** (engines on the CPU cores the environments use): engine w mod E serves the
  episodes of env worker w, and each call runs its episodes' turn to the end of the batch, so
  every (engine, worker) pair alternates between one batched decode and one batched env
  step, as the synchronous loop does, while the pairs no longer wait for each other. An
  engine whose episodes are stepping their environments does not step at all: its
  analyses wait in the batch, with their KV cache, and decode in the steps of the next
  turn (nearly free: a decode step's cost barely grows with the batch on CPU); once its
  episodes have all ended, it decodes the rest alone. Measured on 2 cores: free
  continuous batching doubles the engines' decode steps (and CPU) for the same tokens
  (docs/benchmarks.md).

What stays exact: every turn stores the very ids the engine sampled and their log-probs
(`AgentLoop._act`, shared with the synchronous loop), and each analysis request is built
from its own episode's record and folded into that record only. What changes is the order
in which requests meet the engines: on CPU, where vLLM samples without per-request seeds,
the random draws follow that order, so an overlapped rollout is a different (equally
on-policy) sample than the synchronous one at the same seed.

`FleetStream` holds what each engine was sent and not yet answered, so a dead or hung
engine is restarted (`Fleet.restart`) and its requests resubmitted; when it may not be
restarted, its episodes end with status `engine_error` and its analyses with a transport
error, as in the synchronous path.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from megatron_seed.config import SkillConfig
from megatron_seed.data import TrajectoryRecord
from megatron_seed.data.records import Status
from megatron_seed.rollout.agent_loop import AgentLoop, PlayResult, RolloutStats, Task
from megatron_seed.rollout.analyzer import selected

# free pacing: an episode leaves an engine that holds this many more requests than another
MOVE_AT = 4
ANALYZE_BELOW = 2  # free pacing: analyses go to an engine playing at most this many turns
# free pacing (and analyses alone): an engine's `advance` returns this long after its first
# request finished (or when none is left): replies that finish close together come back in
# one round trip
LINGER_S = 0.02


@dataclass
class _Request:
    key: Any
    ids: list[int]
    spec: Any
    offset: int


class FleetStream:
    """Requests to a fleet's engines, each sent to a chosen engine as soon as it is ready,
    results as each request finishes (one `advance` call in flight per engine)."""

    def __init__(
        self, fleet: Any, timeout_s: float | None = None, linger_s: float = LINGER_S
    ) -> None:
        self.fleet = fleet
        self.linger_s = linger_s
        self.num_engines = int(fleet.num_engines)
        self.timeout_s = float(timeout_s or getattr(fleet, "request_timeout_s", 600.0))
        self._queued: list[list[_Request]] = [[] for _ in range(self.num_engines)]
        self._sent: list[dict[Any, _Request]] = [{} for _ in range(self.num_engines)]
        self._calls: dict[Any, tuple[int, float]] = {}  # ref -> (engine, sent at)

    def submit(self, engine: int, key: Any, ids: list[int], spec: Any, offset: int) -> None:
        """Queue one request for `engine` (sent at the next `pump`)."""
        self._queued[engine].append(_Request(key, ids, spec, offset))

    def pump(self, hold: Collection[int] = (), drain: str | None = None) -> None:
        """Call `advance` on every engine that has work, no call in flight and is not in
        `hold`. With `drain` (a key kind), each call runs until every request of that kind
        its engine holds has finished (its batch run to the end, like a synchronous turn)."""
        busy = {e for e, _ in self._calls.values()}
        for e in range(self.num_engines):
            if e in busy or e in hold or not (self._queued[e] or self._sent[e]):
                continue
            new, self._queued[e] = self._queued[e], []
            requests = [(r.key, r.ids, r.spec, r.offset) for r in new]
            until = None
            if drain is not None:
                keys = [*self._sent[e], *(r.key for r in new)]
                until = [k for k in keys if k[0] == drain]
            ref = self.fleet.advance(e, requests, self.linger_s, until)
            self._sent[e].update({r.key: r for r in new})
            self._calls[ref] = (e, time.monotonic())

    def load(self, kind: str | None = None) -> list[int]:
        """Requests queued or in flight per engine (only those whose key starts with
        `kind`, when given)."""
        return [
            sum(kind is None or r.key[0] == kind for r in (*q, *s.values()))
            for q, s in zip(self._queued, self._sent, strict=True)
        ]

    def refs(self) -> list[Any]:
        """The object refs of the calls in flight."""
        return list(self._calls)

    def owns(self, ref: Any) -> bool:
        """Whether `ref` is one of this stream's calls."""
        return ref in self._calls

    @property
    def idle(self) -> bool:
        """Nothing queued, sent or in flight."""
        return not self._calls and not any(self._queued) and not any(self._sent)

    def collect(self, ref: Any) -> tuple[list[tuple[Any, Any]], list[tuple[Any, str]]]:
        """(finished (key, Generation) pairs, failed (key, error) pairs) of a ready call."""
        import ray

        engine, _ = self._calls.pop(ref)
        try:
            done = ray.get(ref)
        except Exception as exc:  # the actor died, or its engine raised
            return [], self._recover(engine, f"{type(exc).__name__}: {str(exc)[:300]}")
        for key, _ in done:
            self._sent[engine].pop(key, None)
        return done, []

    def expire(self) -> list[tuple[Any, str]]:
        """Restart the engines whose call outlived the timeout; the failed requests of
        those that may not be restarted."""
        now, failed = time.monotonic(), []
        for ref, (engine, sent) in list(self._calls.items()):
            if now - sent > self.timeout_s:
                del self._calls[ref]
                failed += self._recover(engine, f"no answer within {self.timeout_s:g} s")
        return failed

    def _recover(self, engine: int, reason: str) -> list[tuple[Any, str]]:
        from megatron_seed.rollout.fleet import FleetError

        lost = [*self._sent[engine].values(), *self._queued[engine]]
        self._sent[engine], self._queued[engine] = {}, []
        try:
            self.fleet.restart(engine, reason)
        except FleetError as err:
            return [(r.key, str(err)) for r in lost]
        self._queued[engine] = lost  # resubmitted, in order, at the next pump
        return []


@dataclass
class AnalysisPlan:
    """How the episodes that end are analysed while the others play.

    tokenizer: builds the analyzer prompts (`data.requests.request_ids`);
    cfg: the analysis settings; `cfg.select` picks the records to analyse
        (`rollout.analyzer.selected`): "all", each trainable one as soon as its episode
        ends; another rule, among a task's group once all of it has ended;
    max_prompt_tokens: the longest analyzer prompt the engines' context allows.
    """

    tokenizer: Any
    cfg: SkillConfig
    max_prompt_tokens: int | None = None


@dataclass
class OverlapTiming:
    """Where the driver's time went (seconds; the phase's metrics)."""

    episodes_s: float = 0.0  # start -> the last episode ended
    analysis_tail_s: float = 0.0  # the last episode ended -> the last analysis returned
    wait: dict[str, float] = field(
        default_factory=lambda: {"engines": 0.0, "envs": 0.0, "both": 0.0}
    )

    def metrics(self) -> dict[str, float]:
        """As `overlap/...` metrics."""
        out = {
            "overlap/episodes_s": self.episodes_s,
            "overlap/analysis_tail_s": self.analysis_tail_s,
        }
        out.update({f"overlap/wait_{k}_s": v for k, v in self.wait.items()})
        return out


def play_overlapped(
    loop: AgentLoop,
    stream: FleetStream,
    tasks: list[Task],
    group_size: int,
    spec: Any,
    update: int = 0,
    analysis: AnalysisPlan | None = None,
) -> PlayResult:
    """Play `group_size` episodes of every task with episodes advancing independently and
    (with `analysis`) every trainable episode analysed once it ended (with a `select`
    rule: the chosen ones, once their group ended), as engines have room.

    The result: one record per episode in task order, the rollout counts, the
    `AnalysisResult` of every analysed record in record order, the timing. The records' `skill`/`analysis` are not
    set here: `rollout.analyzer.apply_analysis` does it, as for the synchronous path.
    """
    return _Overlap(loop, stream, spec, analysis).run(tasks, group_size, update)


class _Overlap:
    """The event loop of `play_overlapped` (one per call)."""

    def __init__(
        self, loop: AgentLoop, stream: FleetStream, spec: Any, analysis: AnalysisPlan | None
    ) -> None:
        import ray

        from megatron_seed.rollout.engine import SamplingSpec
        from megatron_seed.skills.parse import ValidationRules

        self._ray = ray
        self.loop, self.stream, self.spec, self.analysis = loop, stream, spec, analysis
        self.stats = RolloutStats()
        self.timing = OverlapTiming()
        self.pending_env: dict[Any, Any] = {}  # ref -> PendingStep
        self.prompts: dict[int, list[int]] = {}  # episode -> the prompt in flight
        self.asked: dict[int, tuple[Any, int]] = {}  # episode -> (analysis request, prompt len)
        self.results: dict[int, Any] = {}  # episode -> AnalysisResult
        pacing = loop.cfg.overlap_pacing
        self.paced = pacing == "paced" or (
            pacing == "auto" and not getattr(stream.fleet, "on_gpu", False)
        )
        if analysis is not None:
            self.rules = ValidationRules.from_config(analysis.cfg)
            self.analysis_spec = SamplingSpec(
                temperature=analysis.cfg.temperature, max_tokens=analysis.cfg.max_tokens
            )

    # ------------------------------------------------------------ the loop

    def run(self, tasks: list[Task], group_size: int, update: int) -> PlayResult:
        start = time.perf_counter()
        self.episodes = self.loop._start(tasks, group_size, update)
        n = len(self.episodes)
        self.stats.episodes = n
        self.group_size = group_size
        self.records: list[TrajectoryRecord | None] = [None] * n
        self.by_env = {ep.env_id: i for i, ep in enumerate(self.episodes)}
        self.engine_of = self._placement(group_size)
        self.backlog: list[tuple[int, Any, list[int]]] = []  # analyses waiting for room
        self.live = n  # episodes not ended yet
        self.last_end = start
        for i, ep in enumerate(self.episodes):
            if ep.done:
                self._end(i)
            else:
                self._ask(i)
        while not self.stream.idle or self.pending_env or self.backlog:
            self._feed()
            if self.paced:
                self.stream.pump(self._held(), drain="act")
                if not self.stream.refs() and not self.pending_env:
                    self.stream.pump()  # nothing else would move: hold nothing
            else:
                self.stream.pump()
            self._wait_one()
        done = time.perf_counter()
        self.timing.episodes_s = self.last_end - start
        self.timing.analysis_tail_s = max(0.0, done - self.last_end) if self.results else 0.0
        self.stats.engine_wait_s = self.timing.wait["engines"]
        self.stats.env_wait_s = self.timing.wait["envs"]
        records = [r for r in self.records if r is not None]
        assert len(records) == n, "an episode ended without a record"
        analysed = [self.results[i] for i in sorted(self.results)]
        return PlayResult(records, self.stats, analysed, self.timing)

    def _placement(self, group_size: int) -> list[int]:
        """Each episode's engine. Paced: the engine paired with the episode's env worker
        (worker w plays with engine w mod E), so each pair alternates between one batched
        decode and one batched env step, like the synchronous loop, and the pairs do not
        wait for each other. Free: a task's samples on one engine (one prefill of their
        common first prompt). An episode stays there (its chat is in that prefix cache)
        unless `_engine` moves it."""
        engines = self.stream.num_engines
        worker_of = getattr(self.loop.pool, "worker_of", None)
        if self.paced and worker_of is not None:
            return [worker_of(ep.env_id) % engines for ep in self.episodes]
        return [(i // group_size) % engines for i in range(len(self.episodes))]

    def _held(self) -> set[int]:
        """Paced: the engines that must not step now, those with no episode turn to decode
        while an episode of theirs is alive (it is stepping its environment). Their
        analyses wait, with their KV cache, and go on in the steps of the next turn."""
        acting = {e for e, n in enumerate(self.stream.load("act")) if n}
        alive = {self.engine_of[i] for i, r in enumerate(self.records) if r is None}
        return alive - acting

    def _wait_one(self) -> None:
        engine_refs, env_refs = self.stream.refs(), list(self.pending_env)
        kind = "both" if engine_refs and env_refs else ("engines" if engine_refs else "envs")
        t0 = time.perf_counter()
        ready, _ = self._ray.wait(engine_refs + env_refs, num_returns=1, timeout=1.0)
        self.timing.wait[kind] += time.perf_counter() - t0
        for key, error in self.stream.expire():
            self._failed(key, error)
        timeout = self.loop.pool.step_timeout_s
        now = time.monotonic()
        for ref, p in list(self.pending_env.items()):
            if ref not in ready and now - p.started > timeout:
                del self.pending_env[ref]
                self._observed(self.loop.pool.collect_step(p, answered=False))
        if not ready:
            return
        ref = ready[0]
        if self.stream.owns(ref):
            done, failed = self.stream.collect(ref)
            self._generated(done)
            for key, error in failed:
                self._failed(key, error)
        elif ref in self.pending_env:
            self._observed(self.loop.pool.collect_step(self.pending_env.pop(ref)))

    # ------------------------------------------------------------ episodes

    def _ask(self, i: int) -> None:
        ep = self.episodes[i]
        ids = self.loop._ask(ep)
        if ids is None:
            self._end(i)
            return
        self.prompts[i] = ids
        offset = i + len(self.episodes) * len(ep.turns)  # distinct per (episode, turn)
        self.stream.submit(self._engine(i), ("act", i), ids, self.spec, offset)

    def _engine(self, i: int) -> int:
        """The engine for episode `i`'s next request: its own, unless (free pacing) that one
        holds `MOVE_AT` more requests than the least loaded engine (then the episode moves
        there: one prefill of its chat buys a balanced fleet while the other episodes end).
        Paced, an episode never moves: its engine's batch is its env worker's episodes."""
        if self.paced:
            return self.engine_of[i]
        load = self.stream.load()
        own, least = self.engine_of[i], min(range(len(load)), key=load.__getitem__)
        if load[own] - load[least] >= MOVE_AT:
            self.engine_of[i] = least
        return self.engine_of[i]

    def _generated(self, done: list[tuple[Any, Any]]) -> None:
        actions: dict[int, str] = {}
        for (kind, i), gen in done:
            if kind == "analyze":
                self._analysed(i, gen)
                continue
            ep = self.episodes[i]
            action = self.loop._act(ep, self.prompts.pop(i), gen, self.stats)
            if action is None:
                self._end(i)
            else:
                actions[ep.env_id] = action
        if not actions:
            return
        self.stats.turns += len(actions)
        known, pending = self.loop.pool.submit_step(actions)
        self._observed(known)
        self.pending_env.update({p.ref: p for p in pending})

    def _observed(self, results: dict[int, Any]) -> None:
        for env_id, res in results.items():
            i = self.by_env[env_id]
            self.loop._observe(self.episodes[i], res)
            if self.episodes[i].done:
                self._end(i)
            else:
                self._ask(i)

    def _failed(self, key: Any, error: str) -> None:
        kind, i = key
        if kind == "analyze":
            self._analysed(i, None, error)
            return
        ep = self.episodes[i]
        self.prompts.pop(i, None)
        ep.done, ep.status, ep.error = True, Status.ENGINE_ERROR, error
        self._end(i)

    def _end(self, i: int) -> None:
        self.records[i] = self.loop._record(self.episodes[i])
        self.live -= 1
        self.last_end = time.perf_counter()
        if self.analysis is None:
            return
        rule = self.analysis.cfg.select
        if rule == "all":  # every trainable episode, as soon as it ends
            if selected([self.records[i]])[0]:  # type: ignore[list-item]
                self._analyse(i)
            return
        first = i - i % self.group_size
        group = self.records[first : first + self.group_size]
        if any(r is None for r in group):
            return  # the selection sees the whole group
        for j, chosen in enumerate(selected(group, rule)):  # type: ignore[arg-type]
            if chosen:
                self._analyse(first + j)

    # ------------------------------------------------------------ analyses

    def _analyse(self, i: int) -> None:
        from megatron_seed.skills.parse import AnalysisResult, build_requests

        assert self.analysis is not None
        record = self.records[i]
        request = build_requests([record], self.analysis.cfg.analyzer_layout, self.rules.min_words)
        request = replace(request[0], index=i)
        self.results[i] = AnalysisResult(index=i, trajectory_id=request.trajectory_id)
        self._send_analysis(i, request)

    def _send_analysis(self, i: int, request: Any) -> None:
        from megatron_seed.data.generation import Generation
        from megatron_seed.data.requests import request_ids
        from megatron_seed.skills.parse import absorb_reply

        assert self.analysis is not None
        ids = request_ids(self.analysis.tokenizer, request)
        limit = self.analysis.max_prompt_tokens
        if limit is not None and len(ids) > limit:
            error = Generation(error="analyzer prompt exceeds the engine's context")
            absorb_reply(request, self.results[i], error, self.analysis.cfg, self.rules)
            return
        self.backlog.append((i, request, ids))

    def _feed(self) -> None:
        """Send waiting analyses to engines with room (see the module docstring)."""
        if not self.backlog:
            return
        turns = self.stream.load("act")
        if self.paced:  # to the episode's own engine at once: `_held` paces it
            room = list(range(len(turns)))
        else:
            room = [e for e, t in enumerate(turns) if t <= ANALYZE_BELOW or self.live == 0]
        if not room:
            return
        for i, request, ids in self.backlog:
            own = self.engine_of[i]
            engine = own if own in room else min(room, key=turns.__getitem__)
            self.asked[i] = (request, len(ids))
            offset = i + len(self.episodes) * request.attempt
            self.stream.submit(engine, ("analyze", i), ids, self.analysis_spec, offset)
        self.backlog = []

    def _analysed(self, i: int, gen: Any, error: str | None = None) -> None:
        from megatron_seed.data.generation import Generation
        from megatron_seed.skills.parse import absorb_reply

        assert self.analysis is not None
        request, prompt_tokens = self.asked.pop(i)
        reply = (
            Generation(error=error)
            if gen is None
            else Generation(
                text=gen.text,
                prompt_tokens=prompt_tokens,
                completion_tokens=len(gen.token_ids),
                finish_reason=gen.finish_reason,
            )
        )
        retry = absorb_reply(request, self.results[i], reply, self.analysis.cfg, self.rules)
        if retry is not None:
            self._send_analysis(i, retry)
