"""Per-token log-probs of given token ids from a TP/PP-sharded Megatron model.

Scoring runs through Megatron's own pipeline schedule (`get_forward_backward_func`), so the
same code serves TP, PP and TP x PP. The last stage turns its vocabulary-parallel logits
into per-token NLL with `vocab_parallel_cross_entropy` (inside `GPTModel(..., labels=...)`):
full logits are never gathered. Convention: `logprobs[b, i] = log p(input_ids[b, i+1] |
input_ids[b, :i+1])`; the last position has no target and is 0.

Packed micro-batches (`megatron_seed.data.packing`): a micro-batch that carries `cu_seqlens`
(`[segments + 1]` int32) and `max_seqlen` is one `[1, T]` row of several sequences; it goes
to the model with Megatron's `PackedSeqParams` (`qkv_format="thd"`), so attention stays
inside each segment and RoPE restarts at each (Transformer Engine's kernels on GPUs,
`models.attention.SdpaDotProductAttention` with the local spec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch


def shifted_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """labels[:, i] = input_ids[:, i + 1]; the last column repeats a valid id (ignored)."""
    # input_ids: [b, s] -> labels: [b, s]
    return torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)


def micro_batches(tensors: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Split every `[b, ...]` tensor of a batch into micro-batches of `size` rows."""
    b = next(iter(tensors.values())).shape[0]
    if b % size:
        raise ValueError(f"batch of {b} rows is not divisible by micro-batch size {size}")
    return [{k: v[i : i + size] for k, v in tensors.items()} for i in range(0, b, size)]


def model_forward(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """One stage's forward; on the last stage the result is per-token NLL `[b, s]`. A packed
    micro-batch (`cu_seqlens` in it, b = 1) goes in with its `PackedSeqParams`; a `valid`
    mask `[b, s]` (the real tokens) tells mixture-of-experts routers which tokens to count
    in their load-balancing loss."""
    input_ids = batch["input_ids"]  # [b, s]
    b, s = input_ids.shape
    extra = {"padding_mask": ~batch["valid"]} if "valid" in batch else {}
    if "cu_seqlens" not in batch:
        position_ids = torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)
        return model(input_ids, position_ids, None, labels=batch["labels"], **extra)
    if b != 1:  # thd squeezes the batch dimension: one packed row per micro-batch
        raise ValueError(f"a packed micro-batch is one row, got {b}")
    params = packed_seq_params(batch["cu_seqlens"], batch["max_seqlen"])
    return model(
        input_ids, batch["position_ids"], None, labels=batch["labels"],
        packed_seq_params=params, **extra,
    )  # fmt: skip


def packed_seq_params(cu_seqlens: torch.Tensor, max_seqlen: int) -> Any:
    """Megatron's `PackedSeqParams` for one packed row: segments `cu_seqlens` (`[k + 1]`
    int32 offsets from 0 to T, on the model's device) with no padding inside a segment, so
    the `_padded` offsets are the same tensor; `max_seqlen` the longest segment, a Python
    int so that no kernel waits for a device-to-host copy. It must not be T when the row
    holds several segments: Megatron's unfused thd RoPE reads RoPE tables of exactly T rows
    as absolute positions over the whole row instead of restarting per segment."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = cu_seqlens.to(torch.int32)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu,
        cu_seqlens_kv_padded=cu,
        max_seqlen_q=int(max_seqlen),
        max_seqlen_kv=int(max_seqlen),
    )


def run_schedule(
    model: Any,
    batches: list[dict[str, Any]],
    loss_fn: Callable[[dict[str, Any], torch.Tensor], tuple[torch.Tensor, dict]],
    forward_only: bool,
) -> list[dict]:
    """Run Megatron's pipeline schedule over micro-batches of identical shape (padded rows,
    or packed `[1, T]` rows: `model_forward`).

    `loss_fn(batch, nll)` returns `(loss, logs)`; `loss` must already be normalised by the
    *global* token count (the schedule neither divides nor averages it: the config sets
    `calculate_per_token_loss`). Returns the per-micro-batch `logs` on the last stage,
    `[]` elsewhere.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    b, s = batches[0]["input_ids"].shape
    for mb in batches:
        if tuple(mb["input_ids"].shape) != (b, s):
            raise ValueError("all micro-batches must share one shape (pad them first)")
    config = _unwrap(model).config
    check_seq_multiple(config, s)
    config.calculate_per_token_loss = True
    fb = get_forward_backward_func()
    replay = _routes_of(model) if "routes" in batches[0] else None
    if replay is not None:
        replay.reset()
    try:
        logs = fb(
            forward_step_func=make_forward_step(loss_fn),
            data_iterator=iter(batches),
            model=[model],
            num_microbatches=len(batches),
            seq_length=s,
            micro_batch_size=b,
            forward_only=forward_only,
        )
        if replay is not None:
            replay.check_drained()
        return logs
    finally:
        if replay is not None:
            replay.reset()


