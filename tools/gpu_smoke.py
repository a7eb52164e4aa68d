"""The first GPU run in one command: the real trainer on one GPU, checked and timed.

    python tools/gpu_smoke.py [--model HF_DIR] [--seq 2048] [--steps 3] [--out bench/gpu_smoke.json]
    python tools/gpu_smoke.py --cpu-tiny     # the same code path on a tiny model, on the CPU
    bash tools/gpu_smoke.sh fetch|run        # a bare GPU node: carried wheels, its own torch

On the model (`--model`: any local Qwen2/2.5/3 HF folder; default a Qwen2.5-0.5B-shaped
checkpoint with random weights, written locally), in up to three modes: "plain" (bf16; fp32
on the CPU), "recipe" (the GPU recipes' trainer settings: distributed optimizer, full
activation recompute, and the colocated hand-over of grads and optimizer state), and "fp8"
(`--fp8-recipe` on TE's layer spec, where Transformer Engine is installed; without TE,
torch-native FP8 GEMMs on the model's shapes are timed against bf16 instead); "moe" runs the
plain mode on a slice of a Qwen3-30B-A3B-shaped mixture of experts (its attention, 128
experts of width 768, top 8, renormalised; 2 of its 48 layers; `--moe-model` for a local
Qwen3-MoE folder), TE's grouped GEMM where TE imports; "moe-recipe" runs that slice with the
recipe mode's trainer settings and trains on replayed routes (routing replay under full
recompute, the distributed optimizer's checkpoint). Modes run in `--modes` order. Each mode:

1. `SeedTrainer` is built as Stage 2 builds it (policy, frozen reference, Megatron DDP and
   optimizer; the TE spec when TE imports) from the HF weights;
2. parity: the trainer's per-token log-probs against transformers' on the same ids, and
   packed rows against padded ones; the MoE modes also replay random routes (routing replay);
3. `train_step` on a SEED batch of `--seq` tokens per sequence (student and teacher; in
   "moe-recipe" with routes to replay), timed: tokens/s and MFU (6 N + attention FLOPs per
   token against `--peak-tflops`);
4. memory against the launcher's model (`launch.layout.trainer_memory_gib`, experts
   included): on a GPU the allocator's peak must stay under the estimate; everywhere, the
   bytes the trainer holds in weights, gradients, optimizer state and reference must match
   the model's static part; the recipe modes also release and reclaim their grads and
   optimizer state (colocated mode);
5. a checkpoint save (the host's peak resident memory during it recorded), one more step, a
   fresh trainer resumed from the checkpoint, the same step: the two must agree (exactly on
   the CPU).

The JSON (`--out`) is rewritten and flushed after every phase, so a run cut short keeps what
it measured; progress goes to stdout. Modes that would not finish inside `--budget-s`
(default 480 s, from the first mode's measured time) are recorded as skipped. At the end the
results are checked (`problems`: only what each mode measured); the exit status is 1 if any
check fails. Besides PyTorch it needs only megatron-core and transformers (TE and vLLM are
optional).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN25_05B = dict(
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
)
TINY = dict(
    QWEN25_05B,
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
)
QWEN3_30B_A3B_SLICE = dict(
    model_type="qwen3_moe",
    vocab_size=151936,
    hidden_size=2048,
    num_hidden_layers=2,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    intermediate_size=6144,
    norm_topk_prob=True,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
    rope_theta=1000000.0,
)
TINY_MOE = dict(
    QWEN3_30B_A3B_SLICE, vocab_size=512, hidden_size=96, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=64, intermediate_size=192,
)  # fmt: skip
MODES = ("plain", "recipe", "fp8", "moe", "moe-recipe")
MOE_MODES = ("moe", "moe-recipe")
GIB = 2**30


class Results:
    """The smoke's JSON, rewritten (atomically) and flushed after every phase."""

    def __init__(self, path: Path, data: dict) -> None:
        self.path, self.data, self.start = path, data, time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        """Write what is measured so far."""
        self.data["elapsed_seconds"] = round(time.perf_counter() - self.start, 1)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(self.data, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def phase(self, mode: str, out: dict, name: str) -> None:
        """One phase of `mode` is done: note it, print it, save."""
        out.setdefault("phases_done", []).append(name)
        print(f"smoke: {mode}: {name} done ({time.perf_counter() - self.start:.0f} s)", flush=True)
        self.save()


def flops_per_token(spec, seq: int) -> float:
    """Training FLOPs per token: 6 x the parameters it passes through (matmuls; a mixture of
    experts' active ones) + causal attention scores (6 L h_q d s)."""
    attn = 6 * spec.num_layers * spec.num_heads * spec.head_dim * seq
    return 6 * spec.active_params + attn


def smoke_batch(tokenizer, seq: int, rows: int, multiple: int):
    """A SEED PolicyBatch of `rows` multi-turn sequences of about `seq` tokens (student and
    teacher rows), padded to the trainer's token multiple."""
    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.train.batch import build_policy_batch

    def batch(turns: int):
        records = synthetic_records(
            tokenizer, groups=max(1, rows // 2), group_size=2, turns=turns, action_tokens=8,
            obs_words=24, seed=0, valid_skill_every=1,
        )  # fmt: skip
        return build_policy_batch(records, tokenizer, pad_to_multiple_of=multiple)

    one, two = (batch(t).student.input_ids.shape[1] for t in (1, 2))
    turns = max(1, 1 + (seq - one) // max(1, two - one))  # lengths grow linearly in turns
    return batch(turns)


def packing_parity(trainer, pb) -> dict:
    """Log-probs of the batch's students and teachers from packed micro-batches (two rows'
    worth of tokens each; on GPUs Transformer Engine's thd attention and fused RoPE) against
    the padded rows, on every position with a target."""
    import dataclasses

    cfg = trainer.cfg
    batches = [b for b in (pb.student, pb.teacher) if b is not None]
    padded = [trainer.score(b) for b in batches]
    width = 2 * int(pb.student.input_ids.shape[1])
    trainer.cfg = dataclasses.replace(
        cfg, optim=dataclasses.replace(cfg.optim, micro_batch_tokens=width)
    )
    try:
        packed = [trainer.score(b) for b in batches]
    finally:
        trainer.cfg = cfg
    diffs = []
    for b, a, p in zip(batches, padded, packed, strict=True):
        has_target = torch.arange(a.shape[1])[None, :] < (b.lengths - 1)[:, None]  # [B, s]
        diffs.append((a - p).abs()[has_target])
    diff = torch.cat(diffs)
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())}


def with_random_routes(spec, batch, seed: int):
    """`batch` with random routes for every token of every row: each token's `top_k` of
    `num_experts` experts, independently per sparse layer (`[n, layers, k]` per row)."""
    from megatron_seed.train.batch import with_routes

    g = torch.Generator().manual_seed(seed)
    shape = (sum(spec.sparse_layers), spec.num_experts)
    routes = [
        torch.rand(n, *shape, generator=g).argsort(-1)[..., : spec.top_k]
        for n in batch.lengths.tolist()
    ]
    return with_routes(batch, routes)


def host_rss_gib(peak: bool = False) -> float:
    """This process's resident host memory (GiB; `peak`: its high-water mark since the last
    `reset_host_peak`), from /proc (0.0 where there is none)."""
    key = "VmHWM:" if peak else "VmRSS:"
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return 0.0


def reset_host_peak() -> None:
    """Restart the high-water mark of resident memory (Linux: "5" to /proc/self/clear_refs)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def routing_replay_check(trainer, pb) -> dict:
    """The students scored with random routes replayed (its routers' kernels, TE's grouped
    GEMM on a GPU): the share of scored (token, layer) pairs routed as given (1.0), how
    often the routers' own choice agrees (~k / E by chance), and how far the log-probs move
    from free routing."""
    free = trainer.score(pb.student)  # [B, s]
    replayed = trainer.score(with_random_routes(trainer.spec, pb.student, 3), count_routes=True)
    counts = trainer.route_agreement()
    mask = pb.student.loss_mask
    return {
        "routes_replayed": counts["moe/routes_replayed"],
        "route_agreement": counts["moe/route_agreement"],
        "finite": bool(torch.isfinite(replayed).all()),
        "moved_mean_abs": float((replayed - free).abs()[mask].mean()),
    }


def held_bytes(trainer) -> dict[str, int]:
    """Bytes the trainer holds in weights, fp32 main grads, optimizer state and reference."""
    params = list(trainer.model.module.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in trainer.model.buffers)
    state = 0
    for opt in getattr(trainer.optimizer, "chained_optimizers", [trainer.optimizer]):
        for tensors in opt.optimizer.state.values():
            state += sum(t.numel() * t.element_size() for t in tensors.values() if t.dim())
        for group in getattr(opt, "shard_fp32_from_float16_groups", None) or getattr(
            opt, "fp32_from_float16_groups", []
        ):
            state += sum(p.numel() * p.element_size() for p in group)
    ref = sum(p.numel() * p.element_size() for p in trainer.ref_model.parameters())
    return {"weights": weights, "grads": grads, "optimizer": state, "reference": ref}


def mode_config(
    precision: str, fp8_recipe: str | None, recipe: bool, on_gpu: bool, moe: bool = False
):
    """The trainer config of one smoke mode; "recipe" takes the GPU recipes' trainer
    settings (the distributed optimizer is GPU-only: Megatron refuses CPU tensors there);
    `moe` replays routes where a batch brings them (`algo.routing_replay`)."""
    from megatron_seed.config import AlgoConfig, OptimConfig, ParallelConfig, SeedConfig

    return SeedConfig(
        algo=AlgoConfig(teacher_mode="snapshot", beta_kl=0.01, routing_replay=moe),
        optim=OptimConfig(lr=1e-5, mini_batches_per_update=1, micro_batch_size=1),
        parallel=ParallelConfig(
            precision=precision,
            fp8_recipe=fp8_recipe,
            distributed_optimizer=recipe and on_gpu,
            recompute="full" if recipe else "none",
        ),
    )


def handover(trainer) -> dict:
    """Colocated mode's hand-over: the GPU memory the trainer gives the engines
    (`release_memory`: grads freed, optimizer state to host) and takes back."""
    on_gpu = torch.cuda.is_available()

    def allocated() -> float:
        if on_gpu:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated() / GIB
        return 0.0

    before = allocated()
    t = time.perf_counter()
    trainer.release_memory()
    released = allocated()
    release_s = time.perf_counter() - t
    t = time.perf_counter()
    trainer.reclaim_memory()
    return {
        "allocated_gib": before,
        "released_gib": released,
        "given_back_gib": before - released,
        "release_seconds": release_s,
        "reclaim_seconds": time.perf_counter() - t,
        "reclaimed_gib": allocated(),
    }


def run_mode(args, hf_dir: str, tokenizer, name: str, cfg, results: Results, out: dict) -> dict:
    """Build, check parity, train, measure memory, checkpoint and resume one mode; its
    results go into `out` (a part of `results`, saved after every phase)."""
    from launch.layout import ClusterLayout, trainer_memory_gib
    from megatron_seed.models.parity import hf_reference_logprobs
    from megatron_seed.models.shapes import ModelShape
    from megatron_seed.train.trainer import SeedTrainer

    on_gpu = torch.cuda.is_available()
    par = cfg.parallel
    out.update(
        precision=par.precision if on_gpu else "fp32",
        fp8_recipe=par.fp8_recipe,
        distributed_optimizer=par.distributed_optimizer,
        recompute=par.recompute,
    )
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = SeedTrainer(cfg, hf_dir)
    out["build_seconds"] = time.perf_counter() - t0
    out["transformer_engine_spec"] = (
        "TE" in type(trainer.model.module.decoder.layers[0].self_attention.linear_qkv).__name__
    )
    spec = trainer.spec
    results.phase(name, out, "build")

    # parity against transformers on the same ids (float32 reference)
    from megatron_seed.data import TokenSequence, collate

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, min(spec.vocab_size, len(tokenizer)), (2, args.parity_seq), generator=g)
    batch = collate(
        [TokenSequence(r.tolist(), [False] * len(r), [0.0] * len(r), [0] * len(r)) for r in ids],
        0,
        trainer.seq_multiple,
    )
    ours = trainer.score(batch)[:, : args.parity_seq]  # [2, s]
    ref = hf_reference_logprobs(hf_dir, ids)  # [2, s]
    diff = (ours - ref).abs()[:, :-1]
    out["parity"] = {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())}
    results.phase(name, out, "parity")

    pb = smoke_batch(tokenizer, args.seq, args.rows, trainer.seq_multiple)
    tokens = int(pb.student.input_ids.numel() + (pb.teacher.input_ids.numel() if pb.teacher else 0))
    out["batch"] = {"rows": pb.rows, "seq": int(pb.student.input_ids.shape[1]), "tokens": tokens}
    out["packing"] = packing_parity(trainer, pb)
    results.phase(name, out, "packing")
    if spec.is_moe:
        out["routing_replay"] = routing_replay_check(trainer, pb)
        results.phase(name, out, "routing_replay")
    if spec.is_moe and cfg.algo.routing_replay and par.recompute == "full":
        # train on replayed routes: the recomputation in backward must replay them again
        pb.student = with_random_routes(spec, pb.student, 4)
        if pb.teacher is not None:
            pb.teacher = with_random_routes(spec, pb.teacher, 5)
    times, losses = [], []
    for _ in range(args.steps):
        if on_gpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        m = trainer.train_step(pb)
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(m["loss/total"])
        if pb.student.routes is not None:  # theta_old's pass: the routers against the routes
            out.setdefault("training_replay", []).append(m.get("moe/routes_replayed"))
    out["losses"] = losses
    out["finite"] = all(math.isfinite(x) for x in losses)
    timed = sorted(times[1:] or times)  # the first step warms kernels up
    step = timed[len(timed) // 2]
    # one update scores old/ref/teacher (3 forwards) and trains the student (forward+backward):
    # count what it trains on, as MFU conventions do
    train_tokens = int(pb.student.input_ids.numel())
    out["step_seconds_median"] = step
    out["train_tokens_per_s"] = train_tokens / step
    fpt = flops_per_token(spec, out["batch"]["seq"])
    out["mfu"] = out["train_tokens_per_s"] * fpt / (args.peak_tflops * 1e12) if on_gpu else None
    results.phase(name, out, "train")

    # memory: the allocator's peak and the bytes held, against the launcher's model
    held = held_bytes(trainer)
    peak = torch.cuda.max_memory_allocated() / GIB if on_gpu else None
    shape = ModelShape(
        hf_id=hf_dir, layers=spec.num_layers, hidden=spec.hidden_size, heads=spec.num_heads,
        kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, ffn=spec.intermediate_size,
        vocab=spec.vocab_size, tied_embeddings=spec.tie_word_embeddings, qkv_bias=spec.qkv_bias,
        qk_norm=spec.qk_norm, experts=spec.num_experts, top_k=spec.top_k,
        expert_ffn=spec.moe_ffn, norm_topk_prob=spec.norm_topk_prob,
    )  # fmt: skip
    layout = ClusterLayout(
        gpus_per_node=1, trainer_ranks_per_node=1, fleet_gpus_per_node=0,
        tokens_per_micro_batch=out["batch"]["seq"],
    )  # fmt: skip
    model = trainer_memory_gib(shape, cfg.parallel, 1, layout)
    static_model = sum(model[k] for k in ("weights_bf16", "grads_fp32", "optimizer_fp32"))
    static_model += model["reference_bf16"]
    out["memory"] = {
        "model_gib": model,
        "held_gib": {k: v / GIB for k, v in held.items()},
        "held_over_model_static": sum(held.values()) / GIB / static_model,
        "peak_gib": peak,
        "peak_over_model_total": peak / model["total"] if on_gpu else None,
    }
    if par.recompute == "full":  # the recipes' colocated hand-over, then a step on top
        out["handover"] = handover(trainer)
        out["handover"]["loss_after"] = trainer.train_step(pb)["loss/total"]
    results.phase(name, out, "memory")
    return resume_check(trainer, cfg, hf_dir, pb, results, name, out)


def resume_check(trainer, cfg, hf_dir: str, pb, results: Results, name: str, out: dict) -> dict:
    """A checkpoint save, one more step, a fresh trainer resumed from the checkpoint taking
    the same step: the two losses must agree."""
    from megatron_seed.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from megatron_seed.train.trainer import SeedTrainer

    on_gpu = torch.cuda.is_available()
    hf_config = json.loads((Path(hf_dir) / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        before = host_rss_gib()
        reset_host_peak()
        t = time.perf_counter()
        save_checkpoint(trainer, Path(tmp) / "ckpt", hf_config)
        out["checkpoint_save_seconds"] = time.perf_counter() - t
        # what a save adds to the host (the distributed optimizer's state gathered there)
        out["host_rss_gib"] = {"before_save": before, "peak_during_save": host_rss_gib(True)}
        after = trainer.train_step(pb)["loss/total"]
        del trainer
        if on_gpu:
            torch.cuda.empty_cache()
        resumed = SeedTrainer(cfg, hf_dir)
        load_checkpoint(resumed, latest_checkpoint(Path(tmp) / "ckpt"))
        again = resumed.train_step(pb)["loss/total"]
    out["resume"] = {"loss_continued": after, "loss_resumed": again, "abs_diff": abs(after - again)}
    del resumed
    if on_gpu:
        torch.cuda.empty_cache()
    results.phase(name, out, "resume")
    return out


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


def make_model(args, folder: Path, moe: bool = False) -> str:
    """The HF folder to use: `--model` (`--moe-model`), or a random checkpoint of the smoke's
    dense (mixture-of-experts) shape."""
    given = args.moe_model if moe else args.model
    if given:
        return given
    from megatron_seed.models.tiny import make_tiny_qwen

    shapes = {(False, False): QWEN25_05B, (False, True): TINY, (True, False): QWEN3_30B_A3B_SLICE}
    shape = dict(shapes.get((moe, args.cpu_tiny), TINY_MOE))
    out = folder / ("moe" if moe else "model")
    make_tiny_qwen(out, **shape)
    return str(out)


def main() -> int:
    """Run the smoke check; print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a local HF Qwen folder (default: random 0.5B shape)")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per training sequence")
    parser.add_argument("--rows", type=int, default=4, help="sequences per update")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--parity-seq", type=int, default=256)
    parser.add_argument("--fp8-recipe", default="tensorwise", help="with TE; 'none' skips FP8")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak")
    parser.add_argument("--cpu-tiny", action="store_true", help="tiny model on the CPU")
    parser.add_argument("--moe-model", help="a local HF Qwen3-MoE folder for the moe mode")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"which of {', '.join(MODES)}, in order"
    )
    parser.add_argument(
        "--budget-s", type=float, default=480.0, help="skip modes that would end past this"
    )
    parser.add_argument("--out", default="bench/gpu_smoke.json")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu_tiny:
        print("no CUDA GPU here; use --cpu-tiny for a dry run", file=sys.stderr)
        return 2
    if args.cpu_tiny:
        args.seq, args.steps, args.parity_seq = min(args.seq, 128), min(args.steps, 2), 32
    wanted = [m for m in args.modes.split(",") if m]
    if unknown := set(wanted) - set(MODES):
        print(f"unknown --modes {sorted(unknown)}: choose from {', '.join(MODES)}", file=sys.stderr)
        return 2

    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.models.qwen import te_available
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    init_parallel(1, 1, device="cuda" if not args.cpu_tiny else "cpu")
    on_gpu = torch.cuda.is_available()
    results = Results(
        Path(args.out),
        {
            "device": torch.cuda.get_device_name() if on_gpu else "cpu",
            "torch": torch.__version__,
            "megatron_core": __import__("importlib.metadata").metadata.version("megatron-core"),
            "transformer_engine": te_available() and on_gpu,
            "seq": args.seq,
            "rows": args.rows,
            "budget_seconds": args.budget_s,
            "modes": {},
        },
    )
    corpus = ["go to the fridge and open it", "take the mug from the desk"] * 20
    tokenizer = build_tokenizer(corpus, vocab_size=300)
    precision = "bf16" if on_gpu else "fp32"
    configs = {
        "plain": mode_config(precision, None, False, on_gpu),
        "recipe": mode_config(precision, None, True, on_gpu),
        "fp8": mode_config("bf16", args.fp8_recipe, False, on_gpu),
        "moe": mode_config(precision, None, False, on_gpu, moe=True),
        "moe-recipe": mode_config(precision, None, True, on_gpu, moe=True),
    }
    modes = []  # (name, config), in the order asked for
    for name in wanted:
        if name == "fp8" and not results.data["transformer_engine"]:
            results.data["modes"]["fp8"] = {"skipped": "needs Transformer Engine and a GPU"}
        else:
            modes.append((name, configs[name]))
    with tempfile.TemporaryDirectory() as tmp:
        from megatron_seed.models.qwen import QwenSpec

        dense = set(wanted) - set(MOE_MODES)
        hf_dir = make_model(args, Path(tmp)) if dense else ""
        spec = QwenSpec.from_pretrained(hf_dir) if dense else None
        if spec is not None:
            results.data["model"] = {"path": args.model or "random", "params": spec.num_params}
        took: list[float] = []
        for name, cfg in modes:
            elapsed = time.perf_counter() - results.start
            if took and elapsed + max(took) > args.budget_s:
                why = f"budget: {elapsed:.0f} s spent, a mode took {max(took):.0f} s"
                results.data["modes"][name] = {"skipped": why}
                print(f"smoke: {name}: skipped ({why})", flush=True)
                results.save()
                continue
            print(f"smoke: {name} ...", flush=True)
            out = results.data["modes"][name] = {}
            t = time.perf_counter()
            mode_dir = hf_dir
            if name in MOE_MODES:
                mode_dir = make_model(args, Path(tmp), moe=True)
                moe_spec = QwenSpec.from_pretrained(mode_dir)
                out["model"] = {
                    "path": args.moe_model or "random",
                    "params": moe_spec.num_params,
                    "experts": moe_spec.num_experts,
                    "top_k": moe_spec.top_k,
                    "layers": moe_spec.num_layers,
                }
            run_mode(args, mode_dir, tokenizer, name, cfg, results, out)
            took.append(time.perf_counter() - t)
        if on_gpu and spec is not None and not results.data["transformer_engine"]:  # no TE
            tokens = args.rows * args.seq
            results.data["fp8_torch_native"] = fp8_matmul_bench(spec, tokens, torch.device("cuda"))
    results.data["done"] = True
    results.data["problems"] = problems(results.data)
    results.save()
    print(json.dumps(results.data, indent=2))
    for line in results.data["problems"]:
        print(f"smoke: FAILED {line}", file=sys.stderr)
    return 1 if results.data["problems"] else 0


