"""GPU smoke check and throughput of the Megatron model path on one GPU.

    python tools/gpu_smoke.py [--seq 2048 --mbs 4 --steps 8] [--out bench/gpu_smoke.json]
    python tools/gpu_smoke.py --cpu-tiny        # the same code on a tiny model, on the CPU

A Qwen2.5-1.5B-shaped model with random weights (megatron-seed's own builder, so the TE
layer spec when Transformer Engine is installed, else the local spec) runs forward/backward
in bf16; tokens/s and MFU are printed. FP8: with Transformer Engine the model is rebuilt with
an FP8 recipe and timed the same way; without it, torch-native FP8 matmuls
(`torch._scaled_mm`) are timed on the model's own GEMM shapes against bf16. Needs only torch
and megatron-core besides this package. Finishes in a few minutes on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN25_1_5B = dict(
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
)
TINY = dict(
    QWEN25_1_5B,
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def flops_per_token(spec, seq: int) -> float:
    """Training FLOPs per token: 6 x params (matmuls) + attention scores (12 L h_q s)."""
    attn = 12 * spec.num_layers * spec.num_heads * spec.head_dim * seq
    return 6 * spec.num_params + attn


def time_train_steps(model, spec, seq: int, mbs: int, steps: int, device) -> dict:
    """Median seconds of forward+backward on random ids; also one no-grad log-prob pass."""
    from megatron_seed.models.logprobs import shifted_labels, token_logprobs

    ids = torch.randint(0, spec.vocab_size, (mbs, seq), device=device)
    pos = torch.arange(seq, device=device).unsqueeze(0).expand(mbs, seq)
    labels = shifted_labels(ids)
    times = []
    for i in range(steps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        nll = model(ids, pos, None, labels=labels)  # [b, s]
        nll.float().mean().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    lp = token_logprobs(model, ids[:1], 1)
    times.sort()
    step = times[len(times) // 2]
    return {
        "step_seconds_median": step,
        "tokens_per_s": mbs * seq / step,
        "logprobs_finite": bool(torch.isfinite(lp).all()),
    }


def fp8_matmul_bench(spec, tokens: int, device) -> dict:
    """bf16 vs torch-native FP8 (e4m3, per-tensor scales) on the model's GEMM shapes."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return {"skipped": "needs CUDA and torch._scaled_mm"}
    h, f, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    shapes = {
        "qkv": ((spec.num_heads + 2 * spec.num_kv_heads) * d, h),
        "proj": (h, spec.num_heads * d),
        "fc1": (2 * f, h),
        "fc2": (h, f),
    }
    out = {}
    for name, (n, k) in shapes.items():
        a = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)

        def bf16(a=a, w=w):
            return a @ w.t()

        def fp8(a8=a8, w8=w8, one=one):
            return torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        res = {}
        for label, fn in (("bf16", bf16), ("fp8", fp8)):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            sec = (time.perf_counter() - t0) / 20
            res[f"{label}_tflops"] = 2 * tokens * n * k / sec / 1e12
        res["fp8_speedup"] = res["fp8_tflops"] / res["bf16_tflops"]
        out[name] = res
    return out


def main() -> int:
    """Run the smoke check; print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H200: 989)"
    )
    parser.add_argument("--cpu-tiny", action="store_true", help="tiny model on the CPU (a dry run)")
    parser.add_argument("--out", default="bench/gpu_smoke.json")
    args = parser.parse_args()

    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.models.qwen import QwenSpec, build_gpt_model, te_available

    if not torch.cuda.is_available() and not args.cpu_tiny:
        print("no CUDA GPU here; use --cpu-tiny for a dry run", file=sys.stderr)
        return 2
    if args.cpu_tiny:
        args.seq, args.mbs, args.steps = min(args.seq, 64), min(args.mbs, 2), min(args.steps, 2)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    init_parallel(1, 1)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    spec = QwenSpec.from_hf_config(TINY if args.cpu_tiny else QWEN25_1_5B)
    precision = "bf16" if device.type == "cuda" else "fp32"
    te = te_available() and device.type == "cuda"
    results: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformer_engine": te,
        "params": spec.num_params,
        "seq": args.seq,
        "micro_batch": args.mbs,
    }
    t0 = time.perf_counter()
    model = build_gpt_model(spec, precision=precision)
    results["build_seconds"] = time.perf_counter() - t0
    fpt = flops_per_token(spec, args.seq)
    r = time_train_steps(model, spec, args.seq, args.mbs, args.steps, device)
    r["mfu"] = r["tokens_per_s"] * fpt / (args.peak_tflops * 1e12)
    results[precision] = r
    if device.type == "cuda":
        results["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model
    if te:
        model = build_gpt_model(spec, precision="bf16", fp8_recipe="delayed")
        r8 = time_train_steps(model, spec, args.seq, args.mbs, args.steps, device)
        r8["mfu_vs_bf16_peak"] = r8["tokens_per_s"] * fpt / (args.peak_tflops * 1e12)
        results["fp8_te"] = r8
    else:
        results["fp8_torch_native"] = fp8_matmul_bench(spec, args.seq * args.mbs, device)
    print(json.dumps(results, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
