"""`seed bench memory`: peak memory of a log-prob pass and of a train step at real vocabulary.

A random model of a real Qwen shape (vocabulary 151,936; depth cut to `--layers`) is scored
and trained on one sequence of 1k, 2k, 4k and 8k tokens, with the output layer chunked
(`parallel.logit_chunk_tokens`, `models.chunked`) and whole. Every measurement runs in a
fresh process through the real trainer (`SeedTrainer.score`, `SeedTrainer.nll_step`: DDP,
Adam): set up, one warm-up step (Adam's state exists), then the process's peak resident set
is reset (`/proc/self/clear_refs`) and read after the pass (`VmHWM`).

The floor a pass cannot go below is the weights and optimizer state (`base`: resident memory
right before the pass) plus the activations. The activations are measured, not estimated:
the same pass on the same shape with a 1,024-token vocabulary, whose logits are negligible,
adds `extra_small` over its own base. So `floor = base + extra_small`, `ratio = peak /
floor`, and the logits' share of the chunked peak is `(peak - floor) / peak`. A whole-
sequence run that would not fit the machine's available memory is skipped and said so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from megatron_seed.files import write_json

LENGTHS = (1024, 2048, 4096, 8192)
SMALL_VOCAB = 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def _measure_worker(hf_dir: str, mode: str, length: int, chunk: int, threads: int) -> dict:
    """Spawned, one per measurement: base and peak GiB of one pass (see module docstring)."""
    import gc

    import torch

    from megatron_seed.config import ParallelConfig, SeedConfig
    from megatron_seed.data import collate
    from megatron_seed.data.sequences import TokenSequence
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.trainer import SeedTrainer

    torch.set_num_threads(threads)
    init_parallel(1, 1)
    cfg = SeedConfig(parallel=ParallelConfig(logit_chunk_tokens=chunk))
    trainer = SeedTrainer(cfg, hf_dir, reference=False)
    vocab = trainer.spec.vocab_size

    def batch(n: int):
        ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        seq = TokenSequence(ids, [False] + [True] * (n - 1), [0.0] * n, [0] * n)
        return collate([seq], pad_id=0)

    trainer.nll_step(batch(64))  # warm-up: Adam's state, gradient buffers
    work = batch(length)
    gc.collect()
    base = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak resident set := current
    t0 = time.perf_counter()
    if mode == "logprobs":
        trainer.score(work)
    else:
        trainer.nll_step(work)
    seconds = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    return {
        "base_gib": base / 2**20,
        "peak_gib": peak / 2**20,
        "extra_gib": (peak - base) / 2**20,
        "seconds": seconds,
    }


def _whole_logits_gib(mode: str, length: int, vocab: int) -> float:
    """float32 logits-sized tensors a whole-sequence pass holds at once (forward: logits and
    the softmax; train step: their gradients too), for the skip decision."""
    return (2 if mode == "logprobs" else 4) * length * vocab * 4 / 2**30


def run_memory(
    model_dir: Path,
    small_dir: Path,
    vocab: int,
    lengths: tuple[int, ...] = LENGTHS,
    chunk: int = 1024,
    threads: int = 2,
    log: Any = print,
) -> dict:
    """All measurements (see module docstring), one fresh process each; returns the table."""
    from megatron_seed.models.parallel import spawn

    def measure(path: Path, mode: str, length: int, tokens: int) -> dict:
        return spawn(_measure_worker, 1, str(path), mode, length, tokens, threads)[0]

    out: dict[str, Any] = {}
    for mode in ("logprobs", "train_step"):
        rows = {}
        for length in lengths:
            small = measure(small_dir, mode, length, chunk)
            chunked = measure(model_dir, mode, length, chunk)
            floor = chunked["base_gib"] + small["extra_gib"]
            row: dict[str, Any] = {
                "floor_gib": floor,
                "activations_gib": small["extra_gib"],
                "chunked": {
                    **chunked,
                    "ratio_to_floor": chunked["peak_gib"] / floor,
                    "logits_share": (chunked["peak_gib"] - floor) / chunked["peak_gib"],
                },
            }
            need = _whole_logits_gib(mode, length, vocab) + chunked["peak_gib"]
            if need < 0.85 * _available_gib():
                whole = measure(model_dir, mode, length, 0)
                row["whole"] = {
                    **whole,
                    "ratio_to_floor": whole["peak_gib"] / floor,
                    "logits_share": (whole["peak_gib"] - floor) / whole["peak_gib"],
                }
            else:
                row["whole"] = {"skipped": f"needs ~{need:.1f} GiB, {_available_gib():.1f} free"}
            rows[str(length)] = row
            w = row["whole"]
            whole_txt = (
                f"whole {w['peak_gib']:6.2f} GiB ({w['ratio_to_floor']:.2f}x)"
                if "peak_gib" in w
                else f"whole skipped ({w['skipped']})"
            )
            c = row["chunked"]
            log(
                f"  {mode:10s} {length:5d} tokens  floor {floor:6.2f} GiB  chunked "
                f"{c['peak_gib']:6.2f} GiB ({c['ratio_to_floor']:.2f}x, logits "
                f"{100 * c['logits_share']:4.1f} %)  {whole_txt}"
            )
        out[mode] = rows
    return out


def write_results(result: dict, out: Path) -> None:
    """The results file (JSON)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
