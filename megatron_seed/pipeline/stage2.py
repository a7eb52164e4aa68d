"""Stage 2 of SEED: self-evolving on-policy distillation (the paper's Algorithm 1).

Every trainer rank runs `run_stage2` with the same code. Rank 0's rollout side is a real
`RolloutSession` (the vLLM fleet and the env workers, both Ray actors); the other ranks hold
a `NoRollout` that plays nothing, and receive each update's trajectories from rank 0. One
update, as named phases (each timed as `time/<phase>`, its metrics under `<phase>/`):

    sync      theta_old := theta; stream the trainer's weights into every engine; the
              trainer and every engine score a fixed probe (`rollout.refit`): an engine
              whose weights differ fails the update, naming the engine
    rollout   B tasks x N episodes with theta_old (the fleet) against the env workers
    analyze   the same fleet turns each finished episode into a hindsight skill s (or,
              for the baselines, each takes its game's fixed skill: `library_skills`)
    train     old/ref/teacher log-probs, SEED loss, Adam step (`SeedTrainer.train_step`)
    evaluate  (every `eval_every` updates) greedy episodes without skills
    checkpoint (every `save_every` updates)

Metrics go to OUT/metrics.jsonl (+ TensorBoard), trajectories to OUT/trajectories/, and
checkpoints to OUT/checkpoints/; a killed run resumes from the latest complete checkpoint
(weights, optimizer, step, data position, RNG).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_seed.config import SeedConfig
from megatron_seed.data import Analysis, TrajectoryRecord, check_chat_template, write_jsonl
from megatron_seed.pipeline.evaluate import summarize
from megatron_seed.pipeline.metrics import MetricsLog, PhaseTimer, rollout_metrics


@dataclass
class Stage2Job:
    """Everything one Stage-2 run needs (picklable: it crosses process boundaries).

    The fleet, env workers and environment are `cfg.fleet` and `cfg.env`."""

    model_dir: str  # HF checkpoint + tokenizer (theta_sft, also the KL reference)
    games: list[str]  # training tasks (for ALFWorld, game folders)
    out_dir: str
    cfg: SeedConfig = field(default_factory=SeedConfig)
    ray_address: str | None = None
    eval_games: list[str] = field(default_factory=list)
    eval_every: int = 0
    # game -> skill for every training game: the fixed skills of `cfg.skill.teacher_source`
    # (library, stage1_library, expert_plan; `skills.library`), also the rollout prompts'
    # when `cfg.skill.rollout_skill`
    skill_library: dict[str, str] | None = None
    # Stage-1 annotations (JSONL) whose accepted skills analyzer replay draws from
    # (`cfg.algo.replay_weight` > 0)
    replay_data: str | None = None
    # a running fleet to connect to (`Fleet.address`) instead of starting one; its engines
    # hold other weights, so theta is synced before the first rollout
    fleet_address: Any = None


def check_job(job: Stage2Job) -> None:
    """Fail loud before any compute: a method's fixed skills must cover every training
    game, and analyzer replay needs its Stage-1 examples."""
    skill = job.cfg.skill
    fixed = job.cfg.algo.use_opd and skill.teacher_source != "analyzer"
    if fixed or skill.rollout_skill:
        need = f"skill.teacher_source={skill.teacher_source!r}" if fixed else "skill.rollout_skill"
        if job.skill_library is None:
            raise ValueError(f"{need} needs a skill library (--skill-library)")
        missing = [g for g in job.games if g not in job.skill_library]
        # the Stage-1 library may lack games whose Stage-1 skills all failed (no teacher)
        if missing and (skill.rollout_skill or skill.teacher_source != "stage1_library"):
            raise ValueError(
                f"the skill library has no skill for {len(missing)} games, e.g. {missing[0]}"
            )
    if job.cfg.algo.replay_weight and not job.replay_data:
        raise ValueError("algo.replay_weight > 0 needs Stage-1 annotations (--replay-data)")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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


class NoRollout:
    """The rollout side of ranks other than 0: plays nothing, logs nothing."""

    session = None

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Nothing to log here."""

    def close(self) -> None:
        """Nothing to stop."""


