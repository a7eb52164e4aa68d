"""Recipes: named configurations for `seed train --recipe`, `seed launch` and `seed run`.

A recipe is a function returning a `Recipe`: a model shape, a `SeedConfig` that is
`SeedConfig()` with only the recipe's differences (the paper's Table 5 values are already the
defaults in `megatron_seed/config.py`), and the changes to the launcher's per-node GPU split
(`launch.layout.ClusterLayout`; empty for the 8-GPU default). The fleet's shape (engines,
engine TP, GPUs per engine) is part of the config; the launch plan fills it in from the
cluster it is given. Model shapes and their parameter arithmetic live in
`megatron_seed.models.shapes` (its `SHAPES` table).

Memory notes (80 GB GPUs, 8 per node, half for the trainer and half for the fleet unless
stated; numbers from `launch.layout.trainer_memory_gib`, which spells out the arithmetic;
`seed launch NAME --nodes N --dryrun` prints the breakdown for N nodes):

- qwen3-1.7b, qwen2.5-3b: TP=1 on 4 trainer GPUs per node, ~32 / ~47 GiB at DP=4 (the fp32
  logits of a 152k vocabulary over 8k tokens are 9 GiB of it); engines of TP=1 (3 / 6 GiB
  of weights, the rest KV cache).
- qwen2.5-7b: TP=2, DP=2 per node, ~60 GiB; engines of TP=1 (14 GiB of weights).
- qwen2.5-14b: TP=4; on one node (DP=1) the unsharded Adam state alone is 41 GiB and the
  total ~76 GiB, over the 72 GiB budget (90% of 80), so 2 nodes or more (~56 GiB at DP=2);
  engines of TP=1 (28 GiB of weights, ~50 GiB left for KV cache).
- qwen2.5-32b: TP=4 x PP=2 (64 layers, 32 per stage); 4 nodes or more (~61 GiB at DP=2,
  ~84 GiB at DP=1); engines of TP=2 (31 GiB of weights per GPU).
- qwen2.5-72b: TP=4 x PP=4 (80 layers, 20 per stage); 8 nodes or more (~69 GiB at DP=2,
  ~94 GiB at DP=1); engines of TP=4 (34 GiB of weights per GPU), one per node.
- llama-3.1-8b (8.03B, untied 128k vocabulary): TP=2, DP=2 per node, ~58 GiB (bf16 weights
  7.5, fp32 grads 15.0, Adam 22.4 sharded over DP=2, reference 7.5, runtime 4); at TP=1
  (DP=4) ~90 GiB, refused; engines of TP=1 (15 GiB of weights).
- llama-3.1-70b (70.6B): TP=4 x PP=4 (80 layers, 20 per stage) as qwen2.5-72b; 8 nodes or
  more (~65 GiB at DP=2, ~89 GiB at DP=1 on 4 nodes, refused); engines of TP=4 (33 GiB of
  weights per GPU).

The CPU recipes: `tiny` (two Stage-2 updates of a tiny model, the tests') and `default` /
`default-quick` (the default job's Stage 1 and Stage 2, `seed run [--quick]`).

A job's config layers: the environment's rollout budgets (`envs.api.RolloutDefaults`) under
the recipe (`on_env`), then the method, `--config-json` and flags on top.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from megatron_seed.config import (
    AlgoConfig,
    FleetConfig,
    OptimConfig,
    ParallelConfig,
    RolloutConfig,
    SeedConfig,
    SkillConfig,
)
from megatron_seed.models.shapes import (
    LLAMA3_1_8B,
    LLAMA3_1_70B,
    QWEN2_5_3B,
    QWEN2_5_7B,
    QWEN2_5_14B,
    QWEN2_5_32B,
    QWEN2_5_72B,
    QWEN3_1_7B,
    QWEN3_30B_A3B,
    QWEN3_235B_A22B,
    SMOLLM2_135M,
    TINY,
    TINY_BASE,
    ModelShape,
)

if TYPE_CHECKING:
    from envs.api import RolloutDefaults


@dataclass(frozen=True)
class Recipe:
    """A named configuration: model shape, training config, per-node GPU split changes."""

    name: str
    model: ModelShape
    config: SeedConfig = field(default_factory=SeedConfig)
    layout: dict[str, Any] = field(default_factory=dict)  # changes to ClusterLayout()


# what the GPU recipes' trainer runs (and the memory estimate assumes): Adam state sharded
# over DP, full activation recompute, on CUDA or not at all
GPU_TRAINER = {"distributed_optimizer": True, "recompute": "full", "device": "cuda"}


def _parallel(**changes: object) -> SeedConfig:
    """A GPU recipe's config: the GPU trainer, and engines on their own GPUs that take the
    weights over NCCL."""
    return SeedConfig(
        parallel=dataclasses.replace(ParallelConfig(), **{**GPU_TRAINER, **changes}),
        fleet=FleetConfig(transport="nccl"),
    )


def _engine_tp(config: SeedConfig, tp: int) -> SeedConfig:
    return dataclasses.replace(config, fleet=dataclasses.replace(config.fleet, engine_tp=tp))


CPU_LAYOUT = {
    "device": "cpu",
    "gpus_per_node": 0,
    "trainer_ranks_per_node": 1,
    "fleet_gpus_per_node": 0,
}
# A CPU job laid out like a GPU one: per node one trainer rank and one engine, each holding
# one of the node's two GPU slots (Slurm GRES, Ray logical GPUs; nothing runs on them). At
# `--nodes 2`: data parallel 2, one engine on each node (the multi-node rehearsal).
CPU_SLOTS_LAYOUT = {
    "device": "cpu",
    "gpus_per_node": 2,
    "trainer_ranks_per_node": 1,
    "fleet_gpus_per_node": 1,
}


def tiny() -> Recipe:
    """The CPU test configuration: two Stage-2 updates of a tiny model, one trainer rank and
    one engine per node."""
    config = SeedConfig(
        parallel=ParallelConfig(precision="fp32"),
        rollout=RolloutConfig(
            tasks_per_update=2,
            group_size=2,
            max_steps=4,
            max_prompt_tokens=512,
            max_response_tokens=32,
        ),
        skill=SkillConfig(max_tokens=64),
        # the tests' random-weight model loses nearly every episode, so with the default
        # rule ("skip") its updates would take no step and leave the step's code untested
        algo=AlgoConfig(no_signal="step"),
        updates=2,
        sft_epochs=1,
        save_every=1,
    )
    return Recipe("tiny", TINY, config, CPU_SLOTS_LAYOUT)


def _default_job(quick: bool) -> SeedConfig:
    """The default CPU job's Stage 1 + Stage 2 (`seed run`): the paper's hyperparameters
    except where noted. QUICK: Pick only, 2 tasks x 12 updates; FULL: 4 tasks x 48."""
    return SeedConfig(
        # whole-sequence logits: at the tiny policy's 1,024-token vocabulary a micro-batch's
        # logits are small (8 x 4k tokens: 128 MB), and chunking them changes float rounding,
        # hence the sampled run and the results measured below
        parallel=ParallelConfig(precision="fp32", logit_chunk_tokens=0),
        rollout=RolloutConfig(
            # QUICK, tasks x updates, seed 0, SEED's training-game success (base 35.4 %), one
            # continuous sampling stream: 2 x 12: 47.9 %, 3 x 10: 50.0, 3 x 12: 52.1, 2 x 15:
            # 43.8, 2 x 20: 54.2 (one seed: +-10 points; with each update reseeded, 2 x 12
            # gives 39.6 %); 2 x 12 keeps the job within 5 minutes (docs/results.md)
            tasks_per_update=2 if quick else 4,
            group_size=8,
            max_steps=15,  # small rooms need fewer than ALFWorld's 30
            max_prompt_tokens=2048,
            max_response_tokens=24,  # the tiny policy answers "<action>...</action>" only
            prompt_style="compact",  # the tiny policy's prompts
        ),
        # continuation: the layout the base policy learnt to analyze with. The oracle
        # analyzer's replies (which the base imitates) reach ~230 tokens for a failure.
        # No retries (the paper's rule is 2): the analyzer decodes greedily, and over the six
        # quick SEED runs of docs/results.md a retry made 16 of 785 invalid first replies
        # valid (2 %), while each failed one cost two more generations of up to 320 tokens,
        # the last analyses' chain that overlapped rollouts cannot hide (docs/benchmarks.md)
        skill=SkillConfig(max_tokens=320, analyzer_layout="continuation", max_retries=0),
        # lr: 1e-6 (the paper's, for 3B-7B models) does not move a 0.7M-parameter model;
        # 1e-3 and 2e-3 collapsed the tiny clone to 0 % within 3 updates. With one Adam
        # step of 16 episodes per update the lr is the only trust region (the ratio is 1,
        # the clip never acts): at 5e-4 GRPO's quick run fell from its base on one of two
        # seeds (22.9 -> 7.3 %, invalid actions 4 -> 42 per update); at 1e-4 it rose on
        # every seed tried (docs/results.md, "Learning that shows")
        optim=OptimConfig(lr=1e-4, mini_batches_per_update=1, micro_batch_size=8),
        # the tiny policy's context (its max_position_embeddings); 1 GiB of KV cache each
        fleet=FleetConfig(max_model_len=4096),
        # sequence mean: a 15-step failure's tokens (mostly what followed a bad sample) no
        # longer outweigh a 6-step success's
        algo=AlgoConfig(loss_agg="seq_mean_token_mean"),
        # FULL: 48 (each of its 16 games visited ~12 times): at the quick size 24 updates
        # still rose at the end (fixed-game curves), and 48 gained 15-27 points on every seed
        updates=12 if quick else 48,
        collect_rollouts_per_task=2 if quick else 4,  # K0
        sft_epochs=3,
        # tiny model; at the full size it still costs the base its greedy play on the seen
        # games (27.8 % -> 0 %, docs/results.md): a lower rate is the next thing to try
        sft_lr=2e-4,
        sft_batch_size=8,
        save_every=1,
        seed=0,
    )


def default() -> Recipe:
    """The default CPU job (`seed run`)."""
    return Recipe("default", TINY_BASE, _default_job(quick=False), CPU_LAYOUT)


def default_quick() -> Recipe:
    """The default CPU job's quick size (`seed run --quick`)."""
    return Recipe("default-quick", TINY_BASE, _default_job(quick=True), CPU_LAYOUT)


