"""Typed configuration. Every default lives here, once.

The defaults are the paper's (SEED, Table 5) unless a comment says otherwise. Recipes
(`launch/recipes.py`, the default CPU job) are functions that return a `SeedConfig` with
only their differences applied via `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class ParallelConfig:
    """Megatron layout of the trainer. DP is whatever world_size / (tp * pp) leaves."""

    tp: int = 1
    pp: int = 1
    # GPU only: "bf16" or "fp32"; CPU always runs float32.
    precision: Literal["fp32", "bf16"] = "bf16"
    # GPU only, needs Transformer Engine: None, "delayed", "tensorwise", "mxfp8", "blockwise".
    fp8_recipe: str | None = None


@dataclass(frozen=True)
class AlgoConfig:
    """The joint objective L = L_grpo + beta_kl * KL + lambda_opd * L_opd (paper Table 5)."""

    clip_eps: float = 0.2
    beta_opd: float = 5.0
    lambda_opd: float = 0.01
    beta_kl: float = 0.01
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    adv_eps: float = 1e-6
    # "live": teacher log-probs with the current weights per mini-batch (the paper).
    # "snapshot": once per batch with theta_old (the reference code; cheaper).
    teacher_mode: Literal["live", "snapshot"] = "live"
    # False turns SEED into plain GRPO (no analyzer, no teacher pass).
    use_opd: bool = True
    # How L_rl averages: over all action tokens of the batch (the paper's masked token mean)
    # or over sequences, each the mean of its own tokens (a long failure weighs no more
    # than a short success).
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"


@dataclass(frozen=True)
class OptimConfig:
    """Adam with global-norm gradient clipping."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    mini_batches_per_update: int = 1
    # passes over each update's batch (PPO epochs); every pass steps once per mini-batch
    epochs_per_update: int = 1
    micro_batch_size: int = 1


@dataclass(frozen=True)
class RolloutConfig:
    """Episode collection (paper Table 5, ALFWorld)."""

    tasks_per_update: int = 16
    group_size: int = 8
    max_steps: int = 30
    max_prompt_tokens: int = 2048
    max_response_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    # "full": one chat per trajectory, all turns scored in one pass (the paper's h_t).
    # "window": one prompt per turn holding the last `history_window` turns (reference code).
    history_mode: Literal["full", "window"] = "full"
    history_window: int = 2
    invalid_action_penalty: float = 0.0
    # "paper": the paper's actor prompt (Figure 11); "compact": task + observation only
    # (envs.alfworld_prompt; the tiny CPU policy's)
    prompt_style: Literal["paper", "compact"] = "paper"


@dataclass(frozen=True)
class SkillConfig:
    """Hindsight-skill analysis and insertion."""

    # Where H inserts the skill: after the "Your task is to:" line, or in the system message.
    insert_at: Literal["task_line", "system"] = "task_line"
    # "record": one user message holding the serialised trajectory (the paper).
    # "continuation": the request appended after the episode's own chat (prefix-cache friendly).
    analyzer_layout: Literal["record", "continuation"] = "record"
    min_words: int = 5
    max_retries: int = 2
    max_tokens: int = 4096
    temperature: float = 0.0


@dataclass(frozen=True)
class SeedConfig:
    """One training run."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    skill: SkillConfig = field(default_factory=SkillConfig)
    updates: int = 150
    sft_epochs: int = 3
    sft_lr: float = 1e-5  # the paper gives none for Stage 1; a common full-SFT rate
    sft_batch_size: int = 16
    collect_rollouts_per_task: int = 8  # K0 (paper: 180 tasks x 8 = 1,440 trajectories)
    seed: int = 1234
    save_every: int = 10

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view (for the run's `config.json`)."""
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the exact config used, as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeedConfig:
        """Inverse of `to_dict`; unknown keys are an error (fail loud on typos)."""
        sections = {
            "parallel": ParallelConfig,
            "algo": AlgoConfig,
            "optim": OptimConfig,
            "rollout": RolloutConfig,
            "skill": SkillConfig,
        }
        kwargs: dict[str, Any] = {}
        top = {f.name for f in dataclasses.fields(cls)}
        for key, value in data.items():
            if key not in top:
                raise ValueError(f"unknown config key {key!r}; known: {sorted(top)}")
            if key in sections:
                known = {f.name for f in dataclasses.fields(sections[key])}
                bad = set(value) - known
                if bad:
                    raise ValueError(
                        f"unknown keys in {key!r}: {sorted(bad)}; known: {sorted(known)}"
                    )
                kwargs[key] = sections[key](**value)
            else:
                kwargs[key] = value
        return cls(**kwargs)
