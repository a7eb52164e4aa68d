"""`seed check-parity --hf DIR --tp T --pp P [--ep E] [--tol X]`."""

from __future__ import annotations

import argparse
import json

from megatron_seed.errors import CommandError, positive
from megatron_seed.models.checks import validate_hf_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument(
        "--hf", required=True, help="HF checkpoint folder (config.json + safetensors)"
    )
    parser.add_argument("--tp", type=positive, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=positive, default=1, help="pipeline-parallel size")
    parser.add_argument(
        "--ep",
        type=positive,
        default=1,
        help="expert-parallel size (mixture-of-experts models; it must divide the experts)",
    )
    parser.add_argument("--tol", type=float, default=1e-4, help="max allowed |diff| (float32)")
    parser.add_argument("--batch", type=positive, default=4, help="random sequences compared")
    parser.add_argument("--seq", type=positive, default=64, help="tokens per sequence")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    """Score one random batch both ways; exit 1 above the tolerance."""
    from megatron_seed.models.parity import check_parity

    spec = validate_hf_dir(args.hf, args.tp, args.pp, args.ep)
    result = check_parity(args.hf, args.tp, args.pp, args.batch, args.seq, args.seed, args.ep)
    ok = result["max_abs_diff"] <= args.tol and result["ranks_agree"] and result["roundtrip_exact"]
    result.update(ok=ok, tol=args.tol, tp=args.tp, pp=args.pp, ep=args.ep)
    result.update(model_type=spec.model_type)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{spec.model_type} TP={args.tp} PP={args.pp} EP={args.ep}: max |logprob diff| = "
            f"{result['max_abs_diff']:.3e} over {result['tokens']} tokens (tol {args.tol:g}); "
            f"HF->Megatron->HF {'bit-exact' if result['roundtrip_exact'] else 'MISMATCH'}"
        )
    if not ok:
        raise CommandError(
            f"parity failed: max diff {result['max_abs_diff']:.3e} > {args.tol:g}"
            if result["max_abs_diff"] > args.tol
            else f"parity failed: round trip mismatched {result['mismatched'][:3]}"
        ) from None
    return 0
