"""Typed configuration. Every default lives here, once.

The defaults are the paper's (SEED, Table 5) unless a comment says otherwise. Recipes
(`megatron_seed.recipes`, the default CPU job) are functions that return a `SeedConfig` with
only their differences applied via `dataclasses.replace`.

Every field is checked when a config is built or loaded: a numeric field against its range
(`_range` metadata), a `Literal` field against its choices, a bool against bool. A bad value
raises `ConfigError` naming the field and what is allowed (the `seed` command prints it as
one line and exits with code 2, before Ray, engines or the trainer start).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envs.spec import DEFAULT_ENV
from megatron_seed.errors import ConfigError

_INF = math.inf


def _range(default: Any, lo: float = -_INF, hi: float = _INF, *, open_lo: bool = False) -> Any:
    """A numeric field with its allowed range [lo, hi] ((lo, hi] with `open_lo`)."""
    return field(default=default, metadata={"range": (lo, hi, open_lo)})


def _describe(lo: float, hi: float, open_lo: bool) -> str:
    left = f"> {lo:g}" if open_lo else f">= {lo:g}"
    if hi == _INF:
        return left
    return f"in ({lo:g}, {hi:g}]" if open_lo else f"in [{lo:g}, {hi:g}]"


def check_fields(obj: Any, section: str) -> None:
    """Type and range checks of one config dataclass (`ConfigError` on the first bad field)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, name, hint = getattr(obj, f.name), f"{section}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(value):
            continue
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            if value not in choices:
                raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
            continue
        if hint is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
            continue
        if hint in (int, float):
            ok = isinstance(value, int if hint is int else (int, float))
            if not ok or isinstance(value, bool):
                raise ConfigError(
                    f"{name} must be a{'n int' if hint is int else ' number'}, got {value!r}"
                )
            lo, hi, open_lo = f.metadata.get("range", (-_INF, _INF, False))
            inside = (value > lo if open_lo else value >= lo) and value <= hi
            if not inside or (hint is float and math.isnan(value)):
                raise ConfigError(f"{name} must be {_describe(lo, hi, open_lo)}, got {value!r}")


class _Checked:
    """Mixin: field checks on construction (`dataclasses.replace` re-checks too)."""

    def __post_init__(self) -> None:
        check_fields(self, f"{_SECTION_OF.get(type(self).__name__, '')}")


@dataclass(frozen=True)
class ParallelConfig(_Checked):
    """Megatron layout of the trainer. DP is whatever world_size / (tp * pp) leaves."""

    tp: int = _range(1, 1)
    pp: int = _range(1, 1)
    # expert parallel (mixture-of-experts models): each MoE layer's experts are split over
    # `ep` ranks of a data-parallel group (tokens reach them by all-to-all); EP must divide
    # DP and the expert count; an expert's own weights are split over TP as dense ones are
    ep: int = _range(1, 1)
    # GPU only: "bf16" or "fp32"; CPU always runs float32.
    precision: Literal["fp32", "bf16"] = "bf16"
    # GPU only, needs Transformer Engine (megatron_seed/models/fp8.py: what each needs)
    fp8_recipe: Literal[None, "delayed", "tensorwise", "mxfp8", "blockwise"] = None
    # GPU only: Megatron's distributed optimizer (fp32 master weights and Adam state sharded
    # over DP; it refuses CPU tensors). The launcher's memory estimate reads it too.
    distributed_optimizer: bool = False
    # activation recompute: "full" keeps only each layer's input (recomputes the layer in
    # backward), "selective" recomputes core attention, "none" keeps everything
    recompute: Literal["none", "selective", "full"] = "none"
    # where the trainer runs, decided once at start-up: "cuda" fails at once when CUDA is
    # unusable (a GPU job never falls back to slow CPU training), "cpu" when CUDA is visible,
    # "auto" takes CUDA when it is there (the GPU recipes say "cuda")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # the output layer and cross entropy run over chunks of about this many tokens
    # (models/chunked.py): float32 logits O(chunk x vocab / TP) instead of O(micro-batch
    # tokens x vocab / TP); 0 scores the whole micro-batch at once
    logit_chunk_tokens: int = _range(512, 0)