class RolloutSide:
    """Rank 0's rollout side: a `RolloutSession`, the task sampler and the metrics log."""

    def __init__(self, job: Stage2Job, tokenizer: Any, fleet: Any, pool: Any) -> None:
        from megatron_seed.rollout.session import RolloutSession

        self.job = job
        start = time.perf_counter()
        self.session = RolloutSession(
            job.cfg,
            job.model_dir,
            tokenizer=tokenizer,
            fleet=fleet,
            fleet_address=job.fleet_address,
            pool=pool,
            ray_address=job.ray_address,
            replay_dir=str(Path(job.out_dir) / "replay"),
        )
        self.log = MetricsLog(job.out_dir)
        self.sampler = TaskSampler(job.games, job.cfg.seed)
        took = time.perf_counter() - start
        print(f"fleet: {self.session.placement} (up in {took:.1f} s)", flush=True)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Log one update and print its summary line."""
        self.log.write(step, metrics)
        print(_summary(step, self.job.cfg.updates, metrics), flush=True)

    def close(self) -> None:
        """Stop what the session started."""
        self.session.close()


@dataclass
class Run:
    """The state the phases share on one rank."""

    job: Stage2Job
    trainer: Any
    tokenizer: Any
    side: RolloutSide | NoRollout
    hf_config: dict[str, Any]
    need_sync: bool  # the engines do not hold theta yet
    probe: Any = None  # TokenBatch [1, n] the refit check scores after every sync
    replay_pool: list[TrajectoryRecord] = field(default_factory=list)  # analyzer replay
    # one-step-off: the next update's rollout and analysis, running in `ahead_pool`
    ahead: Future | None = None
    ahead_pool: ThreadPoolExecutor | None = None

    @property
    def cfg(self) -> SeedConfig:
        return self.job.cfg

    @property
    def step(self) -> int:
        return self.trainer.state.step


# ----------------------------------------------------------------------------- phases


def sync(run: Run, verify: bool = True) -> dict[str, float]:
    """Stream theta into every engine through vLLM's weight-transfer API (a collective over
    trainer ranks; rank 0 drives the fleet, `transfer.follow_sync` on the others), in the
    engines' dtype, then (`verify`) check the refit on the probe."""
    from megatron_seed.rollout.fleet import packed_bytes
    from megatron_seed.rollout.session import fleet_dtype
    from megatron_seed.rollout.transfer import export_meta, follow_sync

    fleet = run.cfg.fleet
    dtype = getattr(torch, fleet_dtype(run.cfg))
    meta = export_meta(run.trainer.spec, dtype)
    stream = run.trainer.export_weights()  # on the trainer's device; cast as it is sent
    metrics: dict[str, float] = {}
    if run.side.session is None:
        buffer = packed_bytes(fleet.sync_bucket_bytes, meta)
        follow_sync(stream, fleet.transport, _rank(), dtype, buffer)
    else:
        stats = run.side.session.fleet.update_weights(
            stream, bucket_bytes=fleet.sync_bucket_bytes, meta=meta
        )
        metrics = {"sync/bytes": float(stats.bytes), "sync/seconds": stats.seconds}
    return {**metrics, **(verify_refit(run) if verify else {})}


def train_and_sync(run: Run, records: list[TrajectoryRecord], timer: Any) -> dict[str, float]:
    """The `train` then `sync` phases. With colocated engines (`fleet.colocate`) the GPUs
    change hands around them, and nothing is taken before the other side has let it go:
    engines sleep -> the trainer takes back its optimizer state and gradient buffers ->
    train -> the trainer offloads its optimizer state and frees its gradients and cached
    activations -> engines wake their weights -> sync (the trainer's bf16 weights and its
    staging buffer beside the engines' weights) -> engines wake their KV cache -> probe.
    `launch.layout.colocated_memory_gib` sizes each of these phases."""
    fleet = _fleet(run.side)
    colocate = run.cfg.fleet.colocate
    metrics: dict[str, float] = {}
    if colocate:
        if fleet is not None:
            fleet.sleep()
        _barrier()  # no rank allocates before every engine has let its GPU go
        run.trainer.reclaim_memory()
    with timer.time("train"):
        metrics.update(train(run, records))
    if colocate:
        run.trainer.release_memory()
        _barrier()  # no engine takes memory back before every rank has given it
        if fleet is not None:
            fleet.wake(["weights"])
    if run.ahead is not None:  # the engines finish the next update's episodes first
        with timer.time("ahead_wait"):
            run.ahead.exception()
    with timer.time("sync"):
        metrics.update(sync(run, verify=not colocate))
    if colocate:
        _barrier()  # every rank's staging buffer is released
        if fleet is not None:
            fleet.wake(["kv_cache"])
        metrics.update(verify_refit(run))  # the probe needs the engines' KV cache
    return metrics


