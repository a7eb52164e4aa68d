"""A tiny world (the test bed's environment, ALFWorld) for end-to-end tests: generated games, a tokenizer trained on their
rendered prompts, and a random tiny Qwen2 (head_dim 32, for vLLM's CPU attention)."""

from __future__ import annotations

import random
from pathlib import Path


def make_tiny_world(root: Path, n_games: int = 6, seed: int = 1) -> Path:
    """Write ROOT/games/train/... and ROOT/model (HF checkpoint + tokenizer); return ROOT."""
    from envs.spec import get_env
    from megatron_seed.models.tiny import make_tiny_policy
    from megatron_seed.models.tiny_tokenizer import build_tokenizer
    from megatron_seed.testbed import ENV

    spec = get_env(ENV)
    games = spec.generate_tasks(root / "games", "train", n_games, seed)
    style = spec.prompts("paper")
    env, rng, corpus = spec.make_env(6), random.Random(seed), [style.system_prompt]
    for game in games[:3]:
        obs, info = env.reset(game)
        corpus.append(style.first(info["task"], obs, info["admissible_actions"]))
        for t in range(3):
            action = rng.choice(info["admissible_actions"])
            corpus.append(f"<action>{action}</action>")
            obs, _, _, info = env.step(action)
            corpus.append(style.step(t + 1, obs, info["admissible_actions"]))
    make_tiny_policy(root / "model", build_tokenizer(corpus * 3, 1500))
    return root


def train_command(
    root: Path, out: Path, config: dict, *extra: str, model: Path | None = None
) -> list[str]:
    """`seed train` of the tiny recipe on a tiny world (its model, or `model`), with `config`
    as --config-json."""
    import json
    import sys

    model = model or root / "model"
    return [
        sys.executable, "-m", "megatron_seed.cli", "train",
        "--model", str(model), "--games", str(root / "games"), "--out", str(out),
        "--recipe", "tiny", "--config-json", json.dumps(config), *extra,
    ]  # fmt: skip
