"""Shared pytest fixtures, and the tiers: a test's tier is its folder.

| folder              | marker        | what belongs there                                       |
| ------------------- | ------------- | -------------------------------------------------------- |
| `tests/unit`        | `unit`        | pure code, seconds; no process, engine or Ray started    |
| `tests/distributed` | `distributed` | gloo processes, Ray, engines, servers, real-size models |
| `tests/e2e`         | `e2e`, `slow` | whole jobs (`seed train`, `seed run`, launches)          |
| `tests/gpu`         | `gpu`         | needs CUDA; skipped without it                           |

`python -m pytest -q -m "not distributed and not e2e"` is the quick loop. Heavy set-up is
built once per session and shared (`tests/fixtures.py`); `docs/testing.md` keeps the budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import (  # noqa: F401  (session fixtures, shared by every tier)
    alfworld_games,
    quick_job,
    qwen25,
    tiny_world,
)

TIERS = ("unit", "distributed", "e2e", "gpu")
HERE = Path(__file__).resolve().parent

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
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    return build_tokenizer(TINY_CORPUS * 4, vocab_size=512)


def tier_of(path: Path) -> str:
    """The tier of a test file: the folder under tests/ it lives in (a one-line error for a
    test outside the four)."""
    parts = path.resolve().relative_to(HERE).parts
    if len(parts) < 2 or parts[0] not in TIERS:
        raise pytest.UsageError(f"{path}: a test lives in one of tests/{{{','.join(TIERS)}}}/")
    return parts[0]


def pytest_collection_modifyitems(config, items):
    """Each test gets its folder's tier marker (e2e tests also `slow`); a tier marker set by
    hand that disagrees with the folder is an error. GPU tests are skipped without CUDA,
    container tests unless `-m` names them."""
    import torch

    skip_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    # image builds take many minutes: container tests run when `-m` names them
    asked = "container" in (config.getoption("markexpr") or "")
    skip_container = pytest.mark.skip(reason="builds the image: run with -m container")
    for item in items:
        if item.get_closest_marker("container") and not asked:
            item.add_marker(skip_container)
        tier = tier_of(Path(item.fspath))
        wrong = [m.name for m in item.iter_markers() if m.name in TIERS and m.name != tier]
        if wrong:
            raise pytest.UsageError(f"{item.nodeid}: marked {wrong[0]} but lives in tests/{tier}")
        item.add_marker(tier)
        if tier == "e2e":
            item.add_marker("slow")
        if tier == "gpu" and skip_gpu is not None:
            item.add_marker(skip_gpu)


@pytest.fixture
def job_paths(monkeypatch) -> None:
    """SEED_MODEL_DIR / SEED_GAMES_DIR / SEED_OUT_DIR, the paths a launched `seed train`
    job needs, as a user's shell would export them."""
    for key in ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR"):
        monkeypatch.setenv(key, "/shared/" + key.split("_")[1].lower())


@pytest.fixture(scope="session")
def tp_checkpoint(tmp_path_factory, tiny_tokenizer) -> tuple[str, str]:
    """(model folder, tokenizer folder): a tiny random Qwen2 whose vocabulary divides by
    every TP size the layout tests use, and the tiny tokenizer."""
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    root = tmp_path_factory.mktemp("tp_checkpoint")
    save_tokenizer(tiny_tokenizer, root / "tok")
    vocab = -(-len(tiny_tokenizer) // 4) * 4  # divisible by TP
    make_tiny_qwen(root / "model", vocab_size=vocab)
    return str(root / "model"), str(root / "tok")
