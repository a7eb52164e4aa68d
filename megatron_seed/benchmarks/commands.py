"""`seed bench scoring|attention|memory|phases|sync|moe|analyzer`: what scoring, the teacher pass,
attention, the output layer and mixture-of-experts layers cost, and what keeps the policy's
own analyzer valid.

`scoring`:

(a) 30-turn trajectories scored three ways: full history in one pass per trajectory (the
    default), per turn with the full history (one sequence per turn, the paper's h_t
    without sharing), and per turn with a 2-turn window (the reference code's layout).
    Tokens scored and wall time (no-grad forward).
(b) One update on the same batch: GRPO (no teacher) vs SEED with `snapshot` and `live`
    teachers, interleaved rounds, medians and ratios.
`attention`: forward + backward of the same model (same weights) with the local spec's fused
    core attention (`models.attention`) and with Megatron's `DotProductAttention`, at
    several sequence lengths, interleaved rounds, medians, ratios and the largest NLL and
    gradient differences.
`memory`: peak memory of a log-prob pass and a train step at a real vocabulary, 1k-8k tokens,
    chunked and whole output layer (`benchmarks.memory`).
`phases`: SEED vs GRPO updates on the quick job's world, turn-synchronous and overlapped
    phases (`rollout.overlap`), interleaved rounds, per-phase medians and ratios
    (`benchmarks.phases`).
`sync`: the rollout fleet's weight-sync cost and rollout throughput (`benchmarks.sync`).
`moe`: one update of a small Qwen3-MoE against a dense Qwen3 of the same active parameters
    (`benchmarks.moe`).
`analyzer`: finished runs' last analyses re-asked of their final policy under other decoding
    settings, valid rates by outcome and prompt length (`benchmarks.analyzer`).
Results go to a JSON file (default bench/WHAT.json) and are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from megatron_seed.files import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument(
        "what",
        choices=["scoring", "attention", "memory", "phases", "sync", "moe", "analyzer"],
        help="benchmark",
    )
    parser.add_argument("--out", default=None, help="results file (default bench/WHAT.json)")
    parser.add_argument("--turns", type=int, default=30, help="scoring: turns per trajectory")
    parser.add_argument("--trajectories", type=int, default=4, help="scoring: trajectories")
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed rounds (phases: updates of each variant)"
    )
    parser.add_argument(
        "--work", default=None, help="phases: world and runs (default bench/phases)"
    )
    parser.add_argument("--seed", type=int, default=0, help="phases: the job's seed")
    parser.add_argument(
        "--frozen",
        action="store_true",
        help="phases: lr 1e-12, every update samples from theta_sft (same policy in all)",
    )
    parser.add_argument(
        "--extra",
        nargs="*",
        default=[],
        help="phases: more variants (grpo/overlap-free, seed/overlap-free, seed/overlap-mixed, "
        "seed/overlap-uncertain, seed/overlap-retry)",
    )
    parser.add_argument("--hidden", type=int, default=256, help="model width (head_dim 64)")
    parser.add_argument("--layers", type=int, default=None, help="default 4 (memory: 2)")
    parser.add_argument(
        "--shape", default="qwen2.5-0.5b", help="memory: a models.shapes.SHAPES name"
    )
    parser.add_argument(
        "--lengths", default="1024,2048,4096,8192", help="memory: tokens per pass, comma-separated"
    )
    parser.add_argument(
        "--chunk", type=int, default=None, help="memory: logit_chunk_tokens (default: the config's)"
    )
    parser.add_argument("--engines", type=int, default=2, help="sync: vLLM engines")
    parser.add_argument(
        "--bucket-mb", type=int, nargs="+", default=[16, 64, 256], help="sync: bucket sizes"
    )
    parser.add_argument("--prompts", type=int, default=64, help="sync: rollout prompts")
    parser.add_argument("--max-tokens", type=int, default=128, help="sync: tokens per prompt")
    parser.add_argument("--skip-sync", action="store_true", help="sync: the rollout part only")
    parser.add_argument(
        "--runs", nargs="+", default=[], help="analyzer: finished run folders (each with stage2/)"
    )
    parser.add_argument(
        "--last", type=int, default=4, help="analyzer: the last N updates' analyses"
    )


def _window_records(records, k: int | None):
    """Per-turn records whose single user message renders the task and the last k turns."""
    from dataclasses import replace

    out = []
    for r in records:
        task_line = r.turns[0].observation.splitlines()[0]
        for t, turn in enumerate(r.turns):
            first = 0 if k is None else max(0, t - k)
            history = "".join(
                f"\n[step {i}] {r.turns[i].observation}\n> {r.turns[i].action}"
                for i in range(first, t)
            )
            body = turn.observation if t == 0 else f"{task_line}{history}\n{turn.observation}"
            out.append(replace(r, turns=[replace(turn, observation=body)], history_mode="window"))
    return out


def _time(fn, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _bench_worker(args_dict: dict, hf_dir: str, tok_dir: str) -> dict:
    import dataclasses

    from transformers import AutoTokenizer

    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.config import AlgoConfig, OptimConfig, SeedConfig
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.batch import build_policy_batch
    from megatron_seed.train.trainer import SeedTrainer

    a = argparse.Namespace(**args_dict)
    init_parallel(1, 1)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    records = synthetic_records(
        tok, groups=a.trajectories // 2, group_size=2, turns=a.turns, action_tokens=10, obs_words=30
    )
    base = SeedConfig(optim=OptimConfig(lr=1e-6, micro_batch_size=1))
    trainers = {
        "grpo": SeedTrainer(dataclasses.replace(base, algo=AlgoConfig(use_opd=False)), hf_dir),
        "seed_snapshot": SeedTrainer(
            dataclasses.replace(base, algo=AlgoConfig(teacher_mode="snapshot")), hf_dir
        ),
        "seed_live": SeedTrainer(
            dataclasses.replace(base, algo=AlgoConfig(teacher_mode="live")), hf_dir
        ),
    }
    scorer = trainers["grpo"]
    layouts = {
        "full_history_one_pass": records,
        "per_turn_full_history": _window_records(records, None),
        "per_turn_window_2": _window_records(records, 2),
    }
    result: dict = {"scoring": {}, "update": {}}
    for name, recs in layouts.items():
        pb = build_policy_batch(recs, tok, with_teacher=False)
        tokens = int(pb.student.lengths.sum())
        scorer.score(pb.student)  # warm-up
        times = _time(lambda pb=pb: scorer.score(pb.student), a.rounds)
        result["scoring"][name] = {
            "sequences": pb.rows,
            "tokens_scored": tokens,
            "padded_tokens": int(pb.student.input_ids.numel()),
            "seconds_median": statistics.median(times),
            "seconds": times,
        }
    pb = build_policy_batch(records, tok)
    for tr in trainers.values():
        tr.train_step(pb)  # warm-up
    times = {k: [] for k in trainers}
    for _ in range(a.rounds):  # interleaved rounds: the machine's noise hits all alike
        for key, tr in trainers.items():
            t0 = time.perf_counter()
            tr.train_step(pb)
            times[key].append(time.perf_counter() - t0)
    for key, ts in times.items():
        result["update"][key] = {"seconds_median": statistics.median(ts), "seconds": ts}
    s = result["scoring"]
    grpo = result["update"]["grpo"]["seconds_median"]
    result["ratios"] = {
        "tokens_per_turn_full_over_one_pass": s["per_turn_full_history"]["tokens_scored"]
        / s["full_history_one_pass"]["tokens_scored"],
        "time_per_turn_full_over_one_pass": s["per_turn_full_history"]["seconds_median"]
        / s["full_history_one_pass"]["seconds_median"],
        "seed_snapshot_over_grpo": result["update"]["seed_snapshot"]["seconds_median"] / grpo,
        "seed_live_over_grpo": result["update"]["seed_live"]["seconds_median"] / grpo,
    }
    result["batch"] = {
        "trajectories": a.trajectories,
        "turns": a.turns,
        "action_tokens": int(pb.student.loss_mask.sum()),
    }
    return result


def _attention_worker(hf_dir: str, lengths: list[int], batch: int, rounds: int) -> dict:
    """Spawned: both core attentions in one model architecture, timed side by side."""
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from megatron_seed.models import qwen
    from megatron_seed.models.attention import SdpaDotProductAttention
    from megatron_seed.models.logprobs import model_forward, shifted_labels
    from megatron_seed.models.parallel import init_parallel

    init_parallel(1, 1)
    spec = qwen.QwenSpec.from_pretrained(hf_dir)
    models, weights = {}, None
    for name, cls in (("megatron", DotProductAttention), ("fused", SdpaDotProductAttention)):
        model = qwen.build_gpt_model(spec, use_te=False, core_attention=cls)
        weights = weights or model.state_dict()
        model.load_state_dict(weights)
        models[name] = model
    out = {}
    for s in lengths:
        ids = torch.randint(
            0, spec.vocab_size, (batch, s), generator=torch.Generator().manual_seed(s)
        )
        data = {"input_ids": ids, "labels": shifted_labels(ids)}
        times: dict[str, list[float]] = {name: [] for name in models}
        last: dict[str, tuple] = {}
        for _ in range(rounds):
            for name, model in models.items():  # interleaved: both see the same machine load
                model.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                nll = model_forward(model, data)  # [b, s]
                nll.mean().backward()
                times[name].append(time.perf_counter() - t0)
                grads = [p.grad for p in model.parameters()]
                last[name] = (nll.detach(), grads)
        (nll_a, g_a), (nll_b, g_b) = last["megatron"], last["fused"]
        med = {name: statistics.median(t) for name, t in times.items()}
        out[str(s)] = {
            "batch": batch,
            "megatron_s": round(med["megatron"], 4),
            "fused_s": round(med["fused"], 4),
            "speedup": round(med["megatron"] / med["fused"], 2),
            "max_nll_diff": (nll_a - nll_b).abs().max().item(),
            "max_grad_diff": max((a - b).abs().max().item() for a, b in zip(g_a, g_b, strict=True)),
        }
    return out


def _bench_model(args: argparse.Namespace, out: Path, vocab: int) -> None:
    """The benchmarks' random Qwen2 (hidden ``args.hidden``, head_dim 64) in ``out``."""
    from megatron_seed.models.tiny import make_tiny_qwen

    make_tiny_qwen(
        out,
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        max_position_embeddings=8192,
    )