@dataclass(frozen=True)
class AlgoConfig(_Checked):
    """The joint objective L = L_grpo + beta_kl * KL + lambda_opd * L_opd (paper Table 5).

    The fields after `loss_agg` turn it into the paper's baselines (`algo/baselines.py`
    gives each method's settings): L = policy_weight * L_grpo + beta_kl * KL + D, with D the
    `distill` term and L_grpo's advantages optionally RLSD's. Their defaults are SEED's
    objective, computed bit for bit as without them.
    """

    clip_eps: float = _range(0.2, 0.0, 1.0, open_lo=True)
    beta_opd: float = _range(5.0, 0.0)
    lambda_opd: float = _range(0.01, 0.0)
    beta_kl: float = _range(0.01, 0.0)
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    # the GRPO advantage's (R - mu) / (sigma + adv_eps)
    adv_eps: float = _range(1e-6, 0.0, open_lo=True)
    # "live": teacher log-probs with the current weights per mini-batch (the paper).
    # "snapshot": once per batch with theta_old (the reference code; cheaper).
    teacher_mode: Literal["live", "snapshot"] = "live"
    # False turns SEED into plain GRPO (no analyzer, no teacher pass).
    use_opd: bool = True
    # How L_rl averages: over all action tokens of the batch (the paper's masked token mean)
    # or over sequences, each the mean of its own tokens (a long failure weighs no more
    # than a short success).
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    # Weight on L_grpo: 1 for every method but OPSD, whose 0 leaves L_grpo out of the loss
    # (still logged as loss/policy), so the gradient is the teacher term's (+ KL's) alone.
    policy_weight: float = _range(1.0, 0.0)
    # The teacher term D, used when use_opd (the teacher pass): "opd" is SEED's and SDAR's
    # lambda_opd * L_opd (beta_opd 0 gives the reference stack's GRPO+OPSD and, with
    # policy_weight 0, its OPSD); "iw_reverse_kl" is Skill-SD's lambda_iw * E[rho_on k3'];
    # "reverse_kl_pg" is original OPSD's sampled-token -lambda_opd * E[sg(l_T - l) l].
    distill: Literal["opd", "iw_reverse_kl", "reverse_kl_pg"] = "opd"
    lambda_iw: float = _range(0.001, 0.0)  # Skill-SD's weight (reference stack)
    # "rlsd": each token's advantage becomes A [(1 - lam) + lam clip(exp(sign(A) (l_T -
    # l_old)), 1 - rlsd_eps_w, 1 + rlsd_eps_w)] (RLSD; needs use_opd for l_T), lam falling
    # linearly from rlsd_lambda0 at update 0 to 0 at update rlsd_decay_updates (reference
    # stack 100, RLSD paper 50); seed_loss then needs update=
    advantage_reweight: Literal["none", "rlsd"] = "none"
    rlsd_lambda0: float = _range(0.5, 0.0, 1.0)
    rlsd_decay_updates: int = _range(100, 1)
    rlsd_eps_w: float = _range(0.2, 0.0, 1.0)
    # Analyzer replay (beyond the paper; off at 0): each update adds replay_weight x the
    # Stage-1 hindsight-skill NLL (answer tokens of the analyzer request) of
    # replay_examples stored Stage-1 examples, drawn anew per update, to every optimizer
    # step, so that the policy's own analyzer keeps its format while RL moves the actor
    replay_weight: float = _range(0.0, 0.0)
    replay_examples: int = _range(4, 1)
    # Mixture-of-experts models: the routers' load-balancing loss (Switch, megatron-core's
    # "aux_loss": E * sum_i f_i * P_i per MoE layer and micro-batch) with this weight: the
    # update minimises L + moe_aux_loss * (mean over its micro-batches of the sum over MoE
    # layers) over the real tokens of each micro-batch. Off by default, as RL trainers run
    # MoE models
    moe_aux_loss: float = _range(0.0, 0.0)
    # Mixture-of-experts models: rollout routing replay (R3). After the rollouts the engines
    # report the experts each MoE layer picked for every token of every student and teacher
    # sequence, and every trainer pass over them routes those tokens there
    # (`models.routing_replay`). Either way the share of scored tokens on which the
    # trainer's own routers agree with the engines' is logged (`moe/route_agreement`)
    routing_replay: bool = False
    # with routing replay off: the routes of this many student sequences per update are
    # read back for that share (0: none, no metric; not with one-step-off either)
    route_check_rows: int = _range(8, 0)
    # An optimizer step whose rows carry no outcome signal (every advantage 0: each group
    # tied, all won or all lost). "skip" (this project's rule): no step, the Adam state
    # untouched, so the distillation and KL terms alone never move the policy: Adam is
    # scale-free, and a step of them alone is an lr-sized step whatever lambda_opd is
    # (docs/architecture.md, "What an update does without an outcome signal"). "step": the
    # paper's equations, which step on whatever the loss holds. Methods without L_rl
    # (policy_weight 0, OPSD) always step. A skipped step skips analyzer replay's NLL too.
    no_signal: Literal["skip", "step"] = "skip"
    # Negative control (`grpo-shuffled`): the records' advantages permuted at random within
    # each update's batch, so the step has GRPO's size and no relation to outcomes
    shuffle_advantages: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.use_opd and (self.distill != "opd" or self.advantage_reweight != "none"):
            raise ConfigError(
                "algo.distill and algo.advantage_reweight use the teacher's log-probs: they "
                "need algo.use_opd = true"
            )
        if not self.use_opd and self.policy_weight == 0 and self.beta_kl == 0:
            raise ConfigError(
                "algo.policy_weight = 0 with beta_kl = 0 and use_opd = false leaves no loss term"
            )


