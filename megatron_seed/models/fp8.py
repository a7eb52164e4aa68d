"""FP8 recipes: what each needs from the GPU, Transformer Engine and the batch shapes.

Transformer Engine's FP8 GEMMs require the product of an input's leading dimensions to be a
multiple of the recipe's block (micro-batches are `[1, s]`: the sequence length) and the last
dimension a multiple of 16 (32 for MXFP8; Qwen hidden sizes are). `seq_multiple` is what
`collate` pads every student and teacher batch to, and `run_schedule` asserts it. The
recipes are checked against the device's compute capability when the trainer is built
(`check_fp8_support`), so an unsupported recipe is one line before any compute.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8Rule:
    """What one `ParallelConfig.fp8_recipe` needs."""

    seq_multiple: int  # tokens per micro-batch must be a multiple of this
    min_capability: tuple[int, int]  # CUDA compute capability (major, minor)
    gpus: str  # for the error message


FP8_RULES: dict[str, Fp8Rule] = {
    "delayed": Fp8Rule(16, (8, 9), "Ada/Hopper or newer"),
    "tensorwise": Fp8Rule(16, (8, 9), "Ada/Hopper or newer"),
    "blockwise": Fp8Rule(128, (9, 0), "Hopper or newer"),  # 128-element scaling blocks
    "mxfp8": Fp8Rule(32, (10, 0), "Blackwell or newer"),  # 32-element E8M0 blocks
}


def seq_multiple(fp8_recipe: str | None) -> int:
    """The sequence-length multiple batches must be padded to (1 without FP8)."""
    if fp8_recipe is None:
        return 1
    if fp8_recipe not in FP8_RULES:
        raise ValueError(f"unknown fp8_recipe {fp8_recipe!r}; choose from {list(FP8_RULES)}")
    return FP8_RULES[fp8_recipe].seq_multiple


def check_fp8_support(
    fp8_recipe: str | None, capability: tuple[int, int] | None, te_available: bool
) -> None:
    """`ValueError` (one line) unless this device and TE can run the recipe."""
    if fp8_recipe is None:
        return
    rule = FP8_RULES.get(fp8_recipe)
    if rule is None:
        raise ValueError(f"unknown fp8_recipe {fp8_recipe!r}; choose from {list(FP8_RULES)}")
    if capability is None:
        raise ValueError(f"fp8_recipe {fp8_recipe!r} needs a CUDA GPU ({rule.gpus})")
    if not te_available:
        raise ValueError(f"fp8_recipe {fp8_recipe!r} needs Transformer Engine, which is missing")
    if tuple(capability) < rule.min_capability:
        need = ".".join(map(str, rule.min_capability))
        have = ".".join(map(str, capability))
        raise ValueError(
            f"fp8_recipe {fp8_recipe!r} needs compute capability {need}+ ({rule.gpus}); "
            f"this GPU is {have}"
        )