def _fleet(side: Any) -> Any:
    """The fleet a rank's rollout side drives (None on ranks other than 0)."""
    return side.session.fleet if side.session is not None else None


def build_beside_engines(side: Any, build: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """The colocated start: the engines have started and sized their share of each GPU;
    they sleep, `build()` makes the trainer (and resumes it) on the freed memory, the
    trainer gives back its gradient buffers and optimizer state until it trains, and the
    engines wake. Returns `build()`'s (trainer, resumed checkpoint or None)."""
    fleet = _fleet(side)
    if fleet is not None:
        fleet.sleep()
    _barrier()  # no rank allocates before every engine has let its GPU go
    trainer, resumed = build()
    trainer.release_memory()
    _barrier()  # no engine takes memory back before every rank has given it
    if fleet is not None:
        fleet.wake()
    return trainer, resumed


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def verify_refit(run: Run) -> dict[str, float]:
    """The trainer and every engine score the probe; `RefitError` (on every rank) if an
    engine's weights differ from the trainer's."""
    from megatron_seed.rollout.refit import RefitError, check_refit

    if run.probe is None:
        return {}
    with run.trainer.without_fp8():  # the engines run bf16: compare like with like
        reference = run.trainer.score(run.probe)[0, :-1].tolist()  # a collective
    verdict: str | dict[str, float] = {}
    if run.side.session is not None:
        ids = run.probe.input_ids[0].tolist()
        per_engine = [p[0] for p in run.side.session.fleet.prompt_logprobs_per_engine([ids])]
        fleet = run.cfg.fleet
        tol = (
            fleet.refit_max_gap_bf16
            if run.trainer.precision == "bf16"
            else fleet.refit_max_gap_fp32
        )
        try:
            verdict = check_refit(reference, per_engine, tol)
        except RefitError as err:
            verdict = str(err)
    verdict = _broadcast(verdict)
    if isinstance(verdict, str):
        raise RefitError(f"update {run.step}: {verdict}")
    return verdict


def rollout(
    run: Run, step: int | None = None, position: int | None = None, version: int | None = None
) -> tuple[list[TrajectoryRecord] | None, dict[str, float]]:
    """B tasks x N episodes with theta_old (rank 0; None elsewhere), for update `step` from
    data position `position` (default: the trainer's; one-step-off plays the next ones)
    with the engines' weights of trainer step `version` (default: the trainer's now)."""
    side = run.side
    if side.session is None:
        return None, {}
    cfg = run.cfg
    step = run.step if step is None else step
    position = run.trainer.state.data_position if position is None else position
    games = side.sampler.take(position, cfg.rollout.tasks_per_update)
    session = side.session
    if cfg.rollout.reseed_each_update:
        session.fleet.reseed(update_seed(cfg.seed, step))
    skills = run.job.skill_library if cfg.skill.rollout_skill else None
    tasks = session.tasks(games, skills)
    metrics: dict[str, float] = {}
    if cfg.rollout.overlap:
        records, stats, results, timing = session.play_overlapped(
            tasks, cfg.rollout.group_size, session.sampling(), step, _analysis_plan(run)
        )
        metrics.update(timing.metrics())
        if _analyzes(cfg):
            metrics.update(_overlapped_analysis(records, results))
    else:
        records, stats = session.play(
            tasks, cfg.rollout.group_size, session.sampling(), update=step
        )
    if cfg.rollout.one_step_off:
        version = run.step if version is None else version
        for record in records:  # the trainer step whose weights played it
            record.meta["policy_version"] = version
    metrics.update(rollout_metrics(records))
    metrics.update({f"rollout/{k}": float(v) for k, v in dataclasses.asdict(stats).items()})
    return records, metrics


def _analyzes(cfg: SeedConfig) -> bool:
    """Whether the policy's own analyzer makes this update's teacher skills."""
    return cfg.algo.use_opd and cfg.skill.teacher_source == "analyzer"


def _analysis_plan(run: Run) -> Any:
    """What `rollout.overlap` needs to analyse episodes as they end (None: no analyzer)."""
    from megatron_seed.rollout.overlap import AnalysisPlan

    cfg = run.cfg
    if not _analyzes(cfg):
        return None
    return AnalysisPlan(run.tokenizer, cfg.skill, run.side.session.analyzer_prompt_limit())


def _overlapped_analysis(records: list[TrajectoryRecord], results: list[Any]) -> dict[str, float]:
    """Fold the analyses the overlapped rollout made into their records; their metrics."""
    from megatron_seed.rollout.analyzer import apply_analysis

    chosen = [records[r.index] for r in results]
    metrics = apply_analysis(chosen, results)
    trainable = sum(r.status.trainable and bool(r.turns) for r in records)
    metrics["analyze/selected_share"] = len(chosen) / max(1, trainable)
    return metrics


def update_seed(seed: int, step: int) -> int:
    """The engines' sampling seed for update `step` (engine e draws from it + e)."""
    return seed * 1_000_003 + step * 1_009


def analyze(run: Run, records: list[TrajectoryRecord] | None) -> dict[str, float]:
    """Hindsight skills from the same fleet weights, or a fixed source's (`library_skills`)."""
    if records is None:
        return {}
    source = run.cfg.skill.teacher_source
    if source != "analyzer":
        assert run.job.skill_library is not None  # check_job
        return library_skills(records, run.job.skill_library, source)
    from megatron_seed.rollout.analyzer import analyze_records

    session = run.side.session
    return analyze_records(
        session.fleet,
        run.tokenizer,
        records,
        run.cfg.skill,
        max_prompt_tokens=session.analyzer_prompt_limit(),
    )


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


def train(run: Run, records: list[TrajectoryRecord]) -> dict[str, float]:
    """One SEED update of the trainer on this update's records."""
    from megatron_seed.train.batch import build_policy_batch

    cfg = run.cfg
    pb = build_policy_batch(
        records,
        run.tokenizer,
        cfg.skill.insert_at,
        cfg.algo.use_opd,
        cfg.algo.adv_eps,
        pad_to_multiple_of=run.trainer.seq_multiple,
    )
    if cfg.algo.replay_weight:
        step = run.trainer.train_step(pb, replay_batch(run))
    else:
        step = run.trainer.train_step(pb)
    metrics = {f"train/{k}": v for k, v in step.items()}
    run.trainer.state.data_position += cfg.rollout.tasks_per_update
    return metrics


def replay_batch(run: Run) -> Any:
    """This update's analyzer-replay examples: `algo.replay_examples` accepted Stage-1
    records drawn by (seed, update), as SFT sequences (loss on the answer tokens), the same
    on every rank."""
    from megatron_seed.data import collate
    from megatron_seed.pipeline.stage1 import sft_sequence

    cfg = run.cfg
    rng = random.Random(update_seed(cfg.seed, run.step))
    pool = run.replay_pool
    picked = rng.sample(pool, min(cfg.algo.replay_examples, len(pool)))
    seqs = [
        sft_sequence(run.tokenizer, r, cfg.skill.analyzer_layout, cfg.skill.min_words)
        for r in picked
    ]
    pad = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
    return collate(seqs, pad, run.trainer.seq_multiple)


def evaluate(run: Run) -> dict[str, float]:
    """Greedy episodes on the evaluation games, no skill: success overall and per family."""
    session = run.side.session
    if session is None:
        return {}
    records, _ = session.play(session.tasks(run.job.eval_games), 1, session.sampling(True), -1)
    out = rollout_metrics(records, "evaluate")
    for fam, rate in summarize(records)["per_family"].items():
        out[f"evaluate/success_{fam}"] = rate
    return out


def checkpoint(run: Run) -> None:
    """Save weights, optimizer, step, data position and RNG (a collective)."""
    from megatron_seed.train.checkpoint import save_checkpoint

    root = Path(run.job.out_dir) / "checkpoints"
    save_checkpoint(run.trainer, root, run.hf_config, run.job.model_dir)


# ----------------------------------------------------------------------------- driver


def update(run: Run) -> dict[str, Any]:
    """One Stage-2 update, phase by phase; returns its metrics."""
    cfg, timer, metrics = run.cfg, PhaseTimer(), {}
    if run.need_sync:  # fresh engines start from model_dir; a resumed or shared fleet not
        with timer.time("sync"):
            metrics.update(sync(run))
    if run.ahead is not None:  # played and analysed while the last update trained
        with timer.time("rollout"):  # what is left of it to wait for (usually nothing)
            records, m = run.ahead.result()
        run.ahead = None
        metrics.update(m)
    else:
        busy = _busy(run)
        records, m = play_and_analyze(run, timer)
        metrics.update(m)
        metrics.update(_accounting(busy, _busy(run), timer))
    if cfg.rollout.one_step_off:
        with timer.time("staleness"):
            metrics.update(staleness(run, records))
    if records is not None:
        path = Path(run.job.out_dir) / "trajectories" / f"update_{run.step:05d}.jsonl"
        write_jsonl(records, path)
    records = _broadcast(records)
    run.ahead = _play_ahead(run)
    metrics.update(train_and_sync(run, records, timer))
    run.need_sync = False
    if run.job.eval_every and run.step % run.job.eval_every == 0:
        with timer.time("evaluate"):
            metrics.update(evaluate(run))
    if cfg.save_every and run.step % cfg.save_every == 0:
        with timer.time("checkpoint"):
            checkpoint(run)
    metrics.update(timer.metrics())
    return metrics


def play_and_analyze(
    run: Run,
    timer: PhaseTimer,
    step: int | None = None,
    position: int | None = None,
    version: int | None = None,
) -> tuple[list[TrajectoryRecord] | None, dict[str, float]]:
    """The `rollout` phase (see `rollout` for the arguments), then the `analyze` phase
    unless the overlapped rollout already analysed the episodes as they ended."""
    cfg = run.cfg
    with timer.time("rollout"):
        records, metrics = rollout(run, step, position, version)
    if cfg.algo.use_opd and not (cfg.rollout.overlap and _analyzes(cfg)):
        with timer.time("analyze"):
            metrics.update(analyze(run, records))
    return records, metrics


def _play_ahead(run: Run) -> Future | None:
    """One-step-off (rank 0): start the next update's rollout and analysis in a thread,
    on the weights the engines hold now (the trainer's before this update's step)."""
    cfg = run.cfg
    if not cfg.rollout.one_step_off or run.side.session is None or run.step + 1 >= cfg.updates:
        return None
    step, version = run.step + 1, run.step
    position = run.trainer.state.data_position + cfg.rollout.tasks_per_update
    if run.ahead_pool is None:
        run.ahead_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ahead")

    def play() -> tuple[list[TrajectoryRecord] | None, dict[str, float]]:
        timer = PhaseTimer()
        records, metrics = play_and_analyze(run, timer, step, position, version)
        metrics.update({f"ahead/{k}_s": v for k, v in timer.seconds.items()})
        return records, metrics

    return run.ahead_pool.submit(play)


def staleness(run: Run, records: list[TrajectoryRecord] | None) -> dict[str, float]:
    """Proposition 3's analyzer staleness for this update (a collective): the lag between
    the trainer and the weights that played and analysed `records`; with a lag, up to
    `rollout.staleness_sample` analysed trajectories are analysed again by the engines
    (which hold the trainer's weights now) and the trainer scores their action tokens
    without a skill, with the old skill and with the new one (`algo.staleness`)."""
    import copy

    from megatron_seed.algo.staleness import staleness_metrics
    from megatron_seed.data import collate
    from megatron_seed.data.sequences import build_sequences

    cfg = run.cfg
    payload = None
    if records is not None:
        lag = run.step - min(r.meta["policy_version"] for r in records)
        sample = [r for r in records if r.skill][: cfg.rollout.staleness_sample]
        fresh: list[TrajectoryRecord] = []
        if lag > 0 and sample and _analyzes(cfg):
            from megatron_seed.rollout.analyzer import analyze_records

            fresh = [copy.deepcopy(r) for r in sample]
            for r in fresh:
                r.skill, r.analysis = None, None
            session = run.side.session
            # every sampled trajectory, whatever `skill.select` picked for training
            every = dataclasses.replace(cfg.skill, select="all")
            analyze_records(
                session.fleet, run.tokenizer, fresh, every, session.analyzer_prompt_limit()
            )
        pairs = [(old, new) for old, new in zip(sample, fresh, strict=False) if new.skill]
        payload = (lag, pairs)
    lag, pairs = _broadcast(payload)
    metrics: dict[str, float] = {"staleness/lag": float(lag)}
    if lag == 0:  # the analyzer that made every skill is the synchronized one
        metrics.update({"staleness/delta_abs_mean": 0.0, "staleness/gate_abs_mean": 0.0})
        metrics["staleness/bound"] = 0.0
        return metrics
    if not pairs:
        return metrics
    insert_at = cfg.skill.insert_at
    rows = []  # per pair: (student, stale teacher, fresh teacher) sequences
    for old, new in pairs:
        for a, b in zip(
            build_sequences(old, run.tokenizer, insert_at),
            build_sequences(new, run.tokenizer, insert_at),
            strict=True,
        ):
            rows.append((a.student, a.teacher, b.teacher))
    seqs = [seq for row in rows for seq in row]
    pad = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
    batch = collate(seqs, pad, run.trainer.seq_multiple)
    logp = run.trainer.score(batch)  # [3 n, s]; position i scores labels[:, i]
    tokens = [logp[i][batch.loss_mask[i]] for i in range(len(seqs))]  # each [actions]
    student = torch.cat(tokens[0::3])
    metrics.update(
        staleness_metrics(
            student, torch.cat(tokens[1::3]), torch.cat(tokens[2::3]), cfg.algo.beta_opd
        )
    )
    metrics["staleness/trajectories"] = float(len(pairs))
    return metrics


def _busy(run: Run) -> dict[str, Any] | None:
    """Busy and CPU seconds of every engine and env worker, and the machine's, so far
    (rank 0; None elsewhere, or when the fleet or pool keeps no count)."""
    session = run.side.session
    if session is None or not hasattr(session.pool, "usage"):
        return None
    return session.usage()


def _accounting(before: Any, after: Any, timer: Any) -> dict[str, float]:
    """Over this update's rollout and analysis: busy, idle and CPU seconds of each engine
    and env worker (a worker replaced meanwhile has no count: left out), and the share of
    rank 0's machine's CPU time that was idle."""
    if before is None or after is None:
        return {}
    window = sum(timer.seconds.get(p, 0.0) for p in ("rollout", "analyze"))
    out: dict[str, float] = {}
    for kind in ("engine", "env"):
        for i, (b, a) in enumerate(zip(before[kind], after[kind], strict=False)):
            if b is None or a is None or a["busy_s"] < b["busy_s"] or a["cpu_s"] < b["cpu_s"]:
                continue
            busy = a["busy_s"] - b["busy_s"]
            out[f"busy/{kind}{i}_s"] = busy
            out[f"idle/{kind}{i}_s"] = max(0.0, window - busy)
            out[f"cpu/{kind}{i}_s"] = a["cpu_s"] - b["cpu_s"]
    busy, idle = (after["machine"][k] - before["machine"][k] for k in ("busy_s", "idle_s"))
    out["cpu/machine_busy_s"] = busy
    out["cpu/machine_idle_share"] = idle / (busy + idle) if busy + idle > 0 else 0.0
    return out


def run_stage2(job: Stage2Job, fleet: Any = None, pool: Any = None) -> list[dict[str, Any]]:
    """The Stage-2 loop on this rank; returns the metrics rows written (rank 0) or [].

    SIGTERM (what Slurm sends before it kills a preempted or timed-out job) lets the current
    update finish, checkpoints at its boundary, writes OUT/preempted.json and returns: a rerun
    resumes with the next update."""
    run = _setup(job, fleet, pool)
    rows = []
    try:
        with preemption() as asked:
            while run.step < job.cfg.updates:
                metrics = update(run)
                run.side.write(run.step, metrics)
                if run.side.session is not None:
                    rows.append({"step": run.step, **metrics})
                if _agreed(asked()):
                    _preempt(run)
                    return rows
        _export_final(run.trainer, Path(job.out_dir) / "final_hf", run.hf_config, job.model_dir)
    finally:
        if run.ahead_pool is not None:
            run.ahead_pool.shutdown(wait=True, cancel_futures=True)
        run.side.close()
    return rows


PREEMPTED = "preempted.json"


@contextlib.contextmanager
def preemption() -> Any:
    """Record SIGTERM instead of dying of it (main thread only); yields `asked() -> bool`."""
    box = {"asked": False}

    def handler(signum: int, frame: Any) -> None:
        box["asked"] = True
        print("SIGTERM: finishing this update, then a checkpoint", flush=True)

    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield lambda: box["asked"]
    finally:
        signal.signal(signal.SIGTERM, old)


def _agreed(asked: bool) -> bool:
    """Whether any rank was asked to stop (every rank then stops at the same boundary)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return asked
    flag = torch.tensor([float(asked)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _preempt(run: Run) -> None:
    """Checkpoint at this update boundary (unless this update saved one) and leave a note."""
    cfg = run.cfg
    if not (cfg.save_every and run.step % cfg.save_every == 0):
        checkpoint(run)
    if _rank() == 0:
        note = {"step": run.step, "updates": cfg.updates}
        (Path(run.job.out_dir) / PREEMPTED).write_text(json.dumps(note) + "\n")
        print(f"preempted after update {run.step}: checkpoint saved; rerun to resume", flush=True)


def _setup(job: Stage2Job, fleet: Any, pool: Any) -> Run:
    """Trainer (resumed from the latest checkpoint), tokenizer and this rank's rollout side."""
    from transformers import AutoTokenizer

    from megatron_seed.hosts import node_name
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.checkpoint import latest_checkpoint, load_checkpoint
    from megatron_seed.train.trainer import SeedTrainer

    cfg, out = job.cfg, Path(job.out_dir)
    check_job(job)
    replay_pool = _replay_pool(job)
    init_parallel(cfg.parallel.tp, cfg.parallel.pp, cfg.seed, cfg.parallel.device)
    where = f"trainer rank {_rank()}/{dist.get_world_size()} on node {node_name()}"
    print(where, flush=True)
    if _rank() == 0:
        (out / PREEMPTED).unlink(missing_ok=True)  # this run resumes it
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    check_chat_template(tokenizer)  # the checkpoint's chat format, before any compute

    def rollout_side() -> RolloutSide | NoRollout:
        return RolloutSide(job, tokenizer, fleet, pool) if _rank() == 0 else NoRollout()

    def build() -> tuple[SeedTrainer, Path | None]:
        trainer = SeedTrainer(cfg, job.model_dir)
        resumed = latest_checkpoint(out / "checkpoints")
        if resumed is not None:
            load_checkpoint(trainer, resumed)
        return trainer, resumed

    start = time.perf_counter()
    if cfg.fleet.colocate:  # engines size their GPU share before the trainer allocates
        side = rollout_side()
        trainer, resumed = build_beside_engines(side, build)
    else:
        trainer, resumed = build()
    took = time.perf_counter() - start
    print(
        f"{where}: trainer built in {took:.1f} s" + (f", resumed {resumed}" if resumed else ""),
        flush=True,
    )
    if not cfg.fleet.colocate:
        side = rollout_side()
    if isinstance(side, RolloutSide):
        side.log.truncate_after(trainer.state.step)
        (out / "trajectories").mkdir(parents=True, exist_ok=True)
        cfg.save(out / "config.json")
    hf_config = json.loads((Path(job.model_dir) / "config.json").read_text())
    need_sync = resumed is not None or job.fleet_address is not None
    return Run(
        job,
        trainer,
        tokenizer,
        side,
        hf_config,
        need_sync,
        _probe(cfg, tokenizer, trainer.seq_multiple),
        replay_pool,
    )


def _replay_pool(job: Stage2Job) -> list[TrajectoryRecord]:
    """The accepted Stage-1 records analyzer replay draws from ([] when it is off)."""
    if not job.cfg.algo.replay_weight:
        return []
    from megatron_seed.data import read_jsonl

    pool = [r for r in read_jsonl(job.replay_data) if r.has_teacher]
    if not pool:
        raise ValueError(f"{job.replay_data} holds no accepted skill for analyzer replay")
    return pool


def _probe(cfg: SeedConfig, tokenizer: Any, block: int) -> Any:
    """The fixed refit probe ([1, n] TokenBatch), or None when the probe is off."""
    from megatron_seed.data import TokenSequence, collate
    from megatron_seed.rollout.refit import probe_ids

    n = cfg.fleet.refit_probe_tokens
    if not n:
        return None
    n = -(-n // block) * block  # the trainer scores whole blocks (`SeedTrainer.seq_multiple`)
    ids = probe_ids(len(tokenizer), set(tokenizer.all_special_ids), n, cfg.seed)
    return collate([TokenSequence(ids, [False] * n, [0.0] * n, [0] * n)], 0)


def _export_final(trainer: Any, path: Path, hf_config: dict, tokenizer_dir: str) -> None:
    """The trained policy as a HF folder (for evaluation and serving); a collective."""
    from megatron_seed.models.convert import save_hf_checkpoint

    stream = trainer.export_weights()
    if _rank() == 0:
        save_hf_checkpoint(stream, path, hf_config, tokenizer_from=tokenizer_dir)
    else:
        for _ in stream:
            pass


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
