"""The rollout side of a Stage-2 trainer rank, as a role object.

Trainer rank 0 is the `Leader`: it drives the fleet and the env workers (a `RolloutSession`),
samples the tasks and writes the metrics, trajectories and notes. Every other rank is a
`Follower` with the same methods: it plays nothing, receives the weights' collective and
writes nothing. The phases (`pipeline.stage2`) call these methods and never test the rank.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from megatron_seed.data import Analysis, TrajectoryRecord, write_jsonl
from megatron_seed.files import write_json
from megatron_seed.pipeline.collective import rank
from megatron_seed.pipeline.evaluate import summarize
from megatron_seed.pipeline.metrics import MetricsLog, PhaseTimer, rollout_metrics
from megatron_seed.progress import LiveBar

if TYPE_CHECKING:
    from megatron_seed.config import SeedConfig
    from megatron_seed.pipeline.job import Stage2Job
    from megatron_seed.train.batch import PolicyBatch
    from megatron_seed.train.trainer import TrainerState

PREEMPTED = "preempted.json"  # the note a preempted run leaves in its output folder

Played = tuple[list[TrajectoryRecord] | None, dict[str, float]]  # records (None: a follower)


@dataclass(frozen=True)
class Slot:
    """What a rollout plays: update `step`'s tasks from data position `position`, on the
    engines' weights of trainer step `version` (one-step-off plays the next update's
    tasks on this update's weights)."""

    step: int
    position: int
    version: int

    @classmethod
    def now(cls, state: TrainerState) -> Slot:
        """This update, on the weights the trainer (of state `state`) holds."""
        return cls(state.step, state.data_position, state.step)


class TaskSampler:
    """Tasks per update from a seeded shuffle of the games; `position` is resumable."""

    def __init__(self, games: list[str], seed: int) -> None:
        if not games:
            raise ValueError("no training games")
        self.order = list(games)
        random.Random(seed).shuffle(self.order)

    def take(self, position: int, n: int) -> list[str]:
        """The n games starting at `position` (wrapping around)."""
        return [self.order[(position + i) % len(self.order)] for i in range(n)]


def update_seed(seed: int, step: int) -> int:
    """The engines' sampling seed for update `step` (engine e draws from it + e)."""
    return seed * 1_000_003 + step * 1_009


def analyzes(cfg: Any) -> bool:
    """Whether the policy's own analyzer makes this update's teacher skills."""
    return cfg.algo.use_opd and cfg.skill.teacher_source == "analyzer"


def library_skills(
    records: list[TrajectoryRecord], library: dict[str, str], source: str = "library"
) -> dict[str, float]:
    """The analyze phase of a fixed teacher context (the baselines' library, the
    ``static-skills`` ablation's Stage-1 skills, the expert plan): each trajectory's skill
    is its game's entry (fills record.skill / analysis; no analyzer call)."""
    for record in records:
        record.skill = library.get(record.game)
        valid = record.skill is not None
        record.analysis = Analysis(record.task_id, valid=valid, source=source)
    valid = sum(r.has_teacher for r in records)
    return {"analyze/n": float(len(records)), "analyze/valid_rate": valid / max(1, len(records))}