def pretrained_cpu() -> Recipe:
    """A small pretrained instruct model on the CPU (`seed run --model DIR`; SmolLM2-135M-
    Instruct from `tools/fetch_smollm2.sh`): the default job's loop with what a model that
    reads language needs. A first setting, not a tuned one: the paper's prompts and analyzer
    layout; 2 tasks x 4 episodes an update (a 135M-parameter model's dual-context pass over
    long multi-turn chats is the cost on 2 cores); replies of at most 64 tokens; lr 1e-5,
    between the paper's 1e-6 for 3B-7B models and the tiny clone's 1e-4."""
    config = SeedConfig(
        # a 49k vocabulary: whole-sequence logits of a micro-batch would be GBs
        parallel=ParallelConfig(precision="fp32", logit_chunk_tokens=1024),
        rollout=RolloutConfig(
            tasks_per_update=2,
            group_size=4,
            max_prompt_tokens=4096,
            max_response_tokens=64,
            prompt_style="paper",
        ),
        skill=SkillConfig(max_tokens=256, max_retries=0),
        optim=OptimConfig(lr=1e-5, mini_batches_per_update=1, micro_batch_size=2),
        fleet=FleetConfig(max_model_len=8192),
        algo=AlgoConfig(loss_agg="seq_mean_token_mean"),
        updates=8,
        collect_rollouts_per_task=2,
        sft_epochs=1,
        sft_batch_size=4,
        save_every=1,
        seed=0,
    )
    return Recipe("pretrained-cpu", SMOLLM2_135M, config, CPU_LAYOUT)


