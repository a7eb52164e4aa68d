"""The Megatron trainer of SEED: one `train_step` per Stage-2 update.

Per update (Algorithm 1, lines 9-14), for the PolicyBatch of B sequences:

  1. old   = log pi_theta_old(a | h)      current weights before the update, no grad
     ref   = log pi_ref(a | h)            the frozen reference model, no grad
     teach = log pi_theta(a | H(h, s))    `snapshot`: here, once, with theta_old
  2. for each epoch (cfg.optim.epochs_per_update) and mini-batch (mini_batches_per_update):
       `live`: teach = log pi_theta(a | H(h, s)) with the current weights, no grad
       forward/backward of seed_loss over micro-batches, Adam step with grad clipping;
       with analyzer replay (`algo.replay_weight`), the update's Stage-1 examples ride along
       as extra rows whose answer-token NLL joins the loss (`_with_replay`)
  3. diagnostics, logged and never in the loss (`algo.diagnostics`): Delta = teach - old
     per record against its advantage and success (`opd/delta_adv_corr`,
     `opd/gated_frac_success`, `opd/gated_frac_failure`), from the teacher log-probs each
     row first trained with

seed_loss gets `update=state.step`, the 0-based index of this update (the same for all its
mini-batches and epochs; a checkpoint restores it), which RLSD's lambda schedule reads.

Every process runs this code; the batch is identical on every rank. Rows are split over
data-parallel ranks, each DP rank runs Megatron's pipeline schedule over its micro-batches,
and the loss of a micro-batch is its partial sum divided by the *global* token count of the
mini-batch. Megatron's per-token-loss mode keeps the schedule from rescaling it and DDP sums
gradients over DP, so the step equals one full-batch masked mean whatever the layout.

Micro-batches come in two layouts (`_micro_batches`). Padded (`optim.micro_batch_tokens` =
0): `micro_batch_size` rows of the `[B, s]` batch each, the rows split over DP ranks (rows
that only even out the split carry no loss). Packed (> 0): every sequence of the mini-batch
placed whole into packed `[1, T]` rows (`data.packing`, one plan computed alike on every
rank), R / dp rows per DP rank, each one micro-batch with its segment boundaries; every
per-token tensor (labels, masks, log-probs, advantages and the OPD mask broadcast to tokens)
packs the same way and `score` unpacks its log-probs back to `[B, s]`. Both layouts give the
same losses and gradients; `pad_frac` reports the padding the model ran on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from megatron_seed.algo import seed_loss, sequence_weights
from megatron_seed.algo.diagnostics import opd_condition_metrics, opd_condition_sums
from megatron_seed.algo.losses import term_grad_sq
from megatron_seed.config import SeedConfig
from megatron_seed.data import TokenBatch, align_teacher
from megatron_seed.data.collate import pad_value
from megatron_seed.data.packing import PackPlan, pack, padded_fraction
from megatron_seed.models.convert import HFCheckpoint, load_hf_weights
from megatron_seed.models.logprobs import (
    broadcast_from_last_stage,
    fp8_warm_pass,
    micro_batches,
    packed_logprobs,
    run_schedule,
    token_logprobs,
)
from megatron_seed.models.qwen import QwenSpec, build_gpt_model
from megatron_seed.train.batch import PolicyBatch, select_rows
from megatron_seed.train.offload import PinnedHostOffload
from megatron_seed.train.schedule import lr_at


@dataclass
class TrainerState:
    """What a resumed run needs besides weights and optimizer: restored exactly."""

    step: int = 0
    data_position: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _ps():
    from megatron.core import parallel_state as ps

    return ps


def _metric_keys(cfg: SeedConfig) -> list[str]:
    """The metric names seed_loss returns for this config (same on every rank; the update
    index only sets values, not names)."""
    z = torch.zeros(1, 2)
    m = torch.ones(1, 2, dtype=torch.bool)
    _, metrics = seed_loss(cfg.algo, z, z, torch.zeros(1), m, z, z, update=0)
    metrics.update(term_grad_sq(cfg.algo, z, z, torch.zeros(1), m, z, z, update=0))
    if cfg.algo.replay_weight:
        metrics[REPLAY_NLL] = torch.zeros(())
    return sorted(metrics)


REPLAY_NLL = "loss/replay_nll"  # the analyzer-replay term's masked NLL (before its weight)


def _with_replay(
    tensors: dict[str, torch.Tensor], lengths: torch.Tensor, replay: TokenBatch
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The mini-batch's `[m, s]` tensors with the replay rows `[r, s_r]` appended (both
    right-padded to max(s, s_r)): the replay rows carry no RL, KL or OPD token (`mask`,
    `opd_mask` False) and their answer tokens in `replay`; the student rows none."""
    m, s = tensors["mask"].shape
    r, s_r = replay.input_ids.shape
    width = max(s, s_r)

    def widen(x: torch.Tensor, fill: int) -> torch.Tensor:  # [n, s', ...] -> [n, width, ...]
        pad = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), fill)
        return torch.cat([x, pad], 1)

    extra = {
        "input_ids": replay.input_ids,
        "labels": replay.labels,
        "replay": replay.loss_mask,
    }
    out = {}
    for key, value in {**tensors, "replay": torch.zeros(m, s, dtype=torch.bool)}.items():
        fill = pad_value(key)  # the replay rows' tokens route freely
        tail = extra.get(key, value.new_full((r, s_r, *value.shape[2:]), fill))
        out[key] = torch.cat([widen(value, fill), widen(tail, fill)])  # [m + r, width, ...]
    return out, torch.cat([lengths, replay.lengths])


