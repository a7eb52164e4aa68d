"""`seed convert`: HF -> Megatron dist-checkpoint and Megatron -> HF.

  seed convert hf-to-megatron --hf DIR --out DIR [--tp T --pp P --ep E]
  seed convert megatron-to-hf --megatron DIR --out DIR [--tp T --pp P --ep E]
  seed convert hf-to-hf --hf DIR --out DIR [--tp T --pp P --ep E]   (round trip via Megatron)
  seed convert gguf-to-hf --gguf FILE --out DIR   (dequantized to float32: `gguf_import`)

The Megatron side is a dist-checkpoint (`megatron.core.dist_checkpointing`), loadable into
any TP x PP (x EP for mixture-of-experts models) layout; the folder also keeps the HF
`config.json` and tokenizer files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from megatron_seed.errors import CommandError, new_output_dir, positive
from megatron_seed.files import staged_folder
from megatron_seed.models.checks import validate_hf_dir, validate_megatron_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    parser.add_argument(
        "direction",
        choices=["hf-to-megatron", "megatron-to-hf", "hf-to-hf", "gguf-to-hf"],
        help="which way to convert",
    )
    parser.add_argument("--hf", help="HF checkpoint folder (input)")
    parser.add_argument("--megatron", help="Megatron checkpoint folder (input)")
    parser.add_argument("--gguf", help="GGUF file (input of gguf-to-hf)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--tp", type=positive, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=positive, default=1, help="pipeline-parallel size")
    parser.add_argument(
        "--ep", type=positive, default=1, help="expert-parallel size (mixture-of-experts models)"
    )


def _convert_worker(direction: str, src: str, out: str, tp: int, pp: int, ep: int = 1) -> str:
    from megatron_seed.models import checkpoint
    from megatron_seed.models.convert import (
        HFCheckpoint,
        export_hf_weights,
        load_hf_weights,
        save_hf_checkpoint,
    )
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.models.qwen import QwenSpec, build_gpt_model

    init_parallel(tp, pp, ep=ep)
    import torch.distributed as dist

    if direction in ("hf-to-megatron", "hf-to-hf"):
        ckpt = HFCheckpoint(src)
        spec, hf_config, tok_dir = (
            ckpt.spec,
            json.loads((Path(src) / "config.json").read_text()),
            src,
        )
        model = build_gpt_model(spec)
        load_hf_weights(model, ckpt)
    else:
        hf_config = json.loads((Path(src) / "hf" / "config.json").read_text())
        spec, tok_dir = QwenSpec.from_hf_config(hf_config), str(Path(src) / "hf")
        model = build_gpt_model(spec)
        checkpoint.load_model(model, src)
    if direction == "hf-to-megatron":
        checkpoint.save_model(model, out, hf_config=hf_config, tokenizer_from=tok_dir)
    else:
        stream = export_hf_weights(model, spec)
        if dist.get_rank() == 0:
            save_hf_checkpoint(stream, out, hf_config, tokenizer_from=tok_dir)
        else:
            for _ in stream:
                pass
    return out


def run(args: argparse.Namespace) -> int:
    """Validate the inputs, then convert in TP x PP x EP processes (a GGUF file in this one)."""
    from megatron_seed.models.parallel import spawn

    if args.direction == "gguf-to-hf":
        return _gguf_to_hf(args)
    if args.gguf:
        raise CommandError(f"--gguf is read by gguf-to-hf only, not by {args.direction}")
    if args.direction in ("hf-to-megatron", "hf-to-hf"):
        if not args.hf:
            raise CommandError(f"{args.direction} needs --hf DIR")
        validate_hf_dir(args.hf, args.tp, args.pp, args.ep)
        src = args.hf
    else:
        if not args.megatron:
            raise CommandError("megatron-to-hf needs --megatron DIR")
        src = args.megatron
        validate_megatron_dir(src, args.tp, args.pp, args.ep)
    world = args.tp * args.pp * args.ep
    with staged_folder(new_output_dir(args.out)) as stage:  # whole, or nothing at --out
        spawn(_convert_worker, world, args.direction, src, str(stage), args.tp, args.pp, args.ep)
    print(f"wrote {args.out}")
    return 0


def _gguf_to_hf(args: argparse.Namespace) -> int:
    """`seed convert gguf-to-hf`: check the file (one-line refusals), then import it."""
    from megatron_seed.models.gguf_import import GGUFError, gguf_to_hf

    if not args.gguf:
        raise CommandError("gguf-to-hf needs --gguf FILE")
    ignored = [f"--{k}" for k in ("hf", "megatron") if getattr(args, k)]
    ignored += [f"--{k}" for k in ("tp", "pp", "ep") if getattr(args, k) != 1]
    if ignored:  # the import runs in this process and reads the GGUF file alone
        raise CommandError(f"gguf-to-hf reads --gguf and --out only, not {' '.join(ignored)}")
    out = new_output_dir(args.out)
    try:
        with staged_folder(out) as stage:  # the file is checked before anything is written
            gguf_to_hf(args.gguf, stage, log=print)
    except GGUFError as err:
        raise CommandError(str(err)) from None
    print(f"wrote {args.out}")
    return 0