def qwen3_1_7b() -> Recipe:
    """Paper backbone; Table 5 hyperparameters are the defaults."""
    return Recipe("qwen3-1.7b", QWEN3_1_7B, _parallel())


def qwen2_5_3b() -> Recipe:
    """Paper backbone; Table 5 hyperparameters are the defaults."""
    return Recipe("qwen2.5-3b", QWEN2_5_3B, _parallel())


def qwen2_5_7b() -> Recipe:
    """Paper backbone; Table 5 hyperparameters are the defaults."""
    return Recipe("qwen2.5-7b", QWEN2_5_7B, _parallel(tp=2))


def qwen2_5_14b() -> Recipe:
    """TP=4 trainer, 2+ nodes."""
    return Recipe("qwen2.5-14b", QWEN2_5_14B, _parallel(tp=4))


def qwen2_5_32b() -> Recipe:
    """TP=4 x PP=2 trainer, TP=2 engines, 4+ nodes."""
    return Recipe("qwen2.5-32b", QWEN2_5_32B, _engine_tp(_parallel(tp=4, pp=2), 2))


# Mixture-of-experts recipes: H200 nodes (141 GiB), trainer and engines colocated on all
# 8 GPUs of a node. Every expert's bf16 weights, fp32 gradient and Adam state (20 B/param)
# sit on the EP x TP x PP ranks that own it, sharded over DP only beyond EP (expert data
# parallel = DP / EP), so these fit only where TP x PP x EP covers the trainer's GPUs (the
# arithmetic: docs/launch.md). No reference model (beta_kl = 0, as the anchors run MoE RL):
# a second copy of every expert would not fit beside them. A DGX H200 node
# (`launch.layout.NODE_TYPES["dgx-h200"]`): 8 x 141 GiB of GPU memory and 2 TiB of host RAM,
# which the busiest node's host memory must fit in every phase (`node_host_memory_gib`: at
# 30B-A3B ~1.2 TiB and at 235B-A22B ~1.3 TiB while saving a checkpoint).
H200 = {"gpu_memory_gib": 141.0, "host_memory_gib": 2048.0, "gpus_per_node": 8,
        "colocated": True, "trainer_ranks_per_node": 8, "fleet_gpus_per_node": 8}  # fmt: skip