class Follower:
    """A trainer rank other than 0: the leader's methods, with nothing to play or write."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []  # the metrics rows logged (rank 0's)

    def play_and_analyze(self, timer: PhaseTimer, slot: Slot) -> Played:
        """Nothing played here: rank 0's records arrive by broadcast."""
        return None, {}

    def evaluate(self) -> dict[str, float]:
        """Rank 0 evaluates."""
        return {}

    def send_weights(self, stream: Any, meta: Any, dtype: torch.dtype, fleet: Any) -> dict:
        """This rank's part of the weights' collective (`transfer.follow_sync`)."""
        from megatron_seed.rollout.fleet import packed_bytes
        from megatron_seed.rollout.transfer import follow_sync

        buffer = packed_bytes(fleet.sync_bucket_bytes, meta)
        follow_sync(stream, fleet.transport, rank(), dtype, buffer)
        return {}

    def refit_verdict(self, ids: list[int], reference: list[Any], precision: str) -> Any:
        """Rank 0 compares the engines with the trainer (its verdict is broadcast)."""
        return {}

    def probe_routes(self, ids: list[int]) -> None:
        """Rank 0 reads the engines' routes of the probe (its answer is broadcast)."""

    def routes(self, pb: PolicyBatch, students: int | None) -> None:
        """Rank 0 reads the routes back from the engines (its answer is broadcast)."""

    def stale_pairs(self, step: int, records: list[TrajectoryRecord] | None) -> None:
        """Rank 0 re-analyses (`pipeline.one_step_off.staleness`)."""

    def sleep(self) -> None:
        """No engines here."""

    def wake(self, tags: list[str] | None = None) -> None:
        """No engines here."""

    def usage(self) -> None:
        """No engines or env workers to count."""

    def start(self, step: int) -> None:
        """Nothing to prepare."""

    def save_trajectories(self, step: int, records: list[TrajectoryRecord] | None) -> None:
        """Rank 0 writes them."""

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Rank 0 logs."""

    def note_preempted(self, step: int, updates: int) -> None:
        """Rank 0 leaves the note."""

    def close(self) -> None:
        """Nothing to stop."""


class Leader(Follower):
    """Trainer rank 0: a `RolloutSession` (fleet + env workers), the task sampler, the log;
    the tokenizer for the analyzer's prompts."""

    def __init__(self, job: Stage2Job, session: Any, tokenizer: Any = None) -> None:
        super().__init__()
        self.job, self.session, self.tokenizer = job, session, tokenizer
        self.fleet = session.fleet
        self.sampler = TaskSampler(job.games, job.cfg.seed)
        self.log = MetricsLog(job.out_dir)
        self.bar: LiveBar | None = None  # the updates' bar, from `start` to `close`
        (Path(job.out_dir) / PREEMPTED).unlink(missing_ok=True)  # this run resumes it

    @property
    def cfg(self) -> SeedConfig:
        """The run's config."""
        return self.job.cfg

    @classmethod
    def open(cls, job: Stage2Job, tokenizer: Any, fleet: Any, pool: Any) -> Leader:
        """Start (or connect to) the fleet and the env workers."""
        from megatron_seed.rollout.session import RolloutSession

        start = time.perf_counter()
        session = RolloutSession(
            job.cfg,
            job.model_dir,
            tokenizer=tokenizer,
            fleet=fleet,
            fleet_address=job.fleet_address,
            pool=pool,
            ray_address=job.ray_address,
            replay_dir=str(Path(job.out_dir) / "replay"),
        )
        took = time.perf_counter() - start
        print(f"fleet: {session.placement} (up in {took:.1f} s)", flush=True)
        return cls(job, session, tokenizer)

    # ------------------------------------------------------------------ rollout, analyze

    def play_and_analyze(self, timer: PhaseTimer, slot: Slot) -> Played:
        """The `rollout` phase: B tasks x N episodes with theta_old for `slot`; then the
        `analyze` phase unless the overlapped rollout analysed them as they ended."""
        cfg = self.cfg
        with timer.time("rollout"):
            records, metrics = self._rollout(slot)
        if cfg.algo.use_opd and not (cfg.rollout.overlap and analyzes(cfg)):
            with timer.time("analyze"):
                metrics.update(self._analyze(records))
        return records, metrics

    def _rollout(self, slot: Slot) -> tuple[list[TrajectoryRecord], dict[str, float]]:
        cfg, session, step = self.cfg, self.session, slot.step
        games = self.sampler.take(slot.position, cfg.rollout.tasks_per_update)
        if cfg.rollout.reseed_each_update:
            self.fleet.reseed(update_seed(cfg.seed, step))
        skills = self.job.skill_library if cfg.skill.rollout_skill else None
        tasks = session.tasks(games, skills)
        metrics: dict[str, float] = {}
        if cfg.rollout.overlap:
            plan = self._analysis_plan()
            played = session.play_overlapped(
                tasks, cfg.rollout.group_size, session.sampling(), step, plan
            )
            metrics.update(played.timing.metrics())
            if plan is not None:
                metrics.update(_overlapped_analysis(played.records, played.analyses))
        else:
            played = session.play(tasks, cfg.rollout.group_size, session.sampling(), update=step)
        records = played.records
        if cfg.rollout.one_step_off:
            for record in records:  # the trainer step whose weights played it
                record.policy_version = slot.version
        metrics.update(rollout_metrics(records))
        stats = dataclasses.asdict(played.stats)
        metrics.update({f"rollout/{k}": float(v) for k, v in stats.items()})
        return records, metrics

    def _analysis_plan(self) -> Any:
        """What the overlapped rollout needs to analyse episodes as they end (None: none)."""
        from megatron_seed.rollout.overlap import AnalysisPlan

        if not analyzes(self.cfg):
            return None
        return AnalysisPlan(self.tokenizer, self.cfg.skill, self.session.analyzer_prompt_limit())

    def _analyze(self, records: list[TrajectoryRecord]) -> dict[str, float]:
        """Hindsight skills from the same fleet weights, or a fixed source's."""
        source = self.cfg.skill.teacher_source
        if source != "analyzer":
            assert self.job.skill_library is not None  # check_job
            return library_skills(records, self.job.skill_library, source)
        return self.reanalyze(records, self.cfg.skill)

    def reanalyze(self, records: list[TrajectoryRecord], skill: Any) -> dict:
        """The fleet's analyzer over `records` under the skill settings `skill`."""
        from megatron_seed.rollout.analyzer import analyze_records

        limit = self.session.analyzer_prompt_limit()
        return analyze_records(self.fleet, self.tokenizer, records, skill, max_prompt_tokens=limit)

    def evaluate(self) -> dict[str, float]:
        """Episodes on the evaluation games, no skill (greedy, or `job.eval_episodes` sampled
        per game with the same draws every time): success overall and per family."""
        session, job = self.session, self.job
        tasks = session.tasks(job.eval_games)
        if job.eval_episodes:  # `pipeline.evaluate.evaluate_policies`' sampled draws
            from megatron_seed.rollout.engine import SamplingSpec

            session.fleet.reseed(job.eval_seed)
            temperature, max_tokens = (
                self.cfg.rollout.temperature,
                self.cfg.rollout.max_response_tokens,
            )
            spec = SamplingSpec(temperature=temperature, max_tokens=max_tokens, seed=job.eval_seed)
            n = job.eval_episodes
        else:
            spec, n = session.sampling(True), 1
        records = session.play(tasks, n, spec, -1).records
        out = rollout_metrics(records, "evaluate")
        for fam, rate in summarize(records)["per_family"].items():
            out[f"evaluate/success_{fam}"] = rate
        return out

    def stale_pairs(self, step: int, records: list[TrajectoryRecord]) -> Any:
        """(lag, [(old, new)]) for `pipeline.one_step_off.staleness`: the lag between the
        trainer (at update `step`) and the oldest weights that played `records`; with a lag, up to
        `rollout.staleness_sample` analysed records and their re-analysis by the engines
        (which hold the trainer's weights now), every sampled one whatever `skill.select`
        picked for training."""
        cfg = self.cfg
        lag = step - min(r.policy_version for r in records)
        sample = [r for r in records if r.skill][: cfg.rollout.staleness_sample]
        fresh: list[TrajectoryRecord] = []
        if lag > 0 and sample and analyzes(cfg):
            fresh = [copy.deepcopy(r) for r in sample]
            for r in fresh:
                r.skill, r.analysis = None, None
            self.reanalyze(fresh, dataclasses.replace(cfg.skill, select="all"))
        return lag, [(old, new) for old, new in zip(sample, fresh, strict=False) if new.skill]

    # ------------------------------------------------------------------ weights, engines

    def send_weights(self, stream: Any, meta: Any, dtype: torch.dtype, fleet: Any) -> dict:
        """Stream the trainer's weights into every engine; bytes and seconds."""
        stats = self.fleet.update_weights(stream, bucket_bytes=fleet.sync_bucket_bytes, meta=meta)
        return {"sync/bytes": float(stats.bytes), "sync/seconds": stats.seconds}

    def refit_verdict(self, ids: list[int], reference: list[Any], precision: str) -> Any:
        """Every engine's log-probs of the probe against the trainer's (one list, or one per
        engine: `rollout.refit.check_refit`): the per-engine gaps, or the `RefitError`
        message naming the engine that differs."""
        from megatron_seed.rollout.refit import RefitError, check_refit

        per_engine = [p[0] for p in self.fleet.prompt_logprobs_per_engine([ids])]
        fleet = self.job.cfg.fleet
        tol = fleet.refit_max_gap_bf16 if precision == "bf16" else fleet.refit_max_gap_fp32
        try:
            return check_refit(reference, per_engine, tol)
        except RefitError as err:
            return str(err)

    def probe_routes(self, ids: list[int]) -> list[Any] | str:
        """Every engine's routes of the refit probe (`[n, layers, k]` each, engine order),
        or the error message if an engine fails."""
        try:
            return [r[0] for r in self.fleet.routes_per_engine([ids])]
        except Exception as err:  # every rank fails with it, none waits for the broadcast
            return f"{type(err).__name__}: {err}"

    def routes(self, pb: PolicyBatch, students: int | None) -> tuple[list, list] | str:
        """The engines' routes (`Fleet.routes`) of every student and teacher row, or (a
        number of `students`) of the first that many students (None for the other rows, no
        teachers); the error message if the engines fail."""

        def rows(batch: Any, n: int | None = None) -> list[list[int]]:
            if batch is None:
                return []
            lengths = batch.lengths.tolist()[:n]
            return [ids[:k] for ids, k in zip(batch.input_ids.tolist(), lengths, strict=False)]

        try:
            student = self.fleet.routes(rows(pb.student, students))
            teacher = self.fleet.routes(rows(pb.teacher)) if students is None else []
        except Exception as err:  # every rank fails with it, none waits for the broadcast
            return f"{type(err).__name__}: {err}"
        return student + [None] * (pb.rows - len(student)), teacher

    def sleep(self) -> None:
        """The engines let their GPU memory go (colocation)."""
        self.fleet.sleep()

    def wake(self, tags: list[str] | None = None) -> None:
        """The engines take back `tags` (default: all) of their GPU memory."""
        self.fleet.wake(tags)

    def usage(self) -> dict[str, Any] | None:
        """Busy and CPU seconds so far of every engine, env worker and the machine (None
        when the pool keeps no count)."""
        return self.session.usage() if hasattr(self.session.pool, "usage") else None

    # ------------------------------------------------------------------ files

    def start(self, step: int) -> None:
        """Resume the log after update `step`; the output folders and the config."""
        out = Path(self.job.out_dir)
        self.log.truncate_after(step)
        (out / "trajectories").mkdir(parents=True, exist_ok=True)
        self.job.cfg.save(out / "config.json")
        self.bar = LiveBar(self.job.cfg.updates, "stage 2: updates", initial=step)

    def save_trajectories(self, step: int, records: list[TrajectoryRecord] | None) -> None:
        """OUT/trajectories/update_<step>.jsonl."""
        path = Path(self.job.out_dir) / "trajectories" / f"update_{step:05d}.jsonl"
        write_jsonl(records or [], path)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Log one update and print its summary line."""
        self.log.write(step, metrics)
        self.rows.append({"step": step, **metrics})
        line = _summary(step, self.job.cfg.updates, metrics)
        if self.bar is None:
            print(line, flush=True)
        else:
            self.bar.write(line)
            self.bar.update()

    def note_preempted(self, step: int, updates: int) -> None:
        """OUT/preempted.json: where the rerun resumes."""
        note = {"step": step, "updates": updates}
        write_json(Path(self.job.out_dir) / PREEMPTED, note, indent=None)
        print(f"preempted after update {step}: checkpoint saved; rerun to resume", flush=True)

    def close(self) -> None:
        """Stop what the session started (and the bar)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.session.close()


def _overlapped_analysis(records: list[TrajectoryRecord], results: list[Any]) -> dict[str, float]:
    """Fold the analyses the overlapped rollout made into their records; their metrics."""
    from megatron_seed.rollout.analyzer import apply_analysis

    chosen = [records[r.index] for r in results]
    metrics = apply_analysis(chosen, results)
    trainable = sum(r.trainable for r in records)
    metrics["analyze/selected_share"] = len(chosen) / max(1, trainable)
    return metrics


def _summary(step: int, total: int, m: dict[str, Any]) -> str:
    keys = [
        ("success", "rollout/success"),
        ("len", "rollout/episode_length"),
        ("loss", "train/loss/total"),
        ("opd", "train/loss/opd"),
        ("gate", "train/opd/gate_mean"),
        ("pad", "train/pad_frac"),
        ("skill_valid", "analyze/valid_rate"),
        ("s", "time/update"),
    ]
    parts = [f"{name}={m[k]:.4g}" for name, k in keys if k in m]
    return f"[update {step}/{total}] " + " ".join(parts)