def _opd_condition(
    pb: PolicyBatch, old: torch.Tensor, teacher: torch.Tensor, beta: float
) -> dict[str, float]:
    """`algo.diagnostics` metrics of the batch: Delta = teacher - old over its OPD tokens
    against each record's advantage and success. old, teacher: [B, s], the whole batch
    (identical on every rank, so no reduce)."""
    opd_tokens = pb.student.loss_mask & pb.has_teacher[:, None]  # [B, s]
    sums = opd_condition_sums(
        old, teacher, opd_tokens, pb.advantages, pb.record_index, beta, pb.won
    )
    return opd_condition_metrics(sums)


def carries_signal(algo: Any, advantages: torch.Tensor) -> bool:
    """Whether an optimizer step on rows with these advantages ([m]) is taken: always,
    unless `algo.no_signal` is "skip", the loss has L_rl and every advantage is 0."""
    if algo.no_signal == "step" or algo.policy_weight == 0.0:
        return True
    return bool(advantages.ne(0).any())


def _policy_stats(old: torch.Tensor, batch: TokenBatch) -> dict[str, float]:
    """`policy/entropy_est`: minus the mean log-prob of the sampled action tokens under
    theta_old, which estimates the policy's per-token entropy when the tokens were sampled
    from it at temperature 1. old: [B, s]."""
    logp = old[batch.loss_mask]  # [n]
    return {"policy/entropy_est": -float(logp.mean())} if logp.numel() else {}


def _mismatch(old: torch.Tensor, batch: TokenBatch) -> dict[str, float]:
    """Train-inference mismatch on the sampled action tokens: |rollout log-prob (the engine's)
    - theta_old log-prob (the trainer's)|, mean and max. old: [B, s]."""
    diff = (batch.rollout_logprobs - old).abs()[batch.loss_mask]  # [n]
    diff = diff[~torch.isnan(diff)]  # no rollout log-prob (e.g. SFT data)
    if not diff.numel():
        return {}
    return {"mismatch/mean": float(diff.mean()), "mismatch/max": float(diff.max())}


DIST_OPT_ON_CPU = (
    "parallel.distributed_optimizer needs GPUs (Megatron's distributed optimizer refuses CPU "
    "tensors): set it to false on CPU"
)


def mini_batches(rows: int, k: int) -> list[torch.Tensor]:
    """The row indices of each of an update's mini-batches: `k` contiguous parts whose
    sizes differ by at most one row (fewer parts when there are fewer than `k` rows)."""
    if rows < 1:
        raise ValueError("an update needs at least one row")
    return list(torch.tensor_split(torch.arange(rows), min(k, rows)))