@dataclass(frozen=True)
class OptimConfig(_Checked):
    """Adam with global-norm gradient clipping."""

    lr: float = _range(1e-6, 0.0, open_lo=True)
    weight_decay: float = _range(0.0, 0.0)
    adam_beta1: float = _range(0.9, 0.0, 1.0)
    adam_beta2: float = _range(0.999, 0.0, 1.0)
    adam_eps: float = _range(1e-8, 0.0, open_lo=True)
    clip_grad: float = _range(1.0, 0.0, open_lo=True)
    mini_batches_per_update: int = _range(1, 1)
    # passes over each update's batch (PPO epochs); every pass steps once per mini-batch
    epochs_per_update: int = _range(1, 1)
    micro_batch_size: int = _range(1, 1)
    # > 0: sequence packing. Each micro-batch is one row of whole sequences concatenated
    # without padding, at most this many tokens (a longer sequence is never split: rows
    # widen to it), attention and positions restarting at every sequence (`data.packing`);
    # micro_batch_size is then unused. 0: right-padded rows, micro_batch_size per micro-batch
    micro_batch_tokens: int = _range(0, 0)
    # the learning rate per Stage-2 update (`train.schedule.lr_at`): a linear warm-up from
    # lr / (warmup + 1) over the first lr_warmup_updates, then constant or decaying
    # (cosine, linear) to lr * lr_min_ratio at the run's last update (`updates`: a resumed
    # run given more updates stretches a decay from where it is)
    lr_warmup_updates: int = _range(0, 0)
    lr_decay: Literal["constant", "cosine", "linear"] = "constant"
    lr_min_ratio: float = _range(0.0, 0.0, 1.0)


@dataclass(frozen=True)
class RolloutConfig(_Checked):
    """Episode collection (paper Table 5, ALFWorld)."""

    tasks_per_update: int = _range(16, 1)
    group_size: int = _range(8, 1)
    max_steps: int = _range(30, 1)
    max_prompt_tokens: int = _range(2048, 1)
    max_response_tokens: int = _range(512, 1)
    temperature: float = _range(1.0, 0.0)
    top_p: float = _range(1.0, 0.0, 1.0, open_lo=True)
    # "full": one chat per trajectory, all turns scored in one pass (the paper's h_t).
    # "window": one prompt per turn holding the last `history_window` turns (reference code).
    history_mode: Literal["full", "window"] = "full"
    history_window: int = _range(2, 0)
    invalid_action_penalty: float = _range(0.0, 0.0)
    # each update's sampling restarts from (seed, update): a run resumed from a checkpoint
    # samples exactly what the uninterrupted run would have
    reseed_each_update: bool = True
    # "paper": the paper's actor prompt (Figure 11); "compact": task + observation only
    # (the environment's renderers; the tiny CPU policy's)
    prompt_style: Literal["paper", "compact"] = "paper"
    # episodes advance independently and each finished episode is analysed while the
    # others play (`rollout.overlap`); off: the turn-synchronous loop, then the analysis
    overlap: bool = False
    # how the overlapped loop drives the engines (`rollout.overlap`): "free", continuous
    # batching (an engine returns each reply as it finishes and decodes analyses whenever it
    # holds some); "paced", each engine paired with an env worker and run turn by turn, its
    # analyses decoded in the steps its episodes' turns take anyway (for engines that share
    # CPU cores with the environments); "auto": paced when the engines run on CPUs
    overlap_pacing: Literal["auto", "free", "paced"] = "auto"
    # one-step-off updates: the rollouts (and analyses) of update k+1 run while update k
    # trains, with the weights of update k (theta_old one update behind the trainer); each
    # update re-analyses `staleness_sample` of its trajectories with the current weights
    # and logs the analyzer staleness (`algo.staleness`). Not with colocated engines.
    one_step_off: bool = False
    staleness_sample: int = _range(4, 0)


