"""Exact Hugging Face <-> Megatron weight mapping for the Qwen and Llama families, for any
TP x PP (x EP) layout. Llama's HF names are Qwen2's, without the q/k/v biases.

Megatron layout (local spec; TE spec names in brackets):
  embedding.word_embeddings.weight          [V/tp, h]       <- model.embed_tokens (rows split)
  decoder.layers.i.input_layernorm.weight   [h]             <- input_layernorm
      [TE: self_attention.linear_qkv.layer_norm_weight]
  decoder.layers.i.self_attention.linear_qkv.{weight,bias}  <- q/k/v_proj, interleaved per
      query group as [q (heads/groups * d), k (d), v (d)]; TP splits by groups
  decoder.layers.i.self_attention.{q,k}_layernorm.weight [d] <- q_norm / k_norm (Qwen3)
  decoder.layers.i.self_attention.linear_proj.weight [h, q/tp] <- o_proj (columns split)
  decoder.layers.i.pre_mlp_layernorm.weight [h]             <- post_attention_layernorm
      [TE: mlp.linear_fc1.layer_norm_weight]
  decoder.layers.i.mlp.linear_fc1.weight    [2f/tp, h]      <- [gate_r; up_r] per TP rank
  decoder.layers.i.mlp.linear_fc2.weight    [h, f/tp]       <- down_proj (columns split)
  decoder.final_layernorm.weight            [h]             <- model.norm
  output_layer.weight                       [V/tp, h]       <- lm_head (or embed_tokens if tied)
Mixture-of-experts layers (Qwen3-MoE) instead of the MLP:
  decoder.layers.i.mlp.router.weight        [E, h]          <- mlp.gate (replicated)
  decoder.layers.i.mlp.experts.local_experts.j.linear_fc1.weight [2f/etp, h]
      [TE: mlp.experts.linear_fc1.weight{j}] <- [gate_r; up_r] of mlp.experts.{g}
  decoder.layers.i.mlp.experts.local_experts.j.linear_fc2.weight [h, f/etp]
      [TE: mlp.experts.linear_fc2.weight{j}] <- mlp.experts.{g}.down_proj (columns split)
  where local expert j of EP rank r is global expert g = r * E/ep + j, and etp (expert
  tensor parallel) splits each expert as TP splits the dense MLP.
Layer i is local to the pipeline stage; its global index is stage * layers_per_stage + i.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megatron_seed.data.tokenizer import TOKENIZER_FILES
from megatron_seed.models.qwen import ModelConfigError, QwenSpec

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# Megatron suffix -> HF suffix for the tensors that are copied or split without reordering.
_LAYER_PLAIN = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_SPLIT_COLUMNS = {"self_attention.linear_proj.weight", "mlp.linear_fc2.weight"}
_ROUTER = "mlp.router.weight"
# an expert's weight: the local spec's SequentialMLP, or TE's grouped GEMM
_EXPERT = re.compile(
    r"^mlp\.experts\.(?:local_experts\.(\d+)\.(linear_fc[12])\.weight|(linear_fc[12])\.weight(\d+))$"
)


@dataclass(frozen=True)
class ExpertShard:
    """Which experts a rank holds: EP rank `ep_rank` of `ep` holds experts
    [ep_rank * E/ep, (ep_rank + 1) * E/ep), each split `etp` ways (this rank: `etp_rank`)."""

    ep_rank: int = 0
    ep: int = 1
    etp_rank: int = 0
    etp: int = 1

    def global_expert(self, spec: QwenSpec, local: int) -> int:
        """The global index of this rank's local expert `local`."""
        return self.ep_rank * (spec.num_experts // self.ep) + local

    def owner(self, spec: QwenSpec, expert: int) -> int:
        """The EP rank that holds global expert `expert`."""
        return expert // (spec.num_experts // self.ep)


def _expert_of(suffix: str) -> tuple[int, str] | None:
    """(local expert index, "linear_fc1" | "linear_fc2") of an expert weight, else None."""
    match = _EXPERT.match(suffix)
    if not match:
        return None
    if match.group(1) is not None:
        return int(match.group(1)), match.group(2)
    return int(match.group(4)), match.group(3)


def _hf_expert(i: int, expert: int, proj: str) -> str:
    return f"model.layers.{i}.mlp.experts.{expert}.{proj}_proj.weight"


# ------------------------------------------------------------------ reading HF checkpoints


class HFCheckpoint:
    """Lazy access to the tensors of a HF safetensors checkpoint folder."""

    def __init__(self, path: str | Path) -> None:
        from safetensors import safe_open

        self.path = Path(path)
        self.spec = QwenSpec.from_pretrained(self.path)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ModelConfigError(f"no *.safetensors weights in {self.path}")
        self._where: dict[str, Path] = {}
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as handle:
                    for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                        self._where[key] = f
            except Exception as err:  # SafetensorError: truncated or not safetensors
                raise ModelConfigError(
                    f"{f} is truncated or not a safetensors file: {err}"
                ) from None
        self._open: dict[Path, Any] = {}
        embed = self.shape("model.embed_tokens.weight")
        if embed[0] != self.spec.vocab_size or embed[1] != self.spec.hidden_size:
            raise ModelConfigError(
                f"vocab mismatch: embed_tokens is {list(embed)} but config.json says "
                f"vocab_size={self.spec.vocab_size}, hidden_size={self.spec.hidden_size}"
            )

    def _handle(self, name: str) -> Any:
        from safetensors import safe_open

        if name not in self._where:
            raise ModelConfigError(f"checkpoint {self.path} lacks tensor {name!r}")
        f = self._where[name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), framework="pt")
        return self._open[f]

    def has(self, name: str) -> bool:
        """Whether the checkpoint stores `name`."""
        return name in self._where

    def names(self) -> list[str]:
        """Every stored tensor name, in file order."""
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of a stored tensor without reading it."""
        return tuple(self._handle(name).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        """Read one tensor."""
        return self._handle(name).get_tensor(name)

    def get_part(self, name: str, dim: int, part: int, parts: int) -> torch.Tensor:
        """`get(name).chunk(parts, dim)[part]`, reading only that part from the file (a TP
        rank of a 72B model reads its 1/TP of each tensor, not all of it)."""
        if parts == 1:
            return self.get(name)
        piece = self._handle(name).get_slice(name)
        shape = piece.get_shape()
        if shape[dim] % parts:  # uneven: torch.chunk's rounding, from the whole tensor
            return self.get(name).chunk(parts, dim=dim)[part]
        size = shape[dim] // parts
        index = [slice(None)] * len(shape)
        index[dim] = slice(part * size, (part + 1) * size)
        return piece[tuple(index)]


# ------------------------------------------------------------------ QKV and gate/up layouts


def interleave_qkv(
    spec: QwenSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int | None = None
) -> torch.Tensor:
    """HF q/k/v (weights [n*d, h] or biases [n*d]) -> Megatron's per-group interleaved QKV.
    `groups`: the KV groups q/k/v hold (default all; a TP rank's share of them)."""
    g, d = groups or spec.num_kv_heads, spec.head_dim
    per = spec.num_heads // spec.num_kv_heads  # query heads per KV group
    tail = q.shape[1:]
    q = q.reshape(g, per * d, *tail)
    k = k.reshape(g, d, *tail)
    v = v.reshape(g, d, *tail)
    return torch.cat([q, k, v], dim=1).reshape(-1, *tail)


def split_qkv(spec: QwenSpec, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `interleave_qkv` for the full (TP-gathered) tensor."""
    g, d = spec.num_kv_heads, spec.head_dim
    per = spec.num_heads // g
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (per + 2) * d, *tail)
    q, k, v = torch.split(grouped, [per * d, d, d], dim=1)
    return (
        q.reshape(-1, *tail).contiguous(),
        k.reshape(-1, *tail).contiguous(),
        v.reshape(-1, *tail).contiguous(),
    )


# ------------------------------------------------------------------ HF -> Megatron


def _hf_layer(i: int, suffix: str) -> str:
    return f"model.layers.{i}.{suffix}"


def hf_tensor_for(
    name: str,
    ckpt: HFCheckpoint,
    tp_rank: int,
    tp: int,
    layer_offset: int,
    experts: ExpertShard | None = None,
) -> torch.Tensor:
    """The shard of Megatron parameter `name` (local to this stage) for TP rank `tp_rank`
    (and, for an expert's weight, this rank's `experts` shard); only that shard is read from
    the checkpoint."""
    spec = ckpt.spec
    if name == "embedding.word_embeddings.weight":
        return ckpt.get_part("model.embed_tokens.weight", 0, tp_rank, tp)
    if name == "output_layer.weight":
        src = "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
        return ckpt.get_part(src, 0, tp_rank, tp)
    if name == "decoder.final_layernorm.weight":
        return ckpt.get("model.norm.weight")
    match = _LAYER.match(name)
    if not match:
        raise KeyError(f"no HF mapping for Megatron parameter {name!r}")
    i, suffix = layer_offset + int(match.group(1)), match.group(2)
    if suffix in _LAYER_PLAIN:
        hf = _hf_layer(i, _LAYER_PLAIN[suffix])
        if suffix in _SPLIT_COLUMNS:
            return ckpt.get_part(hf, 1, tp_rank, tp)
        return ckpt.get(hf)
    if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        # rank r holds KV groups [r g/tp, (r+1) g/tp): the same row chunk of q, k and v
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = (
            ckpt.get_part(_hf_layer(i, f"self_attn.{p}_proj.{kind}"), 0, tp_rank, tp) for p in "qkv"
        )
        return interleave_qkv(spec, q, k, v, groups=spec.num_kv_heads // tp)
    if suffix == "mlp.linear_fc1.weight":
        gate = ckpt.get_part(_hf_layer(i, "mlp.gate_proj.weight"), 0, tp_rank, tp)
        up = ckpt.get_part(_hf_layer(i, "mlp.up_proj.weight"), 0, tp_rank, tp)
        return torch.cat([gate, up], dim=0)
    if suffix == _ROUTER:
        return ckpt.get(_hf_layer(i, "mlp.gate.weight"))
    expert = _expert_of(suffix)
    if expert is not None:
        experts = experts or ExpertShard()
        g, part = experts.global_expert(spec, expert[0]), experts.etp_rank
        if expert[1] == "linear_fc2":
            return ckpt.get_part(_hf_expert(i, g, "down"), 1, part, experts.etp)
        gate = ckpt.get_part(_hf_expert(i, g, "gate"), 0, part, experts.etp)
        up = ckpt.get_part(_hf_expert(i, g, "up"), 0, part, experts.etp)
        return torch.cat([gate, up], dim=0)
    raise KeyError(f"no HF mapping for Megatron parameter {name!r}")


def _stage_info() -> tuple[int, int, int]:
    from megatron.core import parallel_state as ps

    return (
        ps.get_tensor_model_parallel_rank(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_rank(),
    )


def _expert_shard() -> ExpertShard:
    """This rank's `ExpertShard` in the initialised Megatron groups."""
    from megatron.core import parallel_state as ps

    return ExpertShard(
        ep_rank=ps.get_expert_model_parallel_rank(),
        ep=ps.get_expert_model_parallel_world_size(),
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        etp=ps.get_expert_tensor_parallel_world_size(),
    )


def load_hf_weights(model: torch.nn.Module, ckpt: HFCheckpoint | str | Path) -> None:
    """Copy a HF checkpoint into this rank's Megatron model stage, in place."""
    if not isinstance(ckpt, HFCheckpoint):
        ckpt = HFCheckpoint(ckpt)
    tp_rank, tp, pp_rank = _stage_info()
    unwrapped = getattr(model, "module", model)
    offset = pp_rank * (ckpt.spec.num_layers // max(1, _pp_size()))
    experts = _expert_shard()
    with torch.no_grad():
        for name, tensor in unwrapped.state_dict().items():
            if name.endswith("_extra_state"):
                continue
            src = hf_tensor_for(name, ckpt, tp_rank, tp, offset, experts)
            if src.shape != tensor.shape:
                raise ModelConfigError(
                    f"shape mismatch for {name}: checkpoint gives {list(src.shape)}, "
                    f"model expects {list(tensor.shape)}"
                )
            tensor.copy_(src.to(tensor.dtype))


def _pp_size() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_pipeline_model_parallel_world_size()


# ------------------------------------------------------------------ Megatron -> HF


def hf_names(spec: QwenSpec) -> list[str]:
    """Every tensor name of the HF checkpoint, in a fixed order."""
    names = ["model.embed_tokens.weight"]
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight"]
        for proj in "qkv":
            names.append(p + f"self_attn.{proj}_proj.weight")
            if spec.qkv_bias:
                names.append(p + f"self_attn.{proj}_proj.bias")
        if spec.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight"]
        if spec.sparse_layers and spec.sparse_layers[i]:  # one expert's tensors together
            names.append(p + "mlp.gate.weight")
            for e in range(spec.num_experts):
                names += [_hf_expert(i, e, m) for m in ("gate", "up", "down")]
        else:
            names += [p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
    names.append("model.norm.weight")
    if not spec.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def _tp_parts(local: torch.Tensor, expert: bool) -> list[torch.Tensor]:
    """Every TP rank's shard of `local` (the expert-TP group's for an expert weight)."""
    from megatron.core import parallel_state as ps

    if expert:
        size, group = (
            ps.get_expert_tensor_parallel_world_size(),
            ps.get_expert_tensor_parallel_group(),
        )
    else:
        size, group = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_tensor_model_parallel_group(),
        )
    if size == 1:
        return [local]
    parts = [torch.empty_like(local) for _ in range(size)]
    torch.distributed.all_gather(parts, local.contiguous(), group=group)
    return parts


def _gather_tp(local: torch.Tensor, dim: int, expert: bool = False) -> torch.Tensor:
    return torch.cat(_tp_parts(local, expert), dim=dim)


def _gather_fc1(local: torch.Tensor, expert: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    halves = [p.chunk(2, dim=0) for p in _tp_parts(local, expert)]
    return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])


class _LocalStageToHF:
    """Full HF tensors of this pipeline stage's layers, built one Megatron parameter at a
    time when asked for (TP-gathered then), so an export never holds the whole stage twice.

    `sources` maps each HF name this stage holds to its Megatron parameter; a fused one (QKV,
    gate/up) is gathered once and its parts are kept until they are asked for."""

    def __init__(self, model: torch.nn.Module, spec: QwenSpec) -> None:
        from megatron.core import parallel_state as ps

        unwrapped = getattr(model, "module", model)
        self.spec = spec
        self.params = {
            k: v for k, v in unwrapped.state_dict().items() if not k.endswith("_extra_state")
        }
        self.offset = ps.get_pipeline_model_parallel_rank() * (spec.num_layers // _pp_size())
        self.experts = _expert_shard()
        self.sources: dict[str, str] = {}
        for name in self.params:
            for hf in self._hf_names_of(name, self.offset):
                self.sources[hf] = name
        self._parts: dict[str, torch.Tensor] = {}

    def _hf_names_of(self, name: str, offset: int) -> list[str]:
        spec = self.spec
        if name == "embedding.word_embeddings.weight":
            return ["model.embed_tokens.weight"]
        if name == "output_layer.weight":
            return [] if spec.tie_word_embeddings else ["lm_head.weight"]
        if name == "decoder.final_layernorm.weight":
            return ["model.norm.weight"]
        match = _LAYER.match(name)
        if not match:
            raise KeyError(f"no HF mapping for Megatron parameter {name!r}")
        i, suffix = offset + int(match.group(1)), match.group(2)
        if suffix in _LAYER_PLAIN:
            return [_hf_layer(i, _LAYER_PLAIN[suffix])]
        if suffix.startswith("self_attention.linear_qkv."):
            kind = suffix.rsplit(".", 1)[1]
            return [_hf_layer(i, f"self_attn.{p}_proj.{kind}") for p in "qkv"]
        if suffix == "mlp.linear_fc1.weight":
            return [_hf_layer(i, "mlp.gate_proj.weight"), _hf_layer(i, "mlp.up_proj.weight")]
        if suffix == _ROUTER:
            return [_hf_layer(i, "mlp.gate.weight")]
        expert = _expert_of(suffix)
        if expert is not None:
            g = self.experts.global_expert(spec, expert[0])
            projs = ("down",) if expert[1] == "linear_fc2" else ("gate", "up")
            return [_hf_expert(i, g, m) for m in projs]
        raise KeyError(f"no HF mapping for Megatron parameter {name!r}")

    def holds(self, hf_name: str) -> bool:
        """Whether this rank has (its TP share of) HF tensor `hf_name`."""
        return hf_name in self.sources

    def any_param(self) -> torch.Tensor:
        """One of this stage's parameters (for dtype and device)."""
        return next(iter(self.params.values()))

    def get(self, hf_name: str) -> torch.Tensor:
        """The full HF tensor; a collective over the TP group (every TP rank asks in turn)."""
        if hf_name in self._parts:
            return self._parts.pop(hf_name)
        name = self.sources[hf_name]
        local = self.params[name].detach()
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            return _gather_tp(local, 0)
        if name == "decoder.final_layernorm.weight":
            return local
        suffix = _LAYER.match(name).group(2)
        if suffix in _LAYER_PLAIN:
            return _gather_tp(local, 1) if suffix in _SPLIT_COLUMNS else local
        if suffix == _ROUTER:
            return local
        expert = _expert_of(suffix)
        if expert is not None and expert[1] == "linear_fc2":
            return _gather_tp(local, 1, expert=True)
        names = self._hf_names_of(name, self.offset)
        if suffix.startswith("self_attention.linear_qkv."):
            parts = split_qkv(self.spec, _gather_tp(local, 0))
        else:  # the dense or an expert's linear_fc1: [gate; up] per TP rank
            parts = _gather_fc1(local, expert=expert is not None)
        self._parts.update(zip(names, parts, strict=True))
        return self._parts.pop(hf_name)


def hf_shape(spec: QwenSpec, name: str) -> tuple[int, ...]:
    """The shape of HF tensor `name` of a model of this spec."""
    h, f, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    if ".mlp.experts." in name:
        f = spec.moe_ffn
    if name.endswith(".mlp.gate.weight"):
        return (spec.num_experts, h)
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    table = {
        "embed_tokens.weight": (spec.vocab_size, h),
        "lm_head.weight": (spec.vocab_size, h),
        "q_proj.weight": (q, h),
        "k_proj.weight": (kv, h),
        "v_proj.weight": (kv, h),
        "q_proj.bias": (q,),
        "k_proj.bias": (kv,),
        "v_proj.bias": (kv,),
        "o_proj.weight": (h, q),
        "q_norm.weight": (d,),
        "k_norm.weight": (d,),
        "gate_proj.weight": (f, h),
        "up_proj.weight": (f, h),
        "down_proj.weight": (h, f),
    }
    key = ".".join(name.split(".")[-2:])
    return table.get(key, (h,))


def _owner_stage(spec: QwenSpec, name: str) -> int:
    pp = _pp_size()
    if name == "model.embed_tokens.weight":
        return 0
    if name in ("model.norm.weight", "lm_head.weight"):
        return pp - 1
    layer = int(name.split(".")[2])
    return layer // (spec.num_layers // pp)


def export_hf_weights(
    model: torch.nn.Module, spec: QwenSpec, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream (HF name, full tensor) for the whole model, in `hf_names` order.

    A collective: every rank of the model-parallel group must iterate it to the end. Every
    rank receives every full tensor (gathered over TP, broadcast over EP from the rank that
    holds the expert, broadcast over PP), so any rank can feed the rollout engines; one
    tensor is in flight at a time.
    """
    from megatron.core import parallel_state as ps

    pp_group = ps.get_pipeline_model_parallel_group()
    pp_ranks = torch.distributed.get_process_group_ranks(pp_group) if _pp_size() > 1 else [0]
    my_stage = ps.get_pipeline_model_parallel_rank()
    local = _LocalStageToHF(model, spec)  # builds each tensor when it is its turn
    for name in hf_names(spec):
        owner = _owner_stage(spec, name)
        tensor = None
        if my_stage == owner:
            tensor = _from_expert_owner(local, spec, name)
        if _pp_size() > 1:
            if tensor is None:
                ref = local.any_param()
                tensor = torch.empty(hf_shape(spec, name), dtype=ref.dtype, device=ref.device)
            tensor = tensor.contiguous()
            torch.distributed.broadcast(tensor, src=pp_ranks[owner], group=pp_group)
        yield name, (tensor.to(dtype) if dtype is not None else tensor)


def _from_expert_owner(local: _LocalStageToHF, spec: QwenSpec, name: str) -> torch.Tensor:
    """HF tensor `name` of this stage: built here, or for an expert held by another EP rank
    broadcast from it over the EP group."""
    from megatron.core import parallel_state as ps

    if local.experts.ep == 1 or ".mlp.experts." not in name:
        return local.get(name)
    expert = int(name.split(".")[5])  # model.layers.{i}.mlp.experts.{e}.*
    group = ps.get_expert_model_parallel_group()
    src = torch.distributed.get_process_group_ranks(group)[local.experts.owner(spec, expert)]
    if local.holds(name):
        tensor = local.get(name).contiguous()
    else:
        ref = local.any_param()
        tensor = torch.empty(hf_shape(spec, name), dtype=ref.dtype, device=ref.device)
    torch.distributed.broadcast(tensor, src=src, group=group)
    return tensor


def save_hf_checkpoint(
    weights: Iterator[tuple[str, torch.Tensor]],
    out_dir: str | Path,
    hf_config: dict[str, Any],
    tokenizer_from: str | Path | None = None,
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Write a `save_pretrained`-compatible folder (config.json + safetensors shards)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.detach().cpu().contiguous()
        size += nbytes
    index: dict[str, str] = {}
    for n, shard in enumerate(shards):
        fname = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        index.update(dict.fromkeys(shard, fname))
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for s in shards for t in s.values())
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2)
        )
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    if tokenizer_from is not None:
        for f in Path(tokenizer_from).iterdir():
            if f.name.startswith((*TOKENIZER_FILES, "generation")):
                shutil.copy(f, out / f.name)
    return out