class SeedTrainer:
    """Policy, reference model and optimizer of one rank, in Megatron's process groups."""

    def __init__(
        self, cfg: SeedConfig, hf_dir: str, ref_hf_dir: str | None = None, reference: bool = True
    ) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        if cfg.optim.epochs_per_update < 1:
            raise ValueError(f"epochs_per_update must be >= 1, got {cfg.optim.epochs_per_update}")
        self.cfg = cfg
        ckpt = HFCheckpoint(hf_dir)
        self.spec: QwenSpec = ckpt.spec
        par = cfg.parallel
        if par.distributed_optimizer and not torch.cuda.is_available():
            raise ValueError(DIST_OPT_ON_CPU)
        if par.fp8_recipe:
            from megatron_seed.models.fp8 import check_fp8_support
            from megatron_seed.models.qwen import te_available

            on_gpu = torch.cuda.is_available()
            capability = torch.cuda.get_device_capability() if on_gpu else None
            check_fp8_support(par.fp8_recipe, capability, on_gpu and te_available())
        precision = par.precision if torch.cuda.is_available() else "fp32"
        self.precision = precision
        # no random init: load_hf_weights writes every tensor of the state dict
        aux = cfg.algo.moe_aux_loss
        if aux and not self.spec.is_moe:
            raise ValueError("algo.moe_aux_loss is the routers' loss: this model has no experts")
        model = build_gpt_model(
            self.spec,
            precision=precision,
            fp8_recipe=par.fp8_recipe,
            recompute=par.recompute,
            initialize=False,
            main_grad=True,
            logit_chunk_tokens=par.logit_chunk_tokens,
            aux_loss_coeff=aux,
        )
        if aux:
            _plain_aux_loss_scale(model)
        self._step_aux_loss: float | None = None  # set by each `_adam_step`
        self._router_stats = None  # a mixture-of-experts model's routing, every update
        self._routes = None  # and its routes against the engine's (`models.routing_replay`)
        if cfg.algo.routing_replay and not self.spec.is_moe:
            raise ValueError("algo.routing_replay replays experts: this model has no experts")
        if self.spec.is_moe:
            from megatron_seed.models.router_stats import RouterStats
            from megatron_seed.models.routing_replay import install

            self._router_stats = RouterStats(model, self.spec.num_layers, self.spec.num_experts)
            # the engine's routes, when a batch brings them: replayed or only compared
            self._routes = install(model, self.spec.sparse_layers, cfg.algo.routing_replay)
        load_hf_weights(model, ckpt)
        on_gpu = torch.cuda.is_available()
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,  # exact sums over DP; bf16 grads would round
            # on GPUs gradient buckets are reduced while backward goes on, and with the
            # distributed optimizer the updated weights are gathered during the next forward
            overlap_grad_reduce=on_gpu,
            overlap_param_gather=on_gpu and par.distributed_optimizer,
            use_distributed_optimizer=par.distributed_optimizer,
        )
        model.config.calculate_per_token_loss = True  # sum over DP, no 1/num_microbatches
        self.model = DistributedDataParallel(
            config=model.config, ddp_config=ddp_config, module=model
        )
        # Our losses are normalised by global token counts already: no num_tokens scaling.
        model.config.finalize_model_grads_func = lambda chunks, *_a, **_k: finalize_model_grads(
            chunks
        )
        model.config.no_sync_func = self.model.no_sync
        o = cfg.optim
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=o.lr,
                min_lr=o.lr,
                weight_decay=o.weight_decay,
                adam_beta1=o.adam_beta1,
                adam_beta2=o.adam_beta2,
                adam_eps=o.adam_eps,
                clip_grad=o.clip_grad,
                bf16=precision == "bf16",
                params_dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
                use_distributed_optimizer=par.distributed_optimizer,
            ),
            [self.model],
        )
        for group in self.optimizer.param_groups:
            group["lr"] = o.lr
        self.ref_model = None
        if reference:  # SFT needs none; RL needs it when beta_kl != 0
            # the policy's precision, FP8 included: the KL term starts at zero
            self.ref_model = build_gpt_model(
                self.spec,
                precision=precision,
                fp8_recipe=par.fp8_recipe,
                initialize=False,
                logit_chunk_tokens=par.logit_chunk_tokens,
            )
            load_hf_weights(self.ref_model, HFCheckpoint(ref_hf_dir or hf_dir))
            self.ref_model.requires_grad_(False)
            if self.spec.is_moe:
                from megatron_seed.models.routing_replay import install

                install(self.ref_model, self.spec.sparse_layers, cfg.algo.routing_replay)
        self.state = TrainerState()
        self._metric_keys = _metric_keys(cfg)
        self._released = False  # optimizer state and grad buffers off the GPU
        self._host = PinnedHostOffload()  # the optimizer state's host buffers while released
        self._fp8_warm: set[int] = set()  # models whose delayed FP8 scales have history

    @property
    def seq_multiple(self) -> int:
        """Tokens per micro-batch must be a multiple of this (FP8 blocks, sequence
        parallelism): what every batch this trainer gets is collated to."""
        from megatron_seed.models.logprobs import token_multiple

        return token_multiple(self.model.module.config)

    def sync_params(self) -> None:
        """Make every rank's weights the updated ones. With the distributed optimizer's
        overlapped gather, an optimizer step leaves the gather to the next forward: anything
        that reads the weights before it (export, checkpoint) calls this first."""
        if self.model.ddp_config.overlap_param_gather:
            self.model.start_param_sync(force_sync=True)

    @contextlib.contextmanager
    def without_fp8(self) -> Iterator[None]:
        """Forward passes inside run without FP8 GEMMs (bf16), whatever the recipe: the
        refit probe compares the trainer's log-probs with bf16 engines', and an FP8 GEMM's
        rounding is not a refit error. Megatron-core enters FP8 per block from its
        `TransformerConfig.fp8`, so that switch is off inside and restored after."""
        from megatron.core.transformer import TransformerConfig

        configs = {
            id(c): c
            for m in self.model.modules()
            if isinstance(c := getattr(m, "config", None), TransformerConfig)
        }
        saved = {key: c.fp8 for key, c in configs.items()}
        try:
            for c in configs.values():
                c.fp8 = None
            yield
        finally:
            for key, c in configs.items():
                c.fp8 = saved[key]

    def release_memory(self) -> None:
        """Give the GPU to engines that share it (colocated mode, while they generate): the
        optimizer state (fp32 master weights, Adam moments) moves to page-locked host
        buffers kept for the next time (`train.offload`), the fp32 gradient buffers are
        freed (megatron-core's RL offload), and the allocator's cached blocks (the last
        step's activations) go back to the device (GPU only). The bf16 weights stay: the
        next sync reads them. `reclaim_memory` undoes it."""
        if not torch.cuda.is_available() or self._released:
            return
        self._host.release(self.optimizer, "cuda")  # page-locked, reused (`train.offload`)
        self.model.offload_grad_buffers()
        torch.cuda.empty_cache()
        self._released = True

    def reclaim_memory(self) -> None:
        """Optimizer state and gradient buffers back on the GPU before training."""
        if not self._released:
            return
        self._host.reclaim(self.optimizer, torch.device("cuda", torch.cuda.current_device()))
        self.model.restore_grad_buffers()
        self._released = False

    def export_weights(self, dtype: torch.dtype | None = None):
        """`export_hf_weights` of the current policy (a collective over all trainer ranks)."""
        from megatron_seed.models.convert import export_hf_weights

        self.sync_params()
        return export_hf_weights(self.model.module, self.spec, dtype)

    # ------------------------------------------------------------ data-parallel helpers

    @property
    def dp(self) -> tuple[int, int]:
        """(DP rank, DP size)."""
        ps = _ps()
        return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()

    def _dp_rows(self, n: int) -> tuple[torch.Tensor, int]:
        """This DP rank's row indices of an n-row batch, padded (index -1) to a multiple of
        dp * micro_batch_size. Returns (rows, padded length per rank)."""
        rank, size = self.dp
        mbs = self.cfg.optim.micro_batch_size
        per = math.ceil(n / (size * mbs)) * mbs
        idx = torch.arange(rank * per, (rank + 1) * per)
        return torch.where(idx < n, idx, torch.full_like(idx, -1)), per

    def _plan(self, lengths: torch.Tensor) -> PackPlan:
        """The packing of sequences of these `lengths` ([m]): rows of at most
        `optim.micro_batch_tokens` tokens, `seq_multiple` wide, a multiple of DP in number."""
        return pack(lengths, self.cfg.optim.micro_batch_tokens, self.seq_multiple, self.dp[1])

    def _packed_rows(
        self, plan: PackPlan, tensors: dict[str, torch.Tensor]
    ) -> list[dict[str, Any]]:
        """This DP rank's packed micro-batches of `[m, s]` tensors (the plan's m sequences):
        each tensor `[1, T]`, with `position_ids`, `cu_seqlens` and `max_seqlen`."""
        rank, size = self.dp
        per = plan.rows // size
        packed = {  # [R, T, ...] each
            k: plan.pack_tensor(v, pad_value(k)) for k, v in tensors.items()
        }
        positions = plan.position_ids()  # [R, T]
        out = []
        for r in range(rank * per, (rank + 1) * per):
            mb: dict[str, Any] = {k: v[r : r + 1] for k, v in packed.items()}  # [1, T]
            mb["position_ids"] = positions[r : r + 1]
            mb["cu_seqlens"] = plan.cu_seqlens[r]  # [segments + 1] int32
            mb["max_seqlen"] = plan.max_seqlen(r)
            out.append(mb)
        return out

    def _micro_batches(
        self, tensors: dict[str, torch.Tensor], lengths: torch.Tensor
    ) -> tuple[list[dict[str, Any]], float]:
        """This DP rank's micro-batches of `[m, s]` tensors (whose rows hold sequences of
        `lengths`, [m]), and the padding fraction of all DP ranks' micro-batches together.
        Packed rows when `optim.micro_batch_tokens` > 0; else `micro_batch_size` padded rows,
        where rows that only even out the split over DP get an all-False `mask`. A
        mixture-of-experts model's micro-batches carry `valid`, the real tokens (its routers'
        load-balancing loss and statistics count no padding)."""
        if self.spec.is_moe:
            width = tensors["mask"].shape[1]
            tensors = {**tensors, "valid": torch.arange(width)[None, :] < lengths[:, None]}
        if self.cfg.optim.micro_batch_tokens:
            plan = self._plan(lengths)
            return self._packed_rows(plan, tensors), plan.pad_fraction
        m, s = tensors["mask"].shape
        rows, per = self._dp_rows(m)
        local = {k: v[rows.clamp(min=0)].clone() for k, v in tensors.items()}
        for key in ("mask", "replay", "valid"):  # padding rows carry no loss
            if key in local:
                local[key][rows < 0] = False
        batches = micro_batches(local, self.cfg.optim.micro_batch_size)
        return batches, padded_fraction(lengths, per * self.dp[1], s)

    # ------------------------------------------------------------ scoring (no grad)

    @torch.no_grad()
    def score(
        self, batch: TokenBatch, model: Any | None = None, count_routes: bool = False
    ) -> torch.Tensor:
        """Per-token log-probs `[B, s]` of a batch with `model` (default: the policy).

        Position i < n - 1 of a row of n tokens holds log p(x_{i+1} | x_0 .. x_i) in either
        layout; position s - 1 holds 0, and when packed so does every position from n - 1 on
        (no target there; padded rows hold whatever the padding predicts). The batch's
        `routes` (a mixture-of-experts model) go to the routers (`models.routing_replay`);
        `count_routes`: count on the loss tokens how often the routers agree with them."""
        model = self.model if model is None else model
        self._warm_fp8(batch, model)
        extra = {}
        if batch.routes is not None:
            extra["routes"] = batch.routes
            if count_routes:
                extra["scored"] = batch.loss_mask
        counting = self._routes.counting() if "scored" in extra else contextlib.nullcontext()
        with counting:
            if self.cfg.optim.micro_batch_tokens:
                return self._score_packed(batch, model, extra)
            return self._score_rows(batch, model, extra)

    def _score_rows(self, batch: TokenBatch, model: Any, extra: dict) -> torch.Tensor:
        """`score` over rows of `micro_batch_size`: this rank's rows, gathered over DP."""
        n = batch.input_ids.shape[0]
        rows, _ = self._dp_rows(n)
        ids = batch.input_ids[rows.clamp(min=0)]  # [per, s]; padding rows repeat row 0
        extra = {k: v[rows.clamp(min=0)] for k, v in extra.items()}
        if "scored" in extra:  # a DP padding row counts nothing
            extra["scored"] = extra["scored"] & (rows >= 0)[:, None]
        local = token_logprobs(model, ids, self.cfg.optim.micro_batch_size, extra)  # [per, s]
        _, size = self.dp
        if size > 1:
            parts = [torch.empty_like(local) for _ in range(size)]
            dist.all_gather(parts, local.contiguous(), group=_ps().get_data_parallel_group())
            local = torch.cat(parts, dim=0)
        return local[:n].cpu()

    def _warm_fp8(self, batch: TokenBatch, model: Any) -> None:
        """Delayed-scaling FP8 takes each tensor's scale from the amax history of earlier
        passes, and a model's first FP8 pass has none (every scale 1.0): update 0's theta_old
        and reference log-probs would be scored with it. So a model's first FP8-scored batch
        is run once more before it counts: the discarded pass fills the history (a
        collective, like every score; other recipes scale from the tensor at hand)."""
        if self.cfg.parallel.fp8_recipe != "delayed" or id(model) in self._fp8_warm:
            return
        if not getattr(getattr(model, "config", None), "fp8", None):
            return  # scored without FP8 (`without_fp8`): nothing to warm yet
        self._fp8_warm.add(id(model))
        # one micro-batch of this rank's rows, grad on: TE updates delayed scales only
        # when an autocast exits with grad enabled (`fp8_warm_pass`)
        rows = self._dp_rows(batch.input_ids.shape[0])[0].clamp(min=0)
        rows = rows[: self.cfg.optim.micro_batch_size]
        extra = {"routes": batch.routes[rows]} if batch.routes is not None else None
        fp8_warm_pass(model, batch.input_ids[rows], extra)

    def _score_packed(self, batch: TokenBatch, model: Any, extra: dict) -> torch.Tensor:
        """`score` over packed rows: this rank's rows, gathered over DP, unpacked."""
        b, s = batch.input_ids.shape
        plan = self._plan(batch.lengths)
        tensors = {"input_ids": batch.input_ids, "labels": batch.labels, **extra}
        rows = self._packed_rows(plan, tensors)
        local = packed_logprobs(model, rows)  # [R / dp, T]
        _, size = self.dp
        if size > 1:
            parts = [torch.empty_like(local) for _ in range(size)]
            dist.all_gather(parts, local.contiguous(), group=_ps().get_data_parallel_group())
            local = torch.cat(parts, dim=0)  # [R, T], rank order = row order
        out = plan.unpack_tensor(local.cpu(), s)  # [B, s], 0 past each sequence
        has = batch.lengths > 0
        out[torch.arange(b)[has], batch.lengths[has] - 1] = 0.0  # the last token: no target
        return out

    def teacher_logprobs(self, pb: PolicyBatch, rows: torch.Tensor) -> torch.Tensor:
        """Teacher log-probs on the student positions of `rows` (0 where no teacher)."""
        student = select_rows(pb.student, rows)
        has = pb.has_teacher[rows]
        if pb.teacher is None or not bool(has.any()):
            return torch.zeros_like(student.rollout_logprobs)
        teacher_row = torch.cumsum(pb.has_teacher.long(), 0) - 1  # student row -> teacher row
        teacher = select_rows(pb.teacher, teacher_row[rows][has])
        values = self.score(teacher)  # [B_t, s_t]
        return align_teacher(values, teacher.loss_mask, student.loss_mask, has)

    # ------------------------------------------------------------ one update

    def train_step(self, pb: PolicyBatch, replay: TokenBatch | None = None) -> dict[str, float]:
        """One SEED (or GRPO, `use_opd=False`) update on a batch; returns global metrics.

        replay: Stage-1 analyzer examples (`loss_mask` on the answer tokens) whose NLL,
        weighted by `algo.replay_weight`, joins every optimizer step of this update
        (analyzer replay); needed exactly when that weight is not 0."""
        algo = self.cfg.algo
        if bool(algo.replay_weight) != (replay is not None):
            raise ValueError("algo.replay_weight > 0 needs replay examples, and only then")
        lr = lr_at(self.cfg.optim, self.state.step, max(1, self.cfg.updates))
        self.set_lr(lr)
        old = self.score(pb.student, count_routes=True)  # [B, s]
        if algo.beta_kl and self.ref_model is None:
            raise RuntimeError("beta_kl != 0 needs the reference model (reference=True)")
        ref = self.score(pb.student, self.ref_model) if algo.beta_kl else None
        use_opd = algo.use_opd
        all_rows = torch.arange(pb.rows)
        snapshot = None
        if use_opd and algo.teacher_mode == "snapshot":
            snapshot = self.teacher_logprobs(pb, all_rows)
        parts = mini_batches(pb.rows, self.cfg.optim.mini_batches_per_update)
        # the teacher log-probs each row first trains with (diagnostics only): theta_old's in
        # `snapshot` mode; in `live` mode those of the weights at its first-epoch mini-batch
        first_teacher = snapshot
        if use_opd and first_teacher is None:
            first_teacher = torch.zeros_like(old)  # [B, s]
        totals: dict[str, float] = {}
        minis = parts * self.cfg.optim.epochs_per_update
        steps = 0
        trained = torch.zeros(pb.rows, dtype=torch.bool)  # [B] rows some step trained on
        for i, mini in enumerate(minis):
            if not carries_signal(algo, pb.advantages[mini]):
                continue  # `AlgoConfig.no_signal`: no step, the Adam state untouched
            steps += 1
            trained[mini] = True
            teacher = None
            if use_opd:
                teacher = (
                    snapshot[mini] if snapshot is not None else self.teacher_logprobs(pb, mini)
                )
                if snapshot is None and i < len(parts):
                    first_teacher[mini] = teacher
            metrics = self._optimizer_step(
                pb, mini, old[mini], None if ref is None else ref[mini], teacher, replay
            )
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value
        totals = {k: v / steps for k, v in totals.items()}  # mean over the steps taken
        for key in [k for k in totals if k.startswith("grad_sq/")]:
            totals["grad/" + key.removeprefix("grad_sq/")] = math.sqrt(totals.pop(key))
        totals["lr"] = lr
        totals["steps"] = float(steps)
        totals["steps_skipped"] = float(len(minis) - steps)
        totals.update(_policy_stats(old, pb.student))
        totals.update(_mismatch(old, pb.student))
        if use_opd:  # live mode scored the teacher only for the rows that trained
            seen = trained if snapshot is None else torch.ones_like(trained)
            scored = dataclasses.replace(pb, has_teacher=pb.has_teacher & seen)
            totals.update(_opd_condition(scored, old, first_teacher, algo.beta_opd))
        if self._router_stats is not None:  # over every training pass of this update
            totals.update(self._router_stats.pop())
            totals.update(self.route_agreement())  # the routers against the engine's
        self.state.step += 1
        return totals

    def replaying_routes(self) -> contextlib.AbstractContextManager[None]:
        """Inside this block a mixture-of-experts model routes the tokens a batch brings
        routes for as given, also with `algo.routing_replay` off (the refit probe, scored on
        each engine's own routes); nothing for a dense model."""
        return self._routes.replaying() if self._routes is not None else contextlib.nullcontext()

    def route_agreement(self) -> dict[str, float]:
        """`moe/route_agreement` and `moe/routes_replayed` over the scored tokens counted
        since the last call (`score(..., count_routes=True)`: theta_old's pass in an
        update); {} for a dense model or nothing counted. A collective."""
        return self._routes.pop() if self._routes is not None else {}

    def _optimizer_step(self, pb, mini, old, ref, teacher, replay=None) -> dict[str, float]:
        student = select_rows(pb.student, mini)
        mask = student.loss_mask  # [m, s]
        has = pb.has_teacher[mini]  # [m]
        num_tokens = mask.sum().float()
        num_opd = (mask & has[:, None]).sum().float()
        adv = pb.advantages[mini]  # [m]
        if self.cfg.algo.loss_agg == "seq_mean_token_mean":
            adv = adv * sequence_weights(mask, num_tokens)
        tensors = {  # [m, s] each: per-row values broadcast to tokens, so that they pack
            "input_ids": student.input_ids,
            "labels": student.labels,
            "mask": mask,
            "old": old,
            "ref": old if ref is None else ref,
            "teacher": old if teacher is None else teacher,
            "adv": adv[:, None].expand_as(old),
            "opd_mask": has[:, None].expand_as(mask),
        }
        if student.routes is not None:  # [m, s, layers, k]
            tensors["routes"] = student.routes
        lengths = student.lengths
        if replay is not None:
            tensors, lengths = _with_replay(tensors, lengths, replay)
            num_replay = replay.loss_mask.sum().float().clamp(min=1.0)
        local, pad_frac = self._micro_batches(tensors, lengths)
        algo = self.cfg.algo
        update = self.state.step  # 0-based index of this update, restored on resume

        def loss_fn(mb: dict[str, torch.Tensor], nll: torch.Tensor):
            dev = nll.device
            args = (
                mb["old"].to(dev),
                mb["adv"].to(dev),
                mb["mask"].to(dev),
            )
            kwargs = dict(
                ref_logp=mb["ref"].to(dev),
                teacher_logp=mb["teacher"].to(dev),
                opd_mask=mb["opd_mask"].to(dev),
                num_tokens=num_tokens,
                num_opd_tokens=num_opd.clamp(min=1.0),
                update=update,
            )
            logp = -nll  # [b, s] log pi_theta, with grad
            loss, metrics = seed_loss(algo, logp, *args, **kwargs)
            metrics.update(term_grad_sq(algo, logp, *args, **kwargs))  # logged only
            if replay is not None:  # analyzer replay: the Stage-1 NLL on the answer tokens
                replay_nll = (nll * mb["replay"].to(dev)).sum() / num_replay
                loss = loss + algo.replay_weight * replay_nll
                metrics[REPLAY_NLL] = replay_nll.detach()
                metrics["loss/total"] = loss.detach()
            return loss, metrics

        logs, grad_norm = self._adam_step(local, loss_fn)
        metrics = self._reduce_metrics(logs)
        if self._step_aux_loss is not None:
            metrics["moe/aux_loss"] = self._step_aux_loss
        metrics["grad_norm"] = grad_norm
        metrics["tokens"] = float(num_tokens)
        metrics["pad_frac"] = pad_frac
        return metrics

    def _adam_step(self, batches: list[dict[str, Any]], loss_fn) -> tuple[list[dict], float]:
        """Forward/backward over this rank's micro-batches, then one optimizer step."""
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        aux = self.cfg.algo.moe_aux_loss
        if aux:  # each micro-batch's aux loss weighs 1 / (the step's micro-batches, all ranks)
            count = torch.tensor([float(len(batches))])
            dist.all_reduce(count, group=_ps().get_data_parallel_group())
            self.model.module.config.moe_aux_loss_coeff = aux / float(count)
        stats = self._router_stats.collecting() if self._router_stats else contextlib.nullcontext()
        with stats:
            logs = run_schedule(self.model, batches, loss_fn, False)
        # the routers' load-balancing loss of this step, for the caller's metrics
        self._step_aux_loss = _aux_loss_per_micro_batch(float(count)) if aux else None
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("optimizer step was skipped (non-finite gradients)")
        return logs, float(grad_norm) if grad_norm is not None else float("nan")

    def _reduce_metrics(self, logs: list[dict]) -> dict[str, float]:
        """Sum per-micro-batch metrics over micro-batches and DP; share them with all stages."""
        ps = _ps()
        vec = torch.zeros(len(self._metric_keys), dtype=torch.float32)
        for d in logs:
            vec += torch.stack([d[k].detach().float().cpu() for k in self._metric_keys])
        dev = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else "cpu"
        )
        vec = vec.to(dev)
        if self.dp[1] > 1:
            dist.all_reduce(vec, group=ps.get_data_parallel_group())
        out = broadcast_from_last_stage(
            vec if ps.is_pipeline_last_stage() else None, tuple(vec.shape)
        )
        return {k: float(v) for k, v in zip(self._metric_keys, out.cpu().tolist(), strict=True)}

    # ------------------------------------------------------------ supervised steps

    def nll_step(self, batch: TokenBatch) -> dict[str, float]:
        """One Adam step on the masked-token NLL of `batch` (SFT on skill tokens, behaviour
        cloning on actions): the global masked mean over `batch.loss_mask`, any layout."""
        mask = batch.loss_mask  # [B, s]
        num_tokens = mask.sum().float().clamp(min=1.0)
        local, pad_frac = self._micro_batches(
            {"input_ids": batch.input_ids, "labels": batch.labels, "mask": mask}, batch.lengths
        )

        def loss_fn(mb: dict[str, torch.Tensor], nll: torch.Tensor):
            m = mb["mask"].to(nll.device)
            loss = (nll * m).sum() / num_tokens
            return loss, {"nll": loss.detach()}

        logs, grad_norm = self._adam_step(local, loss_fn)
        ps = _ps()
        total = torch.zeros(1)
        for d in logs:
            total += d["nll"].float().cpu()
        dev = total if not torch.cuda.is_available() else total.cuda()
        if self.dp[1] > 1:
            dist.all_reduce(dev, group=ps.get_data_parallel_group())
        total = broadcast_from_last_stage(dev if ps.is_pipeline_last_stage() else None, (1,))
        metrics = {
            "nll": float(total.cpu()[0]),
            "grad_norm": grad_norm,
            "tokens": float(num_tokens),
            "pad_frac": pad_frac,
        }
        if self._step_aux_loss is not None:
            metrics["moe/aux_loss"] = self._step_aux_loss
        if self._router_stats is not None:
            metrics.update(self._router_stats.pop())
        return metrics

    def set_lr(self, lr: float) -> None:
        """Change the learning rate (SFT and RL use different ones)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ------------------------------------------------------------ inspection

    def grads_by_hf_name(self) -> dict[str, torch.Tensor]:
        """Full (TP-gathered, PP-broadcast) gradients of the last step, by HF name."""
        from megatron_seed.models.convert import export_hf_weights

        params = {id(p): p for p in self.model.module.parameters()}
        swapped = []
        for p in params.values():
            swapped.append((p, p.data))
            p.data = p.main_grad.to(p.dtype) if hasattr(p, "main_grad") else p.grad
        try:
            return {k: v.clone().cpu() for k, v in export_hf_weights(self.model.module, self.spec)}
        finally:
            for p, data in swapped:
                p.data = data


def _plain_aux_loss_scale(model: Any) -> None:
    """Have every MoE router add its load-balancing loss's gradient unscaled.

    With `calculate_per_token_loss` a megatron-core router multiplies each micro-batch's aux
    loss by its number of tokens, expecting `finalize_model_grads` to divide every gradient
    by the step's token count. This trainer's losses are normalised by their token counts
    already and its `finalize_model_grads` divides nothing, so that factor would weigh the
    aux loss by a micro-batch's tokens. A router copies the flag when it is built (before
    the trainer turns it on for the model, so it is off today); it is set off here so that
    it stays so. `_adam_step` sets the coefficient to `algo.moe_aux_loss` / (the step's
    micro-batches over DP)."""
    from megatron.core.transformer.moe.router import TopKRouter

    for module in model.modules():
        if isinstance(module, TopKRouter):
            module.calculate_per_token_loss = False


def _aux_loss_per_micro_batch(micro_batches: float) -> float:
    """The routers' load-balancing loss of the step just run (unweighted, summed over MoE
    layers, mean over its `micro_batches` micro-batches on all ranks), read from and cleared
    in megatron-core's tracker."""
    from megatron.core.transformer.moe import moe_utils

    tracker = moe_utils.get_moe_layer_wise_logging_tracker()
    if "load_balancing_loss" not in tracker:
        return 0.0
    # per layer: summed over PP and TP (each TP rank's share of its tokens), averaged over DP
    moe_utils.reduce_aux_losses_tracker_across_ranks(["load_balancing_loss"])
    values = tracker["load_balancing_loss"]["values"]
    dp = _ps().get_data_parallel_world_size()
    total = float(values.sum()) * dp / micro_batches
    moe_utils.clear_aux_losses_tracker()
    return total
