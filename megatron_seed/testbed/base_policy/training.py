"""Behaviour cloning of the tiny base policy: tokenizer, random tiny Qwen2, masked NLL with
the project's Megatron trainer (`SeedTrainer.nll_step`)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs.spec import get_env
from megatron_seed.data.sequences import TokenSequence
from megatron_seed.testbed.base_policy.demos import (
    _retokenize,
    analysis_records,
    corpus,
    demo_sequences,
    user_messages,
)
from megatron_seed.testbed.base_policy.settings import (
    MODEL_SUBDIR,
    TOKENIZER_SUBDIR,
    BasePolicySettings,
)


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
    from megatron_seed.models.convert import save_hf_checkpoint
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.trainer import SeedTrainer

    s = BasePolicySettings(**settings)
    with open(data_path, "rb") as f:
        data = pickle.load(f)
    sequences: list[TokenSequence] = data["sequences"]
    init_parallel(1, 1, seed=s.seed + 1)
    torch.manual_seed(s.seed)
    optim = OptimConfig(lr=s.lr, clip_grad=1.0, micro_batch_size=s.batch_size)
    # whole-sequence logits: the tiny vocabulary's are small, and chunking them would change
    # float rounding, hence the measured base policy (as in the default job's recipe)
    cfg = SeedConfig(parallel=ParallelConfig(precision="fp32", logit_chunk_tokens=0), optim=optim)
    trainer = SeedTrainer(cfg, init_dir)
    rng = random.Random(f"batches:{s.seed}")
    plan = length_batches([len(q) for q in sequences], s.batch_size, s.train_steps, rng)
    losses: list[float] = []
    start = time.perf_counter()
    bar = tqdm(plan, desc="behaviour cloning", disable=not progress, leave=False)
    for step, rows in enumerate(bar):
        trainer.set_lr(lr_at(step, s))
        batch = collate([sequences[i] for i in rows], data["pad_id"], trainer.seq_multiple)
        metrics = trainer.nll_step(batch)
        losses.append(metrics["nll"])
        bar.set_postfix(nll=f"{metrics['nll']:.3f}")
    seconds = time.perf_counter() - start
    hf_config = json.loads((Path(init_dir) / "config.json").read_text())
    weights = trainer.export_weights(dtype=torch.float32)
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
    demos: Sequence[Any],
    settings: BasePolicySettings,
    work: Path,
    progress: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Tokenizer + random tiny Qwen2 + behaviour cloning; returns (HF model dir, stats)."""
    import pickle

    from megatron_seed.models.parallel import spawn
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import build_tokenizer
    from megatron_seed.pipeline.stage1 import answer_text, sft_sequence
    from megatron_seed.skills.prompt import analyzer_messages

    env = get_env(settings.env)
    tok_dir = work / TOKENIZER_SUBDIR
    texts = list(corpus(demos, settings.rendering, env))
    analyzed = analysis_records(demos, settings)
    layout = settings.analyzer_layout
    for r in analyzed:
        texts += [m["content"] for m in analyzer_messages(r, layout)]  # type: ignore[arg-type]
        texts.append(answer_text(r.analysis.summary if r.analysis else None, r.skill or ""))
    tokenizer = build_tokenizer(texts, settings.vocab_size, tok_dir)
    analyzed = [_retokenize(r, tokenizer) for r in analyzed]
    sequences = [q for d in demos for q in demo_sequences(d, tokenizer, settings.rendering, env)]
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
    probe = user_messages(demos[0], settings.rendering, env)[0]
    _check_model_tokenizer(model_dir, tokenizer, probe)
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