@dataclass(frozen=True)
class SkillConfig(_Checked):
    """Hindsight-skill analysis and insertion."""

    # Where H inserts the skill: after the environment's task line, or in the system message.
    insert_at: Literal["task_line", "system"] = "task_line"
    # "record": one user message holding the serialised trajectory (the paper).
    # "continuation": the request appended after the episode's own chat (prefix-cache friendly).
    analyzer_layout: Literal["record", "continuation"] = "record"
    min_words: int = _range(5, 1)
    max_retries: int = _range(2, 0)
    max_tokens: int = _range(4096, 1)
    temperature: float = _range(0.0, 0.0)
    # Where the teacher's context comes from (`skills.library`): "analyzer" the policy's
    # own on-policy skill (SEED); "library" a family-keyed library (the baselines' static
    # skills); "stage1_library" per game, a Stage-1 skill; "expert_plan" the environment's
    # expert plan as text (original OPSD). Every source is inserted by H.
    teacher_source: Literal["analyzer", "library", "stage1_library", "expert_plan"] = "analyzer"
    # the library's skill also in the rollout prompts (Skill-GRPO: exploration and every
    # log-prob of training are conditioned on it)
    rollout_skill: bool = False
    # which trajectories the analyzer sees (`rollout.analyzer.selected`): "all" (the
    # paper), "mixed_groups" (groups with both wins and losses), "uncertain" (per group,
    # the half with the lowest mean sampled-token log-prob); the others get no teacher
    select: Literal["all", "mixed_groups", "uncertain"] = "all"


@dataclass(frozen=True)
class FleetConfig(_Checked):
    """The vLLM engines that play episodes and decode skills (`rollout.fleet.Fleet`)."""

    engines: int = _range(2, 1)
    engine_tp: int = _range(1, 1)  # tensor parallel size of each engine
    # GPUs Ray reserves per engine: 0 on CPU; engine_tp on GPUs (the launch plan sets it)
    gpus_per_engine: float = _range(0.0, 0.0)
    # the engines' context; capped by the model's max_position_embeddings
    max_model_len: int = _range(8192, 16)
    # KV cache per engine on CPU (on GPUs vLLM sizes it from free memory)
    kv_cache_bytes: int = _range(1 << 30, 1)
    sync_bucket_bytes: int = _range(64 << 20, 1)  # weight-sync bucket size
    # vLLM weight-transfer backend (rollout/transfer.py): "objstore" (Ray's object store,
    # any device), "ipc" (engines colocated on the trainer's GPUs), "nccl" (other GPUs)
    transport: Literal["objstore", "ipc", "nccl"] = "objstore"
    # a sync call with no progress for this long fails: the engine is restarted (objstore,
    # ipc) or the sync raises naming it (nccl)
    sync_timeout_s: float = _range(60.0, 0.0, open_lo=True)
    # the last synced weights a restarted engine loads: "memory" (Ray's object store, in
    # the engines' dtype), "disk" (safetensors under OUT/replay), "off" (the checkpoint)
    replay: Literal["memory", "disk", "off"] = "memory"
    # GPU only: the share of each engine GPU vLLM takes (weights + KV cache; on the CPU the
    # KV cache is kv_cache_bytes)
    gpu_memory_utilization: float = _range(0.85, 0.0, 1.0, open_lo=True)
    # GPU only: engines share the trainer's GPUs, sleeping while it trains (transport "ipc")
    colocate: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.colocate and self.transport != "ipc":
            raise ConfigError(
                "fleet.colocate puts the engines on the trainer's GPUs: fleet.transport must "
                f"be 'ipc', got {self.transport!r}"
            )

    max_restarts: int = _range(2, 0)  # restarts per engine slot over the fleet's life
    # after every sync the trainer and each engine score this many fixed probe tokens; an
    # engine whose mean |Δ log-prob| exceeds the threshold of the trainer's precision fails
    # the update (0: no probe). Same weights: ~1e-6 in float32, ~1e-2 in bf16
    refit_probe_tokens: int = _range(64, 0)
    refit_max_gap_fp32: float = _range(1e-3, 0.0, open_lo=True)
    refit_max_gap_bf16: float = _range(5e-2, 0.0, open_lo=True)


