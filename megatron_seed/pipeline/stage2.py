"""Stage 2 of SEED: self-evolving on-policy distillation (the paper's Algorithm 1).

Every trainer rank runs `run_stage2` with the same code; its role (`pipeline.roles`) is the
`Leader` on rank 0 (the vLLM fleet and the env workers) and a `Follower` elsewhere, which
receives each update's trajectories from rank 0. One update, as named phases (each timed
as `time/<phase>`, its metrics under `<phase>/`):

    sync      theta_old := theta; stream the trainer's weights into every engine; the
              trainer and every engine score a fixed probe (`rollout.refit`): an engine
              whose weights differ fails the update, naming the engine
    rollout   B tasks x N episodes with theta_old (the fleet) against the env workers
    analyze   the same fleet turns each finished episode into a hindsight skill s (or,
              for the baselines, each takes its game's fixed skill: `roles.library_skills`)
    train     old/ref/teacher log-probs, SEED loss, Adam step (`SeedTrainer.train_step`)
    evaluate  (every `eval_every` updates) episodes without skills on fixed games and draws
    checkpoint (every `save_every` updates)

Beside the driver: `one_step_off` (the next update plays while this one trains),
`colocation` (the GPU hand-over), `accounting` (busy and idle seconds), `preemption`.
Metrics go to OUT/metrics.jsonl (+ TensorBoard), trajectories to OUT/trajectories/, and
checkpoints to OUT/checkpoints/; a killed run resumes from the latest complete checkpoint
(weights, optimizer, step, data position, RNG).
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from megatron_seed import provenance
from megatron_seed.config import SeedConfig
from megatron_seed.data import TokenSequence, TrajectoryRecord, check_chat_template, collate
from megatron_seed.hosts import node_name
from megatron_seed.models.parallel import init_parallel
from megatron_seed.pipeline.accounting import accounting
from megatron_seed.pipeline.collective import broadcast, broadcast_or_raise, rank
from megatron_seed.pipeline.colocation import build_beside_engines, kv_cache_back, trainer_turn
from megatron_seed.pipeline.job import Stage2Job, check_job
from megatron_seed.pipeline.metrics import PhaseTimer
from megatron_seed.pipeline.one_step_off import play_ahead, staleness
from megatron_seed.pipeline.preemption import preemption
from megatron_seed.pipeline.replay import replay_batch, replay_pool
from megatron_seed.pipeline.roles import Follower, Leader, Slot
from megatron_seed.pipeline.routes import engine_routes, probe_on_engine_routes
from megatron_seed.pipeline.run_state import Run
from megatron_seed.rollout.refit import RefitError, probe_ids
from megatron_seed.train.batch import (
    PolicyBatch,
    build_policy_batch,
    outcome_signal,
    permute_advantages,
)
from megatron_seed.train.checkpoint import (
    export_hf,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from megatron_seed.train.trainer import SeedTrainer

# ----------------------------------------------------------------------------- phases


def sync(run: Run, verify: bool = True) -> dict[str, float]:
    """Stream theta into every engine through vLLM's weight-transfer API (a collective over
    trainer ranks), in the engines' dtype, then (`verify`) check the refit on the probe."""
    from megatron_seed.rollout.session import fleet_dtype
    from megatron_seed.rollout.transfer import export_meta  # imports vLLM (~10 s)

    dtype = getattr(torch, fleet_dtype(run.cfg))
    meta = export_meta(run.trainer.spec, dtype)
    stream = run.trainer.export_weights()  # on the trainer's device; cast as it is sent
    metrics = run.side.send_weights(stream, meta, dtype, run.cfg.fleet)
    return {**metrics, **(verify_refit(run) if verify else {})}


