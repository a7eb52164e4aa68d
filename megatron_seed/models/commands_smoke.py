"""`seed smoke`: a tiny real Megatron forward/backward/log-prob run on this machine.

Builds a random tiny Qwen2 checkpoint with transformers, loads it into Megatron (TP x PP
processes), checks log-prob parity against transformers, runs a few Adam steps on a fixed
batch and prints the loss going down.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from megatron_seed.errors import positive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument("--tp", type=positive, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=positive, default=1, help="pipeline-parallel size")
    parser.add_argument("--steps", type=positive, default=5, help="optimizer steps")
    parser.add_argument("--out", default=None, help="where to write the tiny checkpoint")


def _train_worker(hf_dir: str, tp: int, pp: int, steps: int) -> list[float]:
    import torch

    from megatron_seed.models.convert import HFCheckpoint, load_hf_weights
    from megatron_seed.models.logprobs import micro_batches, run_schedule, shifted_labels
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.models.qwen import build_gpt_model

    init_parallel(tp, pp)
    ckpt = HFCheckpoint(hf_dir)
    model = build_gpt_model(ckpt.spec)
    load_hf_weights(model, ckpt)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = torch.randint(
        0, ckpt.spec.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0)
    )
    batch = {"input_ids": ids, "labels": shifted_labels(ids)}
    n_tokens = ids.numel()

    def loss_fn(mb, nll):  # mean NLL over the global batch
        return nll.sum() / n_tokens, {"nll_sum": nll.detach().sum()}

    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logs = run_schedule(model, micro_batches(batch, 2), loss_fn, forward_only=False)
        for p in model.parameters():  # TP-replicated grads are already identical
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
        if logs:
            losses.append(float(sum(d["nll_sum"] for d in logs)) / n_tokens)
    return losses


def run(args: argparse.Namespace) -> int:
    """Run the smoke check and print what it measured."""
    from megatron_seed.models.parallel import spawn
    from megatron_seed.models.parity import check_parity
    from megatron_seed.models.tiny import make_tiny_qwen

    out = Path(args.out or tempfile.mkdtemp(prefix="seed-smoke-"))
    hf_dir = make_tiny_qwen(out / "tiny-qwen2")
    t0 = time.time()
    parity = check_parity(hf_dir, args.tp, args.pp)
    print(
        f"log-prob parity vs transformers (TP={args.tp} PP={args.pp}): max |diff| = "
        f"{parity['max_abs_diff']:.2e}; HF->Megatron->HF bit-exact: {parity['roundtrip_exact']}"
    )
    results = spawn(_train_worker, args.tp * args.pp, str(hf_dir), args.tp, args.pp, args.steps)
    losses = next(r for r in reversed(results) if r)
    print("NLL per step: " + ", ".join(f"{x:.4f}" for x in losses))
    print(f"done in {time.time() - t0:.1f} s; checkpoint at {hf_dir}")
    return 0 if losses[-1] < losses[0] and parity["max_abs_diff"] < 1e-4 else 1
