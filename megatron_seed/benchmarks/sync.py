"""Benchmark the rollout fleet on this machine: weight-sync cost and rollout throughput.

1. Sync: a random Qwen2 of ~60M parameters (head_dim 64) served by `--engines` vLLM engines
   in Ray actors; `--rounds` full syncs of perturbed weights via `Fleet.update_weights`
   (bucketed, one `ray.put` per bucket, every engine loads it). Reports seconds, seconds
   per 100M parameters, bytes and buckets per bucket size, and checks after the last sync
   that the engines agree with each other and differ from the original checkpoint.
2. Rollout: the tiny test model (head_dim 32), `--prompts` prompts x `--max-tokens`
   sampled tokens on the same number of engines; generated tokens per second.

Usage: seed bench sync [--engines E] [--rounds R] [--out bench/sync.json]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from megatron_seed.files import write_json
from megatron_seed.models.tiny import TINY_QWEN2, make_tiny_qwen

SYNC_MODEL = dict(  # TINY_QWEN2 widened: about 60 M parameters to stream
    TINY_QWEN2,
    vocab_size=8192,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=8,
    num_attention_heads=12,  # head_dim 64
)


def _model(root: Path, name: str, tok_dir: Path, **cfg: object) -> Path:
    out = make_tiny_qwen(root / name, seed=0, **cfg)
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)
    return out


def _perturbed(model_dir: Path, seed: int) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    from megatron_seed.models.convert import hf_names
    from megatron_seed.models.qwen import QwenSpec

    sd = load_file(str(model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    return [
        (n, sd[n] + 0.01 * torch.randn(sd[n].shape, generator=g))
        for n in hf_names(QwenSpec.from_pretrained(model_dir))
    ]


def bench_sync(model_dir: Path, args: argparse.Namespace) -> dict:
    from megatron_seed.rollout.engine import EngineSpec
    from megatron_seed.rollout.fleet import Fleet, FleetSpec

    params = sum(t.numel() for _, t in _perturbed(model_dir, 0))
    t0 = time.perf_counter()
    engine = EngineSpec(kv_cache_bytes=256 << 20, max_model_len=1024)
    fleet = Fleet(str(model_dir), FleetSpec(engines=args.engines, engine=engine))
    start_s = time.perf_counter() - t0
    probe = [list(range(3, 67))]
    base = fleet.prompt_logprobs(probe)[0]
    rows = []
    try:
        for mb in args.bucket_mb:
            for r in range(args.rounds):
                weights = _perturbed(model_dir, 100 * mb + r)  # built before timing
                stats = fleet.update_weights(iter(weights), bucket_bytes=mb << 20)
                rows.append({"bucket_mb": mb, "round": r, **stats.__dict__})
                print(f"  sync {mb} MB buckets, round {r}: {stats}", flush=True)
        per_engine = fleet.prompt_logprobs_per_engine(probe)
        agree = max(abs(a - b) for a, b in zip(per_engine[0][0], per_engine[-1][0], strict=True))
        moved = max(abs(a - b) for a, b in zip(per_engine[0][0], base, strict=True))
    finally:
        fleet.close()
    summary = {}
    for mb in args.bucket_mb:
        secs = [r["seconds"] for r in rows if r["bucket_mb"] == mb]
        one = next(r for r in rows if r["bucket_mb"] == mb)
        med = statistics.median(secs)
        summary[f"{mb}MB"] = {
            "seconds_median": med,
            "seconds_min": min(secs),
            "seconds_per_100M_params": med * 1e8 / params,
            "bytes": one["bytes"],
            "buckets": one["buckets"],
            "GB_per_s_per_engine": one["bytes"] / med / 1e9,
        }
    return {
        "params": params,
        "engines": args.engines,
        "engine_start_s": start_s,
        "rounds": rows,
        "summary": summary,
        "engines_agree_max_abs_diff": agree,
        "moved_from_checkpoint_max_abs_diff": moved,
    }


def bench_rollout(model_dir: Path, tok_ids: list[list[int]], args: argparse.Namespace) -> dict:
    from megatron_seed.rollout.engine import EngineSpec, SamplingSpec
    from megatron_seed.rollout.fleet import Fleet, FleetSpec

    engine = EngineSpec(kv_cache_bytes=128 << 20, max_model_len=1024)
    fleet = Fleet(str(model_dir), FleetSpec(engines=args.engines, engine=engine))
    spec = SamplingSpec(temperature=1.0, max_tokens=args.max_tokens, seed=0)
    prompts = [tok_ids[i % len(tok_ids)] for i in range(args.prompts)]
    rounds = []
    try:
        fleet.generate(prompts[: args.engines], SamplingSpec(max_tokens=8))  # warm-up
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            gens = fleet.generate(prompts, spec)
            dt = time.perf_counter() - t0
            tokens = sum(len(g.token_ids) for g in gens)
            rounds.append({"seconds": dt, "tokens": tokens, "tokens_per_s": tokens / dt})
    finally:
        fleet.close()
    return {
        "engines": args.engines,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
        "rounds": rounds,
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rounds),
    }


def run_sync(args: argparse.Namespace, out: Path) -> int:
    """Run both benchmarks (`seed bench sync`'s flags) and write the JSON report to ``out``."""
    import ray

    from megatron_seed.models.tiny import TINY_QWEN2
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    corpus = ["Goal: put a clean mug in coffeemachine 1. go to countertop 2, take mug 1."] * 8
    tok = build_tokenizer(corpus, 512, work / "tok")
    texts = [
        f"<|im_start|>user\nGoal: task {i} go to countertop {i}<|im_end|>\n<|im_start|>assistant\n"
        for i in range(16)
    ]
    tok_ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    result: dict = {"machine": "2-core CPU (shared)", "date": time.strftime("%Y-%m-%d %H:%M")}
    try:
        if not args.skip_sync:
            result["sync"] = bench_sync(_model(work, "sync", work / "tok", **SYNC_MODEL), args)
            result["sync"]["model"] = SYNC_MODEL
            for k, v in result["sync"]["summary"].items():
                print(
                    f"sync {k:>6s}: {v['seconds_median']:.2f} s median, {v['seconds_per_100M_params']:.2f} s/100M params, {v['bytes'] / 1e6:.0f} MB, {v['buckets']} buckets"
                )
        tiny = _model(work, "tiny", work / "tok", **{**TINY_QWEN2, "vocab_size": 512})
        result["rollout"] = bench_rollout(tiny, tok_ids, args)
        print(
            f"rollout: {result['rollout']['tokens_per_s_median']:.0f} tokens/s ({args.engines} engines)"
        )
    finally:
        ray.shutdown()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    print(f"wrote {out}")
    return 0
