"""Env workers: many episodes in parallel Ray worker processes.

``EnvPool`` spreads episodes of one environment (an ``envs.spec`` name) over ``num_workers``
Ray actors (``EnvWorker``), each holding several episodes (one engine per episode, engines
reused across episodes).

- Prefetched resets: ``prefetch(games)`` queues the (seconds-long) load+reset of the next
  episodes on the workers right away; a later ``reset(games)`` picks them up.
- Max steps: the env ends an episode after ``max_steps`` actions, status ``truncated``.
- Failures: a worker that dies (crash, OOM, killed) or does not answer within the timeout is
  replaced by a fresh actor and its live episodes are rebuilt there by replaying their
  action histories (environments must be deterministic given their actions); they continue
  with status ``recovered``. An episode whose own action kills the fresh worker again, or whose game
  cannot be loaded, ends with status ``error`` and a message. Nothing is dropped silently:
  every requested episode gets a ``StepResult``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.api import EpisodeStatus, StepResult, status_of
from envs.spec import DEFAULT_ENV, get_env

# what a worker returns per episode: ("ok", obs, reward, done, info) or ("error", message)
_Reply = tuple


class EnvWorker:
    """One worker process: episodes keyed by id, each on its own engine of environment
    ``env`` (a name ``envs.spec.get_env`` resolves in this process)."""

    def __init__(self, env: str, max_steps: int) -> None:
        self._make_env = get_env(env).make_env
        self._max_steps = max_steps
        self._free: list[Any] = []
        self._episodes: dict[int, Any] = {}
        self._first: dict[int, _Reply] = {}
        self.busy_s = 0.0  # seconds spent loading games and stepping (the pool's accounting)

    def usage(self) -> dict[str, float]:
        """Since this worker started: `busy_s`, seconds spent in resets and steps; `cpu_s`,
        its process's CPU seconds (user + system, every thread)."""
        return {"busy_s": self.busy_s, "cpu_s": time.process_time()}

    def _new_env(self) -> Any:
        return self._free.pop() if self._free else self._make_env(self._max_steps)

    def pid(self) -> int:
        """The worker's process id."""
        return os.getpid()

    def node(self) -> str:
        """The node this worker runs on: Slurm's name (inherited by the job's Ray workers),
        else the host name, as `megatron_seed.hosts.node_name` names the library's."""
        return os.environ.get("SLURMD_NODENAME") or socket.gethostname()

    def prefetch(self, episode_id: int, game: str) -> None:
        """Load and reset ``game`` now so that ``reset(episode_id)`` returns at once."""
        env, start = self._new_env(), time.perf_counter()
        try:
            observation, info = env.reset(game)
        except Exception as err:
            self._free.append(env)
            self._first[episode_id] = ("error", f"{type(err).__name__}: {err}")
            return
        finally:
            self.busy_s += time.perf_counter() - start
        self._episodes[episode_id] = env
        self._first[episode_id] = ("ok", observation, 0.0, False, info)

    def reset(self, episode_id: int, game: str) -> _Reply:
        """First observation of an episode (prefetched or done now)."""
        if episode_id not in self._first:
            self.prefetch(episode_id, game)
        return self._first.pop(episode_id)

    def step_many(self, actions: dict[int, str]) -> dict[int, _Reply]:
        """One action for each of several episodes."""
        start = time.perf_counter()
        try:
            return self._step_many(actions)
        finally:
            self.busy_s += time.perf_counter() - start

    def _step_many(self, actions: dict[int, str]) -> dict[int, _Reply]:
        out: dict[int, _Reply] = {}
        for episode_id, action in actions.items():
            env = self._episodes.get(episode_id)
            if env is None:
                out[episode_id] = ("error", f"episode {episode_id} is not live on this worker")
                continue
            try:
                observation, reward, done, info = env.step(action)
            except Exception as err:
                out[episode_id] = ("error", f"{type(err).__name__}: {err}")
                self.release(episode_id)
                continue
            out[episode_id] = ("ok", observation, reward, done, info)
            if done:
                self.release(episode_id)
        return out

    def replay(self, episode_id: int, game: str, actions: list[str]) -> _Reply:
        """Rebuild an episode on this worker from its game and action history."""
        self.prefetch(episode_id, game)
        reply = self._first.pop(episode_id)
        for action in actions:
            if reply[0] != "ok":
                break
            reply = self._step_many({episode_id: action})[episode_id]
        return reply

    def release(self, episode_id: int) -> None:
        """Forget an episode; its engine goes back to the free list."""
        env = self._episodes.pop(episode_id, None)
        self._first.pop(episode_id, None)
        if env is not None:
            self._free.append(env)

    def crash(self) -> None:
        """Test hook: die like a segfaulting engine would."""
        os._exit(1)

    def hang(self, seconds: float) -> None:
        """Test hook: stop answering for a while."""
        time.sleep(seconds)


