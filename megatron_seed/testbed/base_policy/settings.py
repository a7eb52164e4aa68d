"""The settings that decide the tiny base policy (its cache key) and the build's constants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_seed.testbed import ENV

MANIFEST = "manifest.json"
MODEL_SUBDIR = "model"
TOKENIZER_SUBDIR = "tokenizer"
FORMAT_VERSION = 4  # 3: records carry the environment's facts (schema 2); 4: task options


class BasePolicyCacheError(RuntimeError):
    """A cache folder that cannot be reused (partial, corrupt, or built with other settings)."""


@dataclass(frozen=True)
class BasePolicySettings:
    """Everything that decides the built model (the cache key)."""

    env: str = ENV  # an environment with demonstration players (`EnvSpec.demos`)
    n_train_games: int = 200
    n_eval_games: int = 0  # held-out games for ``measure`` (the default job evaluates itself)
    families: tuple[str, ...] = ()  # task families of the generated games; () = all
    prompt_style: str = "compact"
    history_mode: str = "full"
    history_window: int = 2
    analyzer_layout: str = "continuation"  # needs history_mode "full"
    noisy_per_game: int = 2
    hinted_per_game: int = 1
    analysis_per_game: int = 1  # analyzer examples (embedded analyzer's answers)
    search: bool = True  # noisy demos search for the object in a random order
    mistake_prob: float = 0.05
    max_mistakes: int = 1
    max_demo_steps: int = 20
    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 4096
    train_steps: int = 600
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    eval_max_steps: int = 15
    eval_max_prompt_tokens: int = 3072
    seed: int = 0

    @classmethod
    def for_run(cls, size: str, seed: int, env: str = ENV) -> BasePolicySettings:
        """``env``'s base policy for the job size ``size`` (full, quick: about a minute,
        evidence; its `testbed.profiles` entry says what differs from the defaults)."""
        from megatron_seed.testbed.profiles import profile

        return cls(env=env, seed=seed, **profile(env).base_settings(size))

    @property
    def rendering(self) -> Rendering:
        """How the demonstrations' user messages are rendered."""
        return Rendering(self.prompt_style, self.history_mode, self.history_window)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def demo_settings(self) -> dict[str, Any]:
        """The fields the environment's demonstration players read."""
        keys = ("noisy_per_game", "hinted_per_game", "search", "mistake_prob", "max_mistakes")
        return {**{k: getattr(self, k) for k in keys}, "max_demo_steps": self.max_demo_steps,
                "seed": self.seed}  # fmt: skip

    def check(self) -> None:
        """Fail loud on settings the engines cannot run."""
        if self.hidden_size % self.num_heads or self.head_dim not in (32, 64):
            raise ValueError(f"head_dim must be 32 or 64 for vLLM CPU, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.n_train_games < 1 or self.n_eval_games < 0 or self.train_steps < 1:
            raise ValueError("need at least one training game and one training step")


@dataclass(frozen=True)
class Rendering:
    """How the agent loop renders user messages (``RolloutConfig``'s fields of that name)."""

    prompt_style: str = "compact"
    history_mode: str = "full"
    history_window: int = 2