def _run_attention(args: argparse.Namespace, work: Path) -> dict:
    from megatron_seed.models.parallel import spawn

    _bench_model(args, work / "model", vocab=1024)
    lengths = [512, 1024, 2048]
    result = spawn(_attention_worker, 1, str(work / "model"), lengths, 4, args.rounds)[0]
    print("forward + backward, batch 4 (median of interleaved rounds)")
    for s, r in result.items():
        print(
            f"  {s:>5} tokens  megatron {r['megatron_s']:6.3f} s  fused {r['fused_s']:6.3f} s  "
            f"{r['speedup']:5.2f}x  max|dNLL| {r['max_nll_diff']:.1e}"
        )
    return {"attention": result}


def _run_memory(args: argparse.Namespace, work: Path) -> dict:
    import dataclasses

    from megatron_seed.benchmarks.memory import SMALL_VOCAB, run_memory
    from megatron_seed.errors import CommandError
    from megatron_seed.models.init_model import hf_config, write_checkpoint
    from megatron_seed.models.shapes import SHAPES
    from megatron_seed.models.tiny import make_tiny_qwen

    if args.shape not in SHAPES or not SHAPES[args.shape].hf_id.startswith("Qwen/"):
        raise CommandError(f"unknown --shape {args.shape!r}; a Qwen shape of models.shapes.SHAPES")
    try:
        lengths = tuple(int(x) for x in args.lengths.split(","))
    except ValueError:
        raise CommandError(
            f"--lengths must be comma-separated integers: {args.lengths!r}"
        ) from None
    shape = SHAPES[args.shape]
    layers = args.layers or 2
    if args.chunk is None:
        from megatron_seed.config import ParallelConfig

        args.chunk = ParallelConfig().logit_chunk_tokens
    write_checkpoint(shape, work / "model", layers=layers)
    # the same shape with a negligible vocabulary: what the passes hold besides the logits
    small = hf_config(dataclasses.replace(shape, vocab=SMALL_VOCAB), layers)
    drop = ("architectures", "bos_token_id", "eos_token_id")  # ids past the small vocabulary
    make_tiny_qwen(work / "small", **{k: v for k, v in small.items() if k not in drop})
    print(
        f"{shape.hf_id} shape, {layers} layers, vocab {shape.vocab}; logit_chunk_tokens "
        f"{args.chunk}; peak resident memory per pass (fresh process each)"
    )
    result = run_memory(work / "model", work / "small", shape.vocab, lengths, args.chunk)
    result["model"] = {"shape": args.shape, "layers": layers, "vocab": shape.vocab}
    result["chunk"] = args.chunk
    return result