@dataclass(frozen=True)
class EnvConfig(_Checked):
    """The environment (an `envs.spec.get_env` name) and its Ray worker processes."""

    name: str = DEFAULT_ENV
    workers: int = _range(2, 1)
    step_timeout_s: float = _range(60.0, 0.0, open_lo=True)
    reset_timeout_s: float = _range(300.0, 0.0, open_lo=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        path, sep, attr = self.name.rpartition(":")
        if sep and path.endswith(".py") and not os.path.isabs(path):
            # FILE.py:ATTR: the same file for every process that looks the name up, whatever
            # its working folder (env workers, trainer ranks, a resumed run)
            object.__setattr__(self, "name", f"{os.path.abspath(path)}:{attr}")


@dataclass(frozen=True)
class SeedConfig(_Checked):
    """One training run."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    skill: SkillConfig = field(default_factory=SkillConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    updates: int = _range(150, 0)
    sft_epochs: int = _range(3, 1)
    sft_lr: float = _range(1e-5, 0.0, open_lo=True)  # the paper gives none for Stage 1
    sft_batch_size: int = _range(16, 1)
    collect_rollouts_per_task: int = _range(8, 1)  # K0 (paper: 180 tasks x 8 = 1,440)
    seed: int = _range(1234, 0)
    save_every: int = _range(10, 0)  # 0: no periodic checkpoints

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rollout.one_step_off and self.fleet.colocate:
            raise ConfigError(
                "rollout.one_step_off plays the next update while this one trains: the "
                "engines cannot share the trainer's GPUs (fleet.colocate)"
            )
        if self.algo.routing_replay and self.rollout.one_step_off:
            raise ConfigError(
                "algo.routing_replay reads the routes back from the engines that played the "
                "episodes, and with rollout.one_step_off they hold newer weights by then"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view (for the run's `config.json`)."""
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the exact config used, as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeedConfig:
        """Inverse of `to_dict`; unknown keys and bad values are a `ConfigError`."""
        kwargs: dict[str, Any] = {}
        top = {f.name for f in dataclasses.fields(cls)}
        for key, value in data.items():
            if key not in top:
                raise ConfigError(f"unknown config key {key!r}; known: {sorted(top)}")
            if key in SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"config section {key!r} must be an object, got {value!r}")
                known = {f.name for f in dataclasses.fields(SECTIONS[key])}
                bad = set(value) - known
                if bad:
                    raise ConfigError(
                        f"unknown keys in {key!r}: {sorted(bad)}; known: {sorted(known)}"
                    )
                kwargs[key] = SECTIONS[key](**value)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def with_changes(self, changes: dict[str, Any]) -> SeedConfig:
        """This config with nested `changes` applied (JSON-style, as `--config-json` gives
        them); checked like any config (`ConfigError`)."""
        if not isinstance(changes, dict):
            raise ConfigError(f"config changes must be an object, got {type(changes).__name__}")
        return SeedConfig.from_dict(merge_dicts(self.to_dict(), changes))

    @classmethod
    def load(cls, path: str | Path) -> SeedConfig:
        """A config written by `save` (`ConfigError`, naming the file, if unreadable or
        invalid)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"cannot read config {path}: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a JSON object expected, got {type(data).__name__}")
        try:
            return cls.from_dict(data)
        except (ConfigError, TypeError) as err:
            raise ConfigError(f"{path}: {err}") from None


def differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields where two config dicts (`SeedConfig.to_dict`) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in differences(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".")]


def assignments(items: list[str]) -> dict[str, Any]:
    """Nested config changes from ``SECTION.FIELD=VALUE`` (or ``FIELD=VALUE``) strings, as
    `seed run --set` and `seed compare --set` take them: VALUE is read as JSON (numbers,
    true/false, lists) and else kept as text. Names are checked where the changes are applied
    (`SeedConfig.with_changes`); a string without ``=`` is a `ConfigError`."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. optim.lr=1e-4")
        *path, last = key.strip().split(".")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        if _text_field(path, last):
            value = text  # `env.name=123` names an environment "123"

        node = changes
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part} is given a value and fields")
        node[last] = value
    return changes


def _text_field(path: list[str], name: str) -> bool:
    """Whether SECTION.NAME (or NAME) is a text field (a str or a Literal of strs)."""
    owner = SECTIONS.get(path[0]) if len(path) == 1 else SeedConfig if not path else None
    fields = {f.name: f for f in dataclasses.fields(owner)} if owner else {}
    kind = str(fields[name].type) if name in fields else ""
    return kind == "str" or kind.startswith("Literal['") or kind.startswith('Literal["')


def merge_dicts(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` applied recursively (a nested dict updates, a value replaces)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = value
    return out


SECTIONS: dict[str, type] = {
    "parallel": ParallelConfig,
    "algo": AlgoConfig,
    "optim": OptimConfig,
    "rollout": RolloutConfig,
    "skill": SkillConfig,
    "fleet": FleetConfig,
    "env": EnvConfig,
}
_SECTION_OF = {cls.__name__: f"{name}." for name, cls in SECTIONS.items()}