PHASES = ("build", "parity", "packing", "train", "memory", "resume")


def problems(data: dict) -> list[str]:
    """What in a smoke's JSON is wrong, one line each: every mode that ran must have done
    all its phases and pass the checks of what it measured (GPU-only numbers, which are None
    on the CPU, only where present; skipped modes not at all)."""
    bad: list[str] = []
    for name, mode in data.get("modes", {}).items():
        if "skipped" in mode:
            continue
        moe = name in MOE_MODES
        want = [*PHASES[:3], "routing_replay", *PHASES[3:]] if moe else list(PHASES)
        if mode.get("phases_done") != want:
            bad.append(f"{name}: phases {mode.get('phases_done')}, expected {want}")
            continue
        if not mode["finite"]:
            bad.append(f"{name}: non-finite loss {mode['losses']}")
        for key in ("parity", "packing"):
            if not mode[key]["mean_abs_diff"] < 0.05:
                bad.append(f"{name}: {key} mean |diff| {mode[key]['mean_abs_diff']:.4f} >= 0.05")
        if mode["mfu"] is not None and not 0.0 < mode["mfu"] < 1.0:
            bad.append(f"{name}: MFU {mode['mfu']} outside (0, 1)")
        memory = mode["memory"]
        if not abs(memory["held_over_model_static"] - 1.0) < 0.05:
            ratio = memory["held_over_model_static"]
            bad.append(f"{name}: held / modelled static memory {ratio:.3f}, not 1")
        if memory["peak_over_model_total"] is not None and memory["peak_over_model_total"] > 1.0:
            ratio = memory["peak_over_model_total"]
            bad.append(f"{name}: allocator peak {ratio:.3f} x the launcher's estimate")
        resume = mode["resume"]
        if not resume["abs_diff"] <= 1e-3 * max(1.0, abs(resume["loss_continued"])):
            bad.append(f"{name}: resumed step differs by {resume['abs_diff']:.2e}")
        if "handover" in mode and not math.isfinite(mode["handover"]["loss_after"]):
            bad.append(f"{name}: non-finite loss after the hand-over")
        if moe:
            replay = mode["routing_replay"]
            if not (replay["routes_replayed"] == 1.0 and replay["finite"]):
                bad.append(f"{name}: routes replayed {replay['routes_replayed']}, not 1.0")
            if not replay["moved_mean_abs"] > 1e-3:
                bad.append(
                    f"{name}: replayed routes moved log-probs by only {replay['moved_mean_abs']}"
                )
        if any(share != 1.0 for share in mode.get("training_replay", [])):
            bad.append(f"{name}: shares of routes replayed in training {mode['training_replay']}")
    return bad


if __name__ == "__main__":
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    sys.exit(main())