@dataclass
class PendingStep:
    """A step sent to one worker (`EnvPool.submit_step`): its episodes' actions and the
    reply's object ref."""

    worker: int
    batch: dict[int, str]
    ref: Any
    started: float = field(default_factory=time.monotonic)


@dataclass
class _Episode:
    game: str
    worker: int
    actions: list[str] = field(default_factory=list)
    done: bool = False
    recovered: bool = False


class EnvPool:
    """Episodes spread over Ray worker actors, with prefetched resets and failure recovery."""

    def __init__(
        self,
        env: str = DEFAULT_ENV,
        num_workers: int = 2,
        max_steps: int = 30,
        step_timeout_s: float = 60.0,
        reset_timeout_s: float = 300.0,
        worker_cpus: float = 0.0,
    ) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("EnvPool needs ray.init() first")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._ray = ray
        self._actor_cls = ray.remote(num_cpus=worker_cpus, max_restarts=0)(EnvWorker)
        self._env = env
        self._max_steps = max_steps
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self._workers = [self._spawn(i) for i in range(num_workers)]
        self._episodes: dict[int, _Episode] = {}
        self._prefetched: list[int] = []
        self._ids = itertools.count()
        self._errors: dict[int, str] = {}
        self.restarts = 0

    # ---- lifecycle ---------------------------------------------------------------------

    def _spawn(self, index: int) -> Any:
        """Worker `index` on alive node `index mod N`: spread over a multi-node cluster
        (Ray's SPREAD and soft node affinity both packed zero-CPU actors on one node);
        a respawn picks among the nodes alive then."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = sorted(n["NodeID"] for n in self._ray.nodes() if n.get("Alive"))
        node = nodes[index % len(nodes)] if nodes else None
        strategy = NodeAffinitySchedulingStrategy(node, soft=False) if node else "DEFAULT"
        return self._actor_cls.options(scheduling_strategy=strategy).remote(
            self._env, self._max_steps
        )

    @property
    def workers(self) -> list[Any]:
        """The live worker actor handles (for tests and monitoring)."""
        return list(self._workers)

    def worker_of(self, episode_id: int) -> int:
        """Index of the worker holding an episode."""
        return self._episodes[episode_id].worker

    def close(self) -> None:
        """Kill all workers."""
        for worker in self._workers:
            self._ray.kill(worker)
        self._workers = []

    def _least_loaded(self) -> int:
        load = [0] * len(self._workers)
        for episode in self._episodes.values():
            if not episode.done:
                load[episode.worker] += 1
        return min(range(len(load)), key=load.__getitem__)

    def _new_episode(self, game: str) -> int:
        episode_id = next(self._ids)
        self._episodes[episode_id] = _Episode(str(game), self._least_loaded())
        return episode_id

    # ---- API ---------------------------------------------------------------------------

    def prefetch(self, games: Sequence[str]) -> None:
        """Start loading these games on the workers now; ``reset`` will pick them up."""
        for game in games:
            episode_id = self._new_episode(game)
            episode = self._episodes[episode_id]
            self._workers[episode.worker].prefetch.remote(episode_id, episode.game)
            self._prefetched.append(episode_id)

    def reset(self, games: Sequence[str]) -> list[StepResult]:
        """Start one episode per game (prefetched ones first); results in ``games`` order."""
        ids = []
        for game in games:
            match = next((i for i in self._prefetched if self._episodes[i].game == str(game)), None)
            if match is not None:
                self._prefetched.remove(match)
                ids.append(match)
            else:
                ids.append(self._new_episode(game))
        refs = {
            i: self._workers[self._episodes[i].worker].reset.remote(i, self._episodes[i].game)
            for i in ids
        }
        replies = self._gather(refs, self.reset_timeout_s, replay_actions=False)
        return [self._result(i, replies[i]) for i in ids]

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """One action per listed live episode; one result per listed episode."""
        out, pending = self.submit_step(actions)
        ready, _ = self._ray.wait(
            [p.ref for p in pending], num_returns=len(pending), timeout=self.step_timeout_s
        )
        ready_set = set(ready)
        for p in pending:
            out.update(self.collect_step(p, answered=p.ref in ready_set))
        return out

    def submit_step(
        self, actions: dict[int, str]
    ) -> tuple[dict[int, StepResult], list[PendingStep]]:
        """Send one action per listed episode without waiting: (the results known at once,
        for episodes that are not live; one `PendingStep` per worker called). Pass each
        pending step to `collect_step` once its `ref` is ready (or it timed out)."""
        out: dict[int, StepResult] = {}
        by_worker: dict[int, dict[int, str]] = {}
        for episode_id, action in actions.items():
            episode = self._episodes.get(episode_id)
            if episode_id in self._errors:
                message = self._errors.pop(episode_id)
                out[episode_id] = StepResult(
                    episode_id, "", 0.0, True, {}, EpisodeStatus.ERROR, message
                )
                continue
            if episode is None or episode.done:
                out[episode_id] = StepResult(
                    episode_id, "", 0.0, True, {}, EpisodeStatus.ERROR, "episode is not live"
                )
                continue
            by_worker.setdefault(episode.worker, {})[episode_id] = action
        pending = [
            PendingStep(w, batch, self._workers[w].step_many.remote(batch))
            for w, batch in by_worker.items()
        ]
        return out, pending

    def collect_step(self, pending: PendingStep, answered: bool = True) -> dict[int, StepResult]:
        """The results of a submitted step; `answered=False` (no reply within the step
        timeout) or a failed worker: the worker is replaced and its episodes replayed."""
        try:
            if not answered:
                raise TimeoutError(
                    f"worker {pending.worker} did not answer in {self.step_timeout_s}s"
                )
            replies = self._ray.get(pending.ref)
        except Exception:  # RayActorError, TimeoutError, ...
            replies = self._recover_step(pending.worker, pending.batch)
        out: dict[int, StepResult] = {}
        for episode_id, action in pending.batch.items():
            self._episodes[episode_id].actions.append(action)
            out[episode_id] = self._result(episode_id, replies[episode_id])
        return out

    def usage(self) -> list[dict[str, float] | None]:
        """Each worker's `EnvWorker.usage` (a replaced worker counts from its start; None:
        no answer)."""
        out: list[dict[str, float] | None] = []
        for ref in [w.usage.remote() for w in self._workers]:
            try:
                out.append(dict(self._ray.get(ref, timeout=30)))
            except Exception:
                out.append(None)
        return out

    # ---- failure handling ----------------------------------------------------------------

    def _gather(
        self, refs: dict[int, Any], timeout: float, replay_actions: bool
    ) -> dict[int, _Reply]:
        """Replies of per-episode calls; a failed worker is replaced and its calls retried once."""
        ready, _ = self._ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        ready_set = set(ready)
        replies: dict[int, _Reply] = {}
        failed_workers: set[int] = set()
        for episode_id, ref in refs.items():
            try:
                if ref not in ready_set:
                    raise TimeoutError(f"no answer in {timeout}s")
                replies[episode_id] = self._ray.get(ref)
            except Exception:
                failed_workers.add(self._episodes[episode_id].worker)
        for w in failed_workers:
            self._replace_worker(w)
            self._rebuild(w, skip=set(refs))
        for episode_id in refs:
            if episode_id not in replies:
                episode = self._episodes[episode_id]
                actions = episode.actions if replay_actions else []
                replies[episode_id] = self._call_one(
                    episode_id, "replay", episode_id, episode.game, actions
                )
                episode.recovered = replies[episode_id][0] == "ok"
        return replies

    def _replace_worker(self, w: int) -> None:
        with contextlib.suppress(Exception):  # already gone
            self._ray.kill(self._workers[w])
        self._workers[w] = self._spawn(w)
        self.restarts += 1

    def _call_one(self, episode_id: int, method: str, *args: Any) -> Any:
        """One call for one episode on its worker.

        If the worker fails on it, that episode is ended (it is the likely culprit), the worker
        is replaced, its other live episodes are replayed, and an error reply is returned.
        """
        w = self._episodes[episode_id].worker
        ref = getattr(self._workers[w], method).remote(*args)
        ready, _ = self._ray.wait([ref], timeout=self.reset_timeout_s)
        try:
            if not ready:
                raise TimeoutError(f"worker {w} did not answer in {self.reset_timeout_s}s")
            return self._ray.get(ref)
        except Exception as err:
            self._episodes[episode_id].done = True
            self._replace_worker(w)
            self._rebuild(w)
            return ("error", f"worker failed again on this episode: {type(err).__name__}: {err}")

    def _rebuild(self, w: int, skip: set[int] | None = None) -> None:
        """Replay every live episode of worker ``w`` on its (fresh) actor."""
        skip = skip or set()
        for episode_id, episode in list(self._episodes.items()):
            if episode.worker != w or episode.done or episode_id in skip:
                continue
            if episode_id in self._prefetched:
                self._workers[w].prefetch.remote(episode_id, episode.game)
                continue
            reply = self._call_one(episode_id, "replay", episode_id, episode.game, episode.actions)
            if reply[0] == "ok":
                episode.recovered = True
            else:
                episode.done = True
                self._errors[episode_id] = reply[1]

    def _recover_step(self, w: int, batch: dict[int, str]) -> dict[int, _Reply]:
        """Worker ``w`` failed during ``batch``: fresh worker, replay, retry one by one."""
        self._replace_worker(w)
        self._rebuild(w)
        replies: dict[int, _Reply] = {}
        for episode_id, action in batch.items():
            episode = self._episodes[episode_id]
            if episode_id in self._errors:
                replies[episode_id] = ("error", self._errors.pop(episode_id))
                continue
            if episode.done:  # ended while another episode was being replayed
                replies[episode_id] = ("error", "worker failed while replaying this episode")
                continue
            reply = self._call_one(episode_id, "step_many", {episode_id: action})
            replies[episode_id] = reply[episode_id] if isinstance(reply, dict) else reply
        return replies

    def _result(self, episode_id: int, reply: _Reply) -> StepResult:
        episode = self._episodes[episode_id]
        if reply[0] != "ok":
            episode.done = True
            return StepResult(episode_id, "", 0.0, True, {}, EpisodeStatus.ERROR, reply[1])
        _, observation, reward, done, info = reply
        episode.done = done
        status = status_of(done, info)
        if status is EpisodeStatus.RUNNING and episode.recovered:
            status = EpisodeStatus.RECOVERED
        return StepResult(episode_id, observation, reward, done, info, status)
