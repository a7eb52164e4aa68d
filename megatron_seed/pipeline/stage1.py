"""Stage 1 of SEED: offline collection and hindsight-skill SFT (paper Sec. 3.2).

    collect   K0 rollouts per task with the base policy (no skill in context) -> JSONL
    annotate  an analyzer (external endpoint, or the embedded one) writes s_tau per
              trajectory; badly formatted skills are dropped (`seed annotate`)
    sft       NLL on the analyzer's answer tokens only, given x_tau (`seed sft`); the
              result theta_sft initialises both the actor and the analyzer of Stage 2

The SFT prompt is the analyzer request of the layout Stage 2 uses (`SkillConfig.
analyzer_layout`), built by the same code (`data.requests.request_ids`), and the target
is the JSON answer the analyzer must produce, so Stage 1 trains exactly what Stage 2 asks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from megatron_seed.config import SeedConfig
from megatron_seed.data import TokenSequence, TrajectoryRecord, check_chat_template, collate
from megatron_seed.data.requests import request_ids
from megatron_seed.files import write_json


def answer_text(summary: str | None, skill: str) -> str:
    """The analyzer's answer, in the format its parser reads."""
    return json.dumps({"summary": summary or "", "skill": skill})


def sft_sequence(
    tokenizer: Any, record: TrajectoryRecord, layout: str, min_words: int = 5
) -> TokenSequence:
    """x_tau (the analyzer request for `record`) + s_tau (its answer) with loss on s_tau."""
    from megatron_seed.skills.parse import build_requests

    if not record.has_teacher:
        raise ValueError(f"record {record.task_id!r} has no accepted skill")
    (request,) = build_requests([record], layout, min_words)
    prompt = request_ids(tokenizer, request)
    summary = record.analysis.summary if record.analysis else None
    answer = tokenizer.encode(answer_text(summary, record.skill), add_special_tokens=False)
    answer.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    n = len(prompt)
    return TokenSequence(
        input_ids=prompt + answer,
        action_mask=[False] * n + [True] * len(answer),
        logprobs=[0.0] * (n + len(answer)),
        turn_index=[-1] * n + [0] * len(answer),
    )


def _sft_worker(
    model_dir: str, records: list[TrajectoryRecord], out_dir: str, cfg: SeedConfig
) -> dict:
    """One rank of SFT: epochs of shuffled mini-batches, then Megatron + HF checkpoints."""
    from transformers import AutoTokenizer

    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.progress import LiveBar
    from megatron_seed.train.checkpoint import export_hf, save_checkpoint
    from megatron_seed.train.trainer import SeedTrainer

    init_parallel(
        cfg.parallel.tp, cfg.parallel.pp, cfg.seed, cfg.parallel.device, ep=cfg.parallel.ep
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    check_chat_template(tokenizer)  # the checkpoint's chat format, before any compute
    trainer = SeedTrainer(cfg, model_dir, reference=False)
    trainer.set_lr(cfg.sft_lr)
    seqs = [
        sft_sequence(tokenizer, r, cfg.skill.analyzer_layout, cfg.skill.min_words) for r in records
    ]
    rng = random.Random(cfg.seed)
    pad = tokenizer.pad_token_id or 0
    curve = []
    steps = cfg.sft_epochs * -(-len(seqs) // cfg.sft_batch_size)
    with LiveBar(steps, "stage 1: sft") as bar:
        for epoch in range(cfg.sft_epochs):
            order = list(range(len(seqs)))
            rng.shuffle(order)
            for start in range(0, len(order), cfg.sft_batch_size):
                rows = [seqs[i] for i in order[start : start + cfg.sft_batch_size]]
                batch = collate(rows, pad, trainer.seq_multiple)
                m = trainer.nll_step(batch)
                curve.append({"epoch": epoch, "nll": m["nll"], "tokens": m["tokens"]})
                bar.update()
    hf_config = json.loads((Path(model_dir) / "config.json").read_text())
    out = Path(out_dir)
    save_checkpoint(trainer, out / "megatron", hf_config, model_dir)
    export_hf(trainer, out / "hf", hf_config, model_dir)
    return {"curve": curve, "examples": len(seqs)}


def run_sft(
    model_dir: str | Path,
    records: list[TrajectoryRecord],
    out_dir: str | Path,
    cfg: SeedConfig,
    dp: int = 1,
) -> dict:
    """Fine-tune on the accepted (x_tau, s_tau) pairs; writes OUT/hf (theta_sft) and
    OUT/megatron, and returns the loss curve."""
    from megatron_seed.models.parallel import spawn

    accepted = [r for r in records if r.has_teacher]
    if not accepted:
        raise ValueError("no accepted skills to fine-tune on")
    world = cfg.parallel.tp * cfg.parallel.pp * dp
    result = spawn(_sft_worker, world, str(model_dir), accepted, str(out_dir), cfg)[0]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(out_dir) / "sft_curve.json", result)
    return result


def collect(
    model_dir: str | Path,
    games: list[str],
    out_path: str | Path,
    cfg: SeedConfig,
    chunk_tasks: int = 8,
    progress: bool = True,
    fleet: Any = None,
) -> list[TrajectoryRecord]:
    """`cfg.collect_rollouts_per_task` (K0) rollouts of the base policy on each game, without
    skills, appended to a JSONL file chunk by chunk; a rerun skips the games already
    collected (needs Ray). The fleet and env workers are `cfg.fleet` and `cfg.env`.

    ``fleet``: a running `Fleet` to use (it is given ``model_dir``'s weights and left
    running) instead of starting one."""
    from megatron_seed.data import read_jsonl
    from megatron_seed.progress import LiveBar
    from megatron_seed.rollout.session import RolloutSession

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = list(read_jsonl(out)) if out.is_file() else []
    finished = {r.game for r in done}
    todo = [g for g in games if str(g) not in finished]
    if not todo:
        return done
    if fleet is not None:
        fleet.load_model(model_dir)
    with (
        RolloutSession(cfg, model_dir, fleet=fleet) as session,
        LiveBar(len(todo), "stage 1: collect", enabled=progress) as bar,
    ):
        for start in range(0, len(todo), chunk_tasks):
            tasks = session.tasks([str(g) for g in todo[start : start + chunk_tasks]])
            spec = session.sampling()
            records = session.play(tasks, cfg.collect_rollouts_per_task, spec, update=0).records
            with out.open("a") as f:
                for rec in records:
                    f.write(rec.to_json() + "\n")
            done.extend(records)
            bar.update(len(tasks))
    return done


def annotate_oracle(
    records: list[TrajectoryRecord], cfg: SeedConfig
) -> tuple[list[TrajectoryRecord], dict]:
    """Skills from the environment's oracle analyzer (offline), validated by the fleet's own
    rules."""
    from envs.spec import get_env
    from megatron_seed.skills.oracle import oracle_analyzer
    from megatron_seed.skills.parse import analysis_metrics, analyze_with_retries, apply_results

    analyzer = oracle_analyzer(get_env(cfg.env.name))
    usable = [r for r in records if r.trainable]
    results = analyze_with_retries(analyzer, usable, cfg.skill)
    return apply_results(usable, results), analysis_metrics(results)
