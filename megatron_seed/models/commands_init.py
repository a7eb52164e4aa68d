"""`seed init-model --shape NAME --out DIR [--seed S] [--layers L] [--experts E] [--dtype D]`.

Writes a random-weight HF checkpoint of a real Qwen or Llama shape with a Qwen-format
tokenizer laid out as the shape's vocabulary and the family's chat template
(`megatron_seed.models.init_model`), e.g. for CPU runs of the real widths and vocabulary:
`seed init-model --shape qwen2.5-0.5b --layers 2 --out m`, `--shape smollm2-135m`.
"""

from __future__ import annotations

import argparse

from megatron_seed.errors import CommandError, output_dir, positive
from megatron_seed.files import staged_folder
from megatron_seed.models.shapes import SHAPES, ModelShape

_SIZES = (
    "Full depth needs the whole model on disk (float32: 0.5B ~2.0 GB, 1.5B ~6.2 GB, 3B "
    "~12 GB, 7B ~30 GB; half in bfloat16; about 4 s per GB on 2 cores) but only one shard "
    "(at most 2 GiB, or the 7B's 2.2 GB embedding) in memory at a time: ~3 GB peak."
)


def init_shapes() -> dict[str, ModelShape]:
    """The shapes `--shape` accepts: the published ones of `models.shapes.SHAPES` (a hub id,
    "org/name"; the tiny test shapes are not)."""
    return {name: s for name, s in SHAPES.items() if "/" in s.hf_id}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Command-line flags."""
    from megatron_seed.models.init_model import DTYPES

    parser.epilog = _SIZES
    parser.add_argument(
        "--shape", required=True, help=f"one of: {', '.join(init_shapes())} (models/shapes.py)"
    )
    parser.add_argument("--out", required=True, help="output folder (new or empty)")
    parser.add_argument("--seed", type=int, default=0, help="weights are a function of it")
    parser.add_argument(
        "--layers", type=int, default=None, help="depth (default: the shape's); width is kept"
    )
    parser.add_argument(
        "--experts",
        type=positive,
        default=None,
        help="MoE shapes: experts per layer (default: the shape's; at least its top-k); "
        "each kept expert has the real width",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        help=f"weights dtype: {' or '.join(DTYPES)} (default float32, what the CPU runs use)",
    )


def run(args: argparse.Namespace) -> int:
    """Validate, write, print one line per shard and a summary."""
    from megatron_seed.models.init_model import check_request, with_experts, write_checkpoint

    out = output_dir(args.out)
    shapes = init_shapes()
    if args.shape not in shapes:
        raise CommandError(f"unknown shape {args.shape!r}; choose from {', '.join(shapes)}")
    try:
        shape = with_experts(shapes[args.shape], args.experts)
        check_request(shape, out, args.layers, args.dtype)
    except ValueError as err:
        raise CommandError(str(err)) from None
    layers = shape.layers if args.layers is None else args.layers
    with staged_folder(out) as stage:  # whole, or nothing at --out
        write_checkpoint(shape, stage, args.seed, layers, args.dtype, log=print)
    experts = f", {shape.experts} experts (top-{shape.top_k})" if shape.experts else ""
    print(
        f"wrote {out}: {shape.hf_id} shape ({shape.model_type}), {layers} of {shape.layers} "
        f"layers{experts}, {args.dtype}, seed {args.seed}"
    )
    return 0
