"""`seed sft`: hindsight-skill SFT (Stage 1) on annotated trajectories.

    seed sft --data annotated.jsonl --model DIR --out DIR [--epochs 3] [--lr 1e-5]
             [--batch 16] [--tp T --pp P --dp D] [--layout record|continuation]

Trains NLL on the analyzer's answer tokens only and writes OUT/hf (theta_sft, HF format),
OUT/megatron (dist-checkpoint) and OUT/sft_curve.json.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from megatron_seed.errors import CommandError, output_dir, positive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument("--data", required=True, help="annotated trajectories (JSONL records)")
    parser.add_argument("--model", required=True, help="base policy (HF folder with tokenizer)")
    parser.add_argument("--out", required=True, help="output folder (megatron/ and hf/)")
    parser.add_argument("--epochs", type=positive, default=None, help="default: the config's")
    parser.add_argument("--lr", type=float, default=None, help="default: the config's")
    parser.add_argument(
        "--batch", type=positive, default=None, help="examples per step (default: the config's)"
    )
    parser.add_argument("--tp", type=positive, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=positive, default=1, help="pipeline-parallel size")
    parser.add_argument("--dp", type=positive, default=1, help="data-parallel size")
    parser.add_argument(
        "--layout",
        choices=["record", "continuation"],
        default=None,
        help="the analyzer prompt's layout (default: the config's)",
    )


def run(args: argparse.Namespace) -> int:
    """Validate inputs, then fine-tune."""
    from megatron_seed.config import SeedConfig
    from megatron_seed.data import read_jsonl
    from megatron_seed.models.checks import validate_policy_dir
    from megatron_seed.pipeline.stage1 import run_sft

    validate_policy_dir(args.model, args.tp, args.pp)
    if not Path(args.data).is_file():
        raise CommandError(f"no such file: {args.data}")
    records = list(read_jsonl(args.data))  # a line that is no record: one line naming it
    cfg = SeedConfig()
    cfg = dataclasses.replace(
        cfg,
        sft_epochs=args.epochs or cfg.sft_epochs,
        sft_lr=args.lr or cfg.sft_lr,
        sft_batch_size=args.batch or cfg.sft_batch_size,
        parallel=dataclasses.replace(cfg.parallel, tp=args.tp, pp=args.pp),
        skill=dataclasses.replace(
            cfg.skill, analyzer_layout=args.layout or cfg.skill.analyzer_layout
        ),
    )
    accepted = sum(r.has_teacher for r in records)
    if not accepted:
        raise CommandError(f"{args.data} has no accepted skills ({len(records)} records)")
    result = run_sft(args.model, records, output_dir(args.out), cfg, dp=args.dp)
    curve = result["curve"]
    print(
        f"SFT on {accepted}/{len(records)} accepted pairs: NLL {curve[0]['nll']:.3f} -> {curve[-1]['nll']:.3f}"
    )
    print(f"wrote {Path(args.out) / 'hf'}")
    return 0