def run(args: argparse.Namespace) -> int:
    """Build a small model and tokenizer, run the benchmark in a fresh process, report."""
    import tempfile

    from megatron_seed.benchmarks.synthetic import _WORDS
    from megatron_seed.models.parallel import spawn
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    out = Path(args.out or f"bench/{args.what}.json")
    if args.what == "sync":
        from megatron_seed.benchmarks.sync import run_sync

        return run_sync(args, out)
    if args.what == "analyzer":
        from megatron_seed.benchmarks.analyzer import run as run_analyzer

        if not args.runs or args.last < 1:
            raise SystemExit("analyzer needs --runs RUN [RUN ...] and --last >= 1")
        run_analyzer(args.runs, args.last, out)
        return 0
    if args.what == "moe":
        from megatron_seed.benchmarks.moe import run_moe

        if args.rounds < 1:
            raise SystemExit("--rounds must be >= 1")
        run_moe(out, args.rounds, Path(tempfile.mkdtemp(prefix="seed-bench-moe-")))
        return 0
    if args.what == "phases":
        from megatron_seed.benchmarks.phases import print_summary, run_phases

        if args.rounds < 1:
            raise SystemExit("--rounds must be >= 1")
        result = run_phases(
            Path(args.work or "bench/phases"), args.rounds, args.seed, args.extra, args.frozen
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, result)
        print_summary(result)
        print(f"wrote {out}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="seed-bench-"))
    if args.what != "memory":
        args.layers = args.layers or 4
    if args.what == "memory":
        from megatron_seed.benchmarks.memory import write_results

        write_results(_run_memory(args, work), out)
        print(f"wrote {out}")
        return 0
    if args.what == "attention":
        result = _run_attention(args, work)
        result["model"] = {"hidden": args.hidden, "layers": args.layers}
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, result)
        print(f"wrote {out}")
        return 0
    corpus = [" ".join(_WORDS)] * 4 + ["Goal: put a mug in fridge."]
    tok = build_tokenizer(corpus, 512, work / "tok")
    vocab = -(-len(tok) // 64) * 64
    _bench_model(args, work / "model", vocab)
    result = spawn(_bench_worker, 1, vars(args), str(work / "model"), str(work / "tok"))[0]
    result["model"] = {"hidden": args.hidden, "layers": args.layers, "vocab": vocab}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    print("scoring (no-grad forward)")
    for name, r in result["scoring"].items():
        print(
            f"  {name:24s} {r['sequences']:4d} seqs {r['tokens_scored']:7d} tokens "
            f"{r['seconds_median']:7.2f} s"
        )
    print("one update (median of interleaved rounds)")
    for name, r in result["update"].items():
        print(f"  {name:24s} {r['seconds_median']:7.2f} s")
    for name, v in result["ratios"].items():
        print(f"  {name:36s} {v:6.2f}x")
    print(f"wrote {out}")
    return 0