def token_multiple(config: Any) -> int:
    """What tokens per micro-batch must be a multiple of for a model with this
    `TransformerConfig`: the FP8 recipe's block (`models.fp8`) on every rank's rows. Under
    sequence parallelism the sequence is split over the TP ranks and Transformer Engine checks
    the FP8 shapes on each rank's shard (s / TP rows), so the block times the TP size."""
    from megatron_seed.models.fp8 import seq_multiple

    fp8 = seq_multiple(getattr(config, "fp8_recipe", None) if config.fp8 else None)
    tp = config.tensor_model_parallel_size if config.sequence_parallel else 1
    return fp8 * tp


def check_seq_multiple(config: Any, s: int) -> None:
    """`ValueError` unless `s` tokens per micro-batch suit the model (`token_multiple`)."""
    block = token_multiple(config)
    if s % block:
        why = []
        if config.fp8:
            why.append(f"FP8 ({config.fp8_recipe})")
        if config.sequence_parallel:
            why.append(f"sequence parallelism at TP={config.tensor_model_parallel_size}")
        raise ValueError(
            f"{' and '.join(why)} needs micro-batches of a multiple of {block} tokens, got {s}: "
            "collate with pad_to_multiple_of=SeedTrainer.seq_multiple"
        )


def make_forward_step(
    loss_fn: Callable[[dict[str, torch.Tensor], torch.Tensor], tuple[torch.Tensor, dict]],
) -> Callable[[Iterator, Any], tuple[torch.Tensor, Callable]]:
    """The schedule's `forward_step`: the next micro-batch, moved to the model's device (the
    one place where batches leave the CPU), through the model; `loss_fn` sees it there too.
    A micro-batch's `routes` (`[b, s, layers, k]`, mixture-of-experts models) go to the
    model's routers first (`models.routing_replay`)."""

    def forward_step(data_iterator: Iterator, model_chunk: Any) -> tuple[torch.Tensor, Callable]:
        batch = to_device(next(data_iterator))
        if "routes" in batch:
            replay = _routes_of(model_chunk)
            if replay is None:
                raise ValueError("a micro-batch with routes needs a model with routing replay")
            config = _unwrap(model_chunk).config
            recompute = model_chunk.training and config.recompute_granularity == "full"
            replay.feed(batch, recompute)
        output = model_forward(model_chunk, batch)

        def loss_func(nll: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
            loss, logs = loss_fn(batch, nll)
            return loss, torch.tensor(1, dtype=torch.int), logs

        return output, loss_func

    return forward_step


def to_device(batch: dict[str, Any]) -> dict[str, Any]:
    """Every tensor of a micro-batch on the model's device (CPU tensors pinned and copied
    without blocking on CUDA; the model's first kernel orders after the copies). Other
    values (a packed row's `max_seqlen`) stay as they are."""
    dev = _device()

    def move(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        if dev.type != "cuda":
            return v.to(dev)
        return (v.pin_memory() if v.device.type == "cpu" else v).to(dev, non_blocking=True)

    return {k: move(v) for k, v in batch.items()}


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def _tail(key: str, v: torch.Tensor, n: int) -> torch.Tensor:
    """`n` columns of right padding for `[b, s, ...]` tensor `v`: its last column repeated,
    except for the `scored` mask (False)."""
    tail = v[:, -1:].expand(v.shape[0], n, *v.shape[2:])
    return torch.zeros_like(tail) if key == "scored" else tail


def _routes_of(model: Any) -> Any:
    from megatron_seed.models.routing_replay import routes_of

    return routes_of(model)


def _logprob_loss(batch: dict[str, torch.Tensor], nll: torch.Tensor) -> tuple[torch.Tensor, dict]:
    # nll: [b, s]
    return nll.sum() * 0.0, {"logprobs": -nll.detach().float()}


def broadcast_from_last_stage(tensor: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    """Give every pipeline stage the last stage's tensor (float32, known shape)."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        assert tensor is not None
        return tensor
    group = ps.get_pipeline_model_parallel_group()
    ranks = torch.distributed.get_process_group_ranks(group)
    if tensor is None:
        tensor = torch.empty(shape, dtype=torch.float32, device=_device())
    torch.distributed.broadcast(tensor.contiguous(), src=ranks[-1], group=group)
    return tensor


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


@torch.no_grad()
def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    micro_batch_size: int = 1,
    extra: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-token log-probs `[b, s]` of `input_ids` (`[b, s]`, identical on every TP rank).

    Position i holds log p(input_ids[i+1] | input_ids[:i+1]); position s-1 holds 0. Every
    rank of the model-parallel group must call this; all get the result. `extra`: more
    `[b, s, ...]` tensors for the micro-batches (`routes`, `scored`).
    """
    from megatron.core import parallel_state as ps

    was_training = _unwrap(model).training
    model.eval()
    b, s = input_ids.shape
    batch = _scoring_batch(model, input_ids, extra)
    logs = run_schedule(model, micro_batches(batch, micro_batch_size), _logprob_loss, True)
    out = None
    if ps.is_pipeline_last_stage():
        out = torch.cat([d["logprobs"] for d in logs], dim=0)[:, :s].contiguous()
        out[:, -1] = 0.0
    out = broadcast_from_last_stage(out, (b, s))
    if was_training:
        model.train()
    return out


def _scoring_batch(
    model: Any, input_ids: torch.Tensor, extra: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    """`input_ids` `[b, s]`, their labels and `extra`, right-padded to the model's token
    multiple (causal: earlier positions unchanged; the last token repeated, its route too;
    nothing is scored there)."""
    s = input_ids.shape[1]
    block = token_multiple(_unwrap(model).config)
    padded = -(-s // block) * block
    batch = {"input_ids": input_ids, "labels": shifted_labels(input_ids), **(extra or {})}
    if padded != s:
        batch = {k: torch.cat([v, _tail(k, v, padded - s)], 1) for k, v in batch.items()}
    return batch


def fp8_warm_pass(
    model: Any, input_ids: torch.Tensor, extra: dict[str, torch.Tensor] | None = None
) -> None:
    """One forward of `input_ids` (`[b, s]`, one micro-batch) *with autograd on*, its output
    dropped: what fills a delayed-scaling FP8 model's amax history and scales.

    Transformer Engine reduces the amaxes and updates delayed scales when the outermost
    `fp8_autocast` exits with grad enabled, never under `no_grad` (TE 2.11,
    `FP8GlobalStateManager.autocast_exit`), so a scoring pass cannot warm a model. No
    backward runs: the graph is freed with the output. Every rank of the model-parallel
    group must call this."""
    was_training = _unwrap(model).training
    model.eval()
    batch = _scoring_batch(model, input_ids, extra)
    with torch.enable_grad():
        run_schedule(model, [batch], _logprob_loss, True)
    if was_training:
        model.train()


@torch.no_grad()
def packed_logprobs(model: Any, batches: list[dict[str, Any]]) -> torch.Tensor:
    """Per-token log-probs `[r, T]` of r packed micro-batches (`[1, T]` each, `input_ids`,
    `labels` within each segment, `position_ids`, `cu_seqlens`, `max_seqlen`): position i
    holds log p(labels[i] | its segment up to i). Every rank of the model-parallel group
    must call this; all get the result. Unpacking (`PackPlan.unpack_tensor`) is the
    caller's."""
    from megatron.core import parallel_state as ps

    was_training = _unwrap(model).training
    model.eval()
    width = batches[0]["input_ids"].shape[1]
    logs = run_schedule(model, batches, _logprob_loss, True)
    out = None
    if ps.is_pipeline_last_stage():
        out = torch.cat([d["logprobs"] for d in logs], dim=0).contiguous()  # [r, T]
    out = broadcast_from_last_stage(out, (len(batches), width))
    if was_training:
        model.train()
    return out


def hf_token_logprobs(hf_model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """The same quantity from a transformers causal LM (the reference for parity checks)."""
    with torch.no_grad():
        logits = hf_model(input_ids=input_ids).logits.float()  # [b, s, V]
    logp = torch.log_softmax(logits, dim=-1)
    labels = shifted_labels(input_ids)
    out = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [b, s]
    out[:, -1] = 0.0
    return out