def train_and_sync(run: Run, records: list[TrajectoryRecord], timer: Any) -> dict[str, float]:
    """The `train` then `sync` phases; with colocated engines (`fleet.colocate`) the GPUs
    change hands around them (`pipeline.colocation`)."""
    colocate = run.cfg.fleet.colocate
    metrics: dict[str, float] = outcome_signal(records)
    pb = policy_batch(run, records, timer)  # engines still hold the weights that played
    handover = trainer_turn(run.side, run.trainer) if colocate else contextlib.nullcontext()
    with handover, timer.time("train"):
        metrics.update(train(run, pb))
    if run.ahead is not None:  # the engines finish the next update's episodes first
        with timer.time("ahead_wait"):
            run.ahead.exception()
    with timer.time("sync"):
        metrics.update(sync(run, verify=not colocate))
    if colocate:
        kv_cache_back(run.side)
        metrics.update(verify_refit(run))  # the probe needs the engines' KV cache
    return metrics


def verify_refit(run: Run) -> dict[str, float]:
    """The trainer and every engine score the probe; `RefitError` (on every rank) if an
    engine's weights differ from the trainer's. A mixture of experts is scored once per
    engine on that engine's routes (`probe_on_engine_routes`): a gap measures the weights,
    not routers that broke a near tie the other way (flips compound over layers)."""
    if run.probe is None:
        return {}
    ids = run.probe.input_ids[0].tolist()
    moe = run.trainer.spec.is_moe
    probe = probe_on_engine_routes(run.side, run.probe, run.step) if moe else run.probe
    with run.trainer.without_fp8(), run.trainer.replaying_routes():  # engines run bf16
        scored = run.trainer.score(probe)[:, :-1].tolist()  # a collective; [rows, n - 1]
    reference = scored if moe else scored[0]
    verdict = run.side.refit_verdict(ids, reference, run.trainer.precision)
    return broadcast_or_raise(verdict, RefitError, f"update {run.step}")


def policy_batch(run: Run, records: list[TrajectoryRecord], timer: Any) -> PolicyBatch:
    """This update's sequences (every rank builds the same, timed with `train`), with the
    engines' routes for a mixture-of-experts model (`pipeline.routes`)."""
    cfg = run.cfg
    with timer.time("train"):
        pb = build_policy_batch(
            records,
            run.tokenizer,
            cfg.skill.insert_at,
            cfg.algo.use_opd,
            cfg.algo.adv_eps,
            pad_to_multiple_of=run.trainer.seq_multiple,
        )
        if cfg.algo.shuffle_advantages:  # the negative control: same on every rank
            pb = permute_advantages(
                pb, torch.Generator().manual_seed(cfg.seed * 100_003 + run.step)
            )
    return engine_routes(cfg, run.trainer.spec.is_moe, run.side, run.step, pb, timer)


def train(run: Run, pb: PolicyBatch) -> dict[str, float]:
    """One SEED update of the trainer on this update's batch."""
    cfg, trainer = run.cfg, run.trainer
    replay = None  # analyzer replay's Stage-1 examples
    if cfg.algo.replay_weight:
        replay = replay_batch(cfg, run.step, run.replay_pool, run.tokenizer, trainer.seq_multiple)
    metrics = {f"train/{k}": v for k, v in trainer.train_step(pb, replay).items()}
    trainer.state.data_position += cfg.rollout.tasks_per_update
    return metrics


def checkpoint(run: Run) -> None:
    """Save weights, optimizer, step, data position and RNG (a collective)."""
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
        busy = run.side.usage()
        records, m = run.side.play_and_analyze(timer, Slot.now(run.trainer.state))
        metrics.update(m)
        metrics.update(accounting(busy, run.side.usage(), timer.seconds))
    if cfg.rollout.one_step_off:
        with timer.time("staleness"):
            metrics.update(staleness(cfg, run.side, run.trainer, run.tokenizer, records))
    run.side.save_trajectories(run.step, records)
    records = broadcast(records)
    run.ahead = play_ahead(cfg, run.side, run.trainer, run.ahead_pool)
    metrics.update(train_and_sync(run, records, timer))
    run.need_sync = False
    if run.job.eval_every and run.step % run.job.eval_every == 0:
        with timer.time("evaluate"):
            metrics.update(run.side.evaluate())
    if cfg.save_every and run.step % cfg.save_every == 0:
        with timer.time("checkpoint"):
            checkpoint(run)
    metrics.update(timer.metrics())
    return metrics


