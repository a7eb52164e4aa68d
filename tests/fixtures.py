"""Session fixtures: the expensive worlds, built once per test session and shared read-only.

- `alfworld_games`: six generated ALFWorld games per split, one of each family (~18 s).
- `tiny_world`: six generated ALFWorld games and a random tiny Qwen2 whose tokenizer knows
  their prompts (`testbed.tiny_world`, ~10 s). Tests write their outputs under their own
  `tmp_path`, never into the world.
- `quick_job`: the default job, `seed run --quick --updates 4 --eval-episodes 2` (games, the
  base policy, Stage 1, Stage 2, evaluation, report: ~4 minutes; `seed run --quick` runs the
  recipe's 12 updates and 8 evaluation episodes per training game). Tests read its folder; the default job's own rerun test is the only one that
  runs the command on it again.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# Stage-2 updates of the tested quick job (the recipe runs 12): 4 keep the winners-over-
# losers direction test_default_job asserts well clear of its 0.02 margin (0.23 nats measured)
QUICK_JOB_UPDATES = 4
QUICK_JOB_EVAL_EPISODES = 2  # sampled evaluation episodes per training game (the size's: 8)


@pytest.fixture(scope="session")
def alfworld_games(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT with six generated ALFWorld games (one per family) in each split, seed 7."""
    from envs.alfworld.games import generate_games

    root = tmp_path_factory.mktemp("alfworld_games")
    for split in ("train", "seen", "unseen"):
        generate_games(root, split, n=6, seed=7)
    return root


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT with ROOT/games/train/... (6 games) and ROOT/model (HF checkpoint + tokenizer)."""
    from megatron_seed.testbed.tiny_world import make_tiny_world

    return make_tiny_world(tmp_path_factory.mktemp("tiny_world"))


@pytest.fixture(scope="session")
def qwen25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`seed init-model --shape qwen2.5-0.5b --layers 2`: real width and vocabulary."""
    from megatron_seed import cli

    out = tmp_path_factory.mktemp("init") / "qwen2.5-0.5b"
    argv = ["init-model", "--shape", "qwen2.5-0.5b", "--layers", "2", "--out", str(out)]
    assert cli.main(argv) == 0
    return out


@dataclass(frozen=True)
class QuickJob:
    """A finished `seed run --quick` (its folder, the command and its captured run)."""

    out: Path
    command: list[str]
    proc: subprocess.CompletedProcess
    seconds: float


@pytest.fixture(scope="session")
def quick_job(tmp_path_factory: pytest.TempPathFactory) -> QuickJob:
    out = tmp_path_factory.mktemp("default_job") / "run"
    cmd = [sys.executable, "-m", "megatron_seed.cli", "run", "--quick", "--out", str(out)]
    cmd += ["--updates", str(QUICK_JOB_UPDATES), "--eval-episodes", str(QUICK_JOB_EVAL_EPISODES)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return QuickJob(out, cmd, proc, time.perf_counter() - start)


def random_loss_inputs(seed: int, b: int = 8, s: int = 11) -> dict[str, torch.Tensor]:
    """Seeded inputs of the loss functions: log-probs [b, s] (some ratios outside the clip
    band), advantages [b], a token mask and a per-row OPD mask."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, s, generator=g) * 4
    return {
        "logp": old + 0.3 * torch.randn(b, s, generator=g),  # some ratios leave the clip band
        "old_logp": old,
        "ref_logp": old + 0.2 * torch.randn(b, s, generator=g),
        "teacher_logp": old + torch.randn(b, s, generator=g),
        "advantages": torch.randn(b, generator=g),
        "mask": torch.rand(b, s, generator=g) > 0.4,
        "opd_mask": torch.rand(b, generator=g) > 0.3,
    }