def _moe(parallel: dict[str, int], engine_tp: int, engine_share: float) -> SeedConfig:
    """A MoE recipe's config: colocated engines taking `engine_share` of each GPU while they
    generate (what the trainer keeps resident must fit beside it), no reference model."""
    config = _engine_tp(_parallel(**parallel), engine_tp)
    fleet = dataclasses.replace(
        config.fleet, colocate=True, transport="ipc", gpu_memory_utilization=engine_share
    )
    return dataclasses.replace(
        config, fleet=fleet, algo=dataclasses.replace(config.algo, beta_kl=0.0)
    )


def qwen3_30b_a3b() -> Recipe:
    """Qwen3-30B-A3B on one node of 8 H200: EP=8 trainer colocated with TP=4 engines."""
    return Recipe("qwen3-30b-a3b", QWEN3_30B_A3B, _moe({"ep": 8}, 4, 0.75), H200)


def qwen3_235b_a22b() -> Recipe:
    """Qwen3-235B-A22B on 8 nodes of 8 H200: TP=4 x PP=2 x EP=8 trainer colocated with
    TP=8 engines."""
    parallel = {"tp": 4, "pp": 2, "ep": 8}  # 94 layers: PP 2; 4 KV heads: TP <= 4
    return Recipe("qwen3-235b-a22b", QWEN3_235B_A22B, _moe(parallel, 8, 0.78), H200)


def qwen2_5_72b() -> Recipe:
    """TP=4 x PP=4 trainer, TP=4 engines, 8+ nodes."""
    return Recipe("qwen2.5-72b", QWEN2_5_72B, _engine_tp(_parallel(tp=4, pp=4), 4))


def llama_3_1_8b() -> Recipe:
    """TP=2 trainer (8 KV heads), TP=1 engines, 1+ node."""
    return Recipe("llama-3.1-8b", LLAMA3_1_8B, _parallel(tp=2))


def llama_3_1_70b() -> Recipe:
    """TP=4 x PP=4 trainer (80 layers, 20 per stage), TP=4 engines, 8+ nodes."""
    return Recipe("llama-3.1-70b", LLAMA3_1_70B, _engine_tp(_parallel(tp=4, pp=4), 4))


RECIPES: dict[str, Callable[[], Recipe]] = {
    "tiny": tiny,
    "default": default,
    "default-quick": default_quick,
    "pretrained-cpu": pretrained_cpu,
    "qwen3-1.7b": qwen3_1_7b,
    "qwen2.5-3b": qwen2_5_3b,
    "qwen2.5-7b": qwen2_5_7b,
    "qwen2.5-14b": qwen2_5_14b,
    "qwen2.5-32b": qwen2_5_32b,
    "qwen2.5-72b": qwen2_5_72b,
    "qwen3-30b-a3b": qwen3_30b_a3b,
    "qwen3-235b-a22b": qwen3_235b_a22b,
    "llama-3.1-8b": llama_3_1_8b,
    "llama-3.1-70b": llama_3_1_70b,
}


def get(name: str) -> Recipe:
    """The recipe called `name`; `KeyError` with the known names otherwise."""
    try:
        return RECIPES[name]()
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}") from None


def on_env(cfg: SeedConfig, defaults: RolloutDefaults | None) -> SeedConfig:
    """``cfg`` (a recipe's config) over an environment's rollout budgets: each budget the
    recipe leaves at `RolloutConfig`'s default becomes the environment's; one it sets stays."""
    if defaults is None:
        return cfg
    library = RolloutConfig()
    kept = {
        key: value
        for key, value in defaults.as_changes().items()
        if getattr(cfg.rollout, key) == getattr(library, key)
    }
    return cfg.with_changes({"rollout": kept})
