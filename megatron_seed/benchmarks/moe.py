"""`seed bench moe`: one SEED update of a small Qwen3-MoE against a dense Qwen3 of the same
active parameters, on the CPU.

The MoE model has `E` experts of width `F`, `k` per token; the dense model is the same
network with one MLP of width `k x F` per layer, so a token runs through the same number of
parameters in both (the MoE model adds only its router, h x E per layer). Both trainers live
in one process and train on the same batch (synthetic SEED records), alternately, after one
warm-up update each (Adam's state exists); the medians of the timed updates and their ratio
are printed and written. What the ratio measures on a CPU: the routing, the all-to-all
dispatcher's permutations and the one-expert-at-a-time `SequentialMLP` against one dense
GEMM per projection.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from megatron_seed.files import write_json

# hidden, heads (head_dim 64), layers, experts, top-k, expert width
SHAPE = {"hidden": 512, "heads": 8, "layers": 4, "experts": 16, "top_k": 2, "expert_ffn": 512}


def write_models(work: Path, tokenizer: Any, shape: dict[str, int]) -> dict[str, Path]:
    """The MoE model and its dense twin (same seed-independent sizes), with the tokenizer."""
    from megatron_seed.models.tiny import make_tiny_policy

    common = dict(
        hidden_size=shape["hidden"], heads=shape["heads"], kv_heads=shape["heads"] // 2,
        layers=shape["layers"], head_dim=shape["hidden"] // shape["heads"],
        max_position_embeddings=8192,
    )  # fmt: skip
    moe = make_tiny_policy(
        work / "moe", tokenizer, model_type="qwen3_moe", num_experts=shape["experts"],
        num_experts_per_tok=shape["top_k"], moe_intermediate_size=shape["expert_ffn"],
        **common,
    )  # fmt: skip
    dense = make_tiny_policy(
        work / "dense", tokenizer, model_type="qwen3",
        intermediate_size=shape["top_k"] * shape["expert_ffn"], **common,
    )  # fmt: skip
    return {"moe": moe, "dense": dense}


def _worker(models: dict[str, str], rounds: int) -> dict:
    """Spawned: both trainers, one warm-up update each, then `rounds` alternating updates."""
    from transformers import AutoTokenizer

    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.config import AlgoConfig, OptimConfig, SeedConfig
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.batch import build_policy_batch
    from megatron_seed.train.trainer import SeedTrainer

    init_parallel(1, 1)
    cfg = SeedConfig(
        algo=AlgoConfig(teacher_mode="live"),
        optim=OptimConfig(lr=1e-5, mini_batches_per_update=1, micro_batch_size=4),
    )
    tok = AutoTokenizer.from_pretrained(models["moe"])
    records = synthetic_records(tok, groups=2, group_size=4, turns=6, valid_skill_every=2)
    batch = build_policy_batch(records, tok)
    trainers = {name: SeedTrainer(cfg, path) for name, path in models.items()}
    params = {}
    for name, trainer in trainers.items():
        params[name] = {"total": trainer.spec.num_params, "active": trainer.spec.active_params}
        trainer.train_step(batch)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(rounds):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            trainer.train_step(batch)
            times[name].append(time.perf_counter() - start)
    tokens = int(batch.student.loss_mask.sum())
    return {"times_s": times, "params": params, "scored_tokens": tokens}


def run_moe(out: Path, rounds: int, work: Path) -> dict:
    """Write the two models, time them, print and write the result."""
    from megatron_seed.benchmarks.synthetic import _WORDS
    from megatron_seed.models.parallel import spawn
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    tokenizer = build_tokenizer([" ".join(_WORDS)] * 20, 2048)
    models = write_models(work, tokenizer, SHAPE)
    raw = spawn(_worker, 1, {k: str(v) for k, v in models.items()}, rounds)[0]
    median = {name: statistics.median(t) for name, t in raw["times_s"].items()}
    result = {
        "shape": SHAPE,
        "rounds": rounds,
        "scored_tokens": raw["scored_tokens"],
        "params": raw["params"],
        "update_s": raw["times_s"],
        "median_update_s": median,
        "moe_over_dense": median["moe"] / median["dense"],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    for name in ("dense", "moe"):
        p = raw["params"][name]
        print(
            f"{name:>5}: {p['total'] / 1e6:6.2f}M parameters, {p['active'] / 1e6:6.2f}M active; "
            f"one SEED update {median[name]:.3f} s (median of {rounds})"
        )
    print(f"MoE / dense update time: {result['moe_over_dense']:.2f}x; wrote {out}")
    return result
