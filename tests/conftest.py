"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

TINY_CORPUS = [
    "You are an expert agent operating in the ALFRED Embodied Environment.",
    "Your task is to: put a clean mug in coffeemachine.",
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, "
    "a countertop 2, a drawer 3, a fridge 1, a sinkbasin 1 and a toilet 1.",
    "<think>I should find the mug first.</think><action>go to countertop 2</action>",
    "You arrive at countertop 2. On the countertop 2, you see a mug 1 and a candle 3.",
    "take mug 1 from countertop 2. clean mug 1 with sinkbasin 1. move mug 1 to coffeemachine 1.",
    "Nothing happens. Your admissible actions of the current situation are: ['look'].",
    "[Hindsight skill] Workflow: locate the object, clean it, then place it. Avoid loops.",
]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A byte-level BPE with Qwen's special tokens and chat template (~0.1 s to train)."""
    from megatron_seed.testbed.tokenizer import build_tokenizer

    return build_tokenizer(TINY_CORPUS * 4, vocab_size=512)


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests need CUDA; skip them (with the reason) elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