def run_stage2(job: Stage2Job, fleet: Any = None, pool: Any = None) -> list[dict[str, Any]]:
    """The Stage-2 loop on this rank; returns the metrics rows written (rank 0) or [].

    SIGTERM lets the current update finish, checkpoints at its boundary, writes
    OUT/preempted.json and returns: a rerun resumes with the next update."""
    run = _setup(job, fleet, pool)
    try:
        with preemption() as asked:
            while run.step < job.cfg.updates:
                metrics = update(run)
                run.side.write(run.step, metrics)  # the step the update just made
                if asked():
                    if not (job.cfg.save_every and run.step % job.cfg.save_every == 0):
                        checkpoint(run)  # this update boundary (unless it saved one)
                    run.side.note_preempted(run.step, job.cfg.updates)
                    return run.side.rows
        export_hf(run.trainer, Path(job.out_dir) / "final_hf", run.hf_config, job.model_dir)
    finally:
        if run.ahead_pool is not None:
            run.ahead_pool.shutdown(wait=True, cancel_futures=True)
        run.side.close()
    return run.side.rows


def _setup(job: Stage2Job, fleet: Any, pool: Any) -> Run:
    """Trainer (resumed from the latest checkpoint), tokenizer and this rank's role."""
    cfg, out = job.cfg, Path(job.out_dir)
    check_job(job)
    replay = replay_pool(job)
    init_parallel(
        cfg.parallel.tp, cfg.parallel.pp, cfg.seed, cfg.parallel.device, ep=cfg.parallel.ep
    )
    where = f"trainer rank {rank()}/{dist.get_world_size()} on node {node_name()}"
    print(where, flush=True)
    provenance.record(f"trainer-rank{rank()}")  # a containerised job asks where it ran
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    check_chat_template(tokenizer)  # the checkpoint's chat format, before any compute

    def role() -> Follower:
        return Leader.open(job, tokenizer, fleet, pool) if rank() == 0 else Follower()

    def build() -> tuple[SeedTrainer, Path | None]:
        # the frozen reference exists for the KL term only (none at beta_kl = 0)
        trainer = SeedTrainer(cfg, job.model_dir, reference=cfg.algo.beta_kl != 0)
        resumed = latest_checkpoint(out / "checkpoints")
        if resumed is not None:
            load_checkpoint(trainer, resumed)
        return trainer, resumed

    start = time.perf_counter()
    if cfg.fleet.colocate:  # engines size their GPU share before the trainer allocates
        side = role()
        trainer, resumed = build_beside_engines(side, build)
    else:
        trainer, resumed = build()
    took = time.perf_counter() - start
    print(
        f"{where}: trainer built in {took:.1f} s" + (f", resumed {resumed}" if resumed else ""),
        flush=True,
    )
    if not cfg.fleet.colocate:
        side = role()
    side.start(trainer.state.step)
    hf_config = json.loads((Path(job.model_dir) / "config.json").read_text())
    need_sync = resumed is not None or job.fleet_address is not None
    probe = _probe(cfg, tokenizer, trainer.seq_multiple)
    # one-step-off: the thread the next update plays in while this one trains
    ahead = ThreadPoolExecutor(1, "ahead") if cfg.rollout.one_step_off else None
    return Run(job, trainer, tokenizer, side, hf_config, need_sync, probe, replay, None, ahead)


def _probe(cfg: SeedConfig, tokenizer: Any, block: int) -> Any:
    """The fixed refit probe ([1, n] TokenBatch), or None when the probe is off."""
    n = cfg.fleet.refit_probe_tokens
    if not n:
        return None
    n = -(-n // block) * block  # the trainer scores whole blocks (`SeedTrainer.seq_multiple`)
    ids = probe_ids(len(tokenizer), set(tokenizer.all_special_ids), n, cfg.seed)
    return collate([TokenSequence(ids, [False] * n, [0.0] * n, [0] * n)], 0)
