"""Megatron-core `GPTModel`s of the Qwen family (Qwen2, Qwen2.5, Qwen3 dense and Qwen3
mixture-of-experts) and the Llama family (Llama 2/3.x, SmolLM2), built from a Hugging Face
`config.json`.

The families are one architecture (pre-norm RMSNorm decoder, GQA, RoPE, SwiGLU MLP, tied or
untied embeddings); `FAMILIES` writes down where they differ: q/k/v biases (Qwen2), per-head
q/k norms (Qwen3), experts (Qwen3-MoE), the RoPE scalings a family's configs use (Llama 3.1's
"llama3"). `QwenSpec` (the name predates Llama) reads and validates any of them (fail loud:
unknown architectures, rope scaling we do not implement, TP/EP that does not divide
heads/groups/vocab/experts). `build_gpt_model` builds the local stage of the model for the
current Megatron process groups: the local layer spec on CPU (float32, see `compat.py`;
experts as a `SequentialMLP`), the Transformer Engine spec on GPUs (bf16, optional FP8;
experts as TE's grouped GEMM), with TE imported only there.

Qwen3-MoE in Megatron's terms: each sparse layer's MLP is a `MoELayer` whose router
(`mlp.router.weight` [E, h], HF `mlp.gate.weight`) scores every expert, picks the top k, and
weighs their outputs by the softmax of the chosen logits when `norm_topk_prob` (the softmax
over all experts, not renormalised, otherwise); no shared experts. Expert parallelism (EP)
places E/EP whole experts on each rank; expert tensor parallelism is TP's size.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megatron_seed.models.shapes import param_count


class ModelConfigError(ValueError):
    """A checkpoint or config that megatron-seed cannot build a model from."""


@dataclass(frozen=True)
class Family:
    """What one HF `model_type` adds to the shared decoder (everything else is common)."""

    qkv_bias: bool  # biases on q/k/v only (Qwen2); a config's `attention_bias` is refused
    qk_norm: bool  # RMSNorm over each head's q and k (Qwen3)
    moe: bool = False  # experts (Qwen3-MoE)
    rope_types: tuple[str, ...] = ("default",)  # RoPE scalings its configs may carry


FAMILIES: dict[str, Family] = {
    "qwen2": Family(qkv_bias=True, qk_norm=False),
    "qwen3": Family(qkv_bias=False, qk_norm=True),
    "qwen3_moe": Family(qkv_bias=False, qk_norm=True, moe=True),
    "llama": Family(qkv_bias=False, qk_norm=False, rope_types=("default", "llama3")),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
# Llama 3.x's "llama3" RoPE scaling: megatron-core 0.16.1 (`RotaryEmbedding._apply_scaling`)
# takes the factor and fixes the other three at Llama 3.1's published values, which every
# Llama 3.1/3.2/3.3 config.json uses; a config with others is refused.
LLAMA3_ROPE_FIXED = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class QwenSpec:
    """The architecture facts of a Qwen2/2.5/3 (dense or mixture-of-experts) or Llama
    checkpoint."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool
    qk_norm: bool
    # mixture-of-experts (Qwen3-MoE); 0 experts: a dense model
    num_experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0  # each expert's intermediate size
    norm_topk_prob: bool = True  # the chosen experts' weights renormalised to sum to 1
    sparse_layers: tuple[bool, ...] = ()  # per layer: MoE (True) or dense MLP
    # Llama 3.x's "llama3" RoPE scaling factor (`LLAMA3_ROPE_FIXED` the rest); 0: none
    rope_scaling_factor: float = 0.0

    @property
    def is_moe(self) -> bool:
        """Whether some layer's MLP is a mixture of experts."""
        return self.num_experts > 0

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> QwenSpec:
        """Validate a HF config dict of a supported family (`FAMILIES`)."""
        model_type = cfg.get("model_type")
        if model_type not in FAMILIES:
            archs = cfg.get("architectures")
            raise ModelConfigError(
                f"unsupported architecture model_type={model_type!r} architectures={archs}; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        family = FAMILIES[model_type]
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            if key not in cfg:
                raise ModelConfigError(f"config.json lacks {key!r}")
        experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        if experts and not family.moe:
            raise ModelConfigError(
                f"model_type {model_type!r} has no experts, config says {experts}"
            )
        _check_common(cfg, family)
        heads = cfg.get("num_attention_heads")
        hidden = cfg["hidden_size"]
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            qkv_bias=family.qkv_bias,
            qk_norm=family.qk_norm,
            **_rope_fields(cfg, family),
            **(_moe_fields(cfg, experts) if family.moe else {}),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> QwenSpec:
        """Read `config.json` from a checkpoint folder."""
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise ModelConfigError(f"no config.json in {path}")
        try:
            cfg = json.loads(config_path.read_text())
        except json.JSONDecodeError as err:
            raise ModelConfigError(f"{config_path} is not valid JSON: {err}") from err
        return cls.from_hf_config(cfg)

    def check_layout(self, tp: int, pp: int, ep: int = 1) -> None:
        """Fail loud if this model cannot be split `tp` x `pp` (x `ep` over experts) ways."""
        if tp < 1 or pp < 1 or ep < 1:
            raise ModelConfigError(f"tp, pp and ep must be >= 1, got tp={tp} pp={pp} ep={ep}")
        sizes = [
            ("attention heads", self.num_heads),
            ("query groups (KV heads)", self.num_kv_heads),
            ("vocab size", self.vocab_size),
        ]
        if not all(self.sparse_layers) or not self.is_moe:
            sizes.append(("intermediate size", self.intermediate_size))
        if self.is_moe:
            sizes.append(("expert intermediate size", self.moe_ffn))
        for what, n in sizes:
            if n % tp:
                raise ModelConfigError(f"TP={tp} does not divide the {what} ({n})")
        if self.num_layers % pp:
            raise ModelConfigError(f"PP={pp} does not divide the {self.num_layers} layers")
        if ep > 1 and not self.is_moe:
            raise ModelConfigError(f"EP={ep} is for mixture-of-experts models; this one is dense")
        if self.is_moe and self.num_experts % ep:
            raise ModelConfigError(f"EP={ep} does not divide the {self.num_experts} experts")

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied; every expert)."""
        sparse = sum(self.sparse_layers)
        common = dict(
            hidden=self.hidden_size, heads=self.num_heads, kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, ffn=self.intermediate_size, vocab=self.vocab_size,
            tied=self.tie_word_embeddings, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm,
        )  # fmt: skip
        dense = param_count(layers=self.num_layers - sparse, **common)
        if not sparse:
            return dense
        moe = param_count(
            layers=sparse, experts=self.num_experts, expert_ffn=self.moe_ffn, **common
        )
        return dense + moe - param_count(layers=0, **common)  # embeddings and final norm once

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: `num_params` less the experts it is not
        routed to (each sparse layer runs `top_k` of `num_experts` gated MLPs of 3 h x f)."""
        idle = self.num_experts - self.top_k if self.is_moe else 0
        return (
            self.num_params - sum(self.sparse_layers) * idle * 3 * self.hidden_size * self.moe_ffn
        )


def _check_common(cfg: dict[str, Any], family: Family) -> None:
    """Refuse, in one line, what no family's Megatron model here has: sliding windows, biases
    on the attention output or the MLP, an activation other than SiLU."""
    if cfg.get("use_sliding_window"):
        raise ModelConfigError("sliding-window attention is not supported")
    if cfg.get("attention_bias") and not family.qkv_bias:
        raise ModelConfigError(
            f"{cfg['model_type']} with attention_bias=True (biases on q/k/v and o_proj) is not "
            "supported"
        )
    if cfg.get("mlp_bias"):
        raise ModelConfigError("mlp_bias=True (biases on the MLP) is not supported")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"hidden_act {act!r} is not supported (SwiGLU: silu)")


def _rope_fields(cfg: dict[str, Any], family: Family) -> dict[str, Any]:
    """`rope_theta` and `rope_scaling_factor` from a config (transformers 5 writes
    `rope_parameters`, earlier releases `rope_theta` and `rope_scaling`)."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    if rope_type not in family.rope_types:
        raise ModelConfigError(
            f"rope scaling {rope_type!r} is not supported for {cfg['model_type']} "
            f"(supported: {', '.join(family.rope_types)})"
        )
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return {"rope_theta": theta}
    for key, fixed in LLAMA3_ROPE_FIXED.items():
        if float(rope.get(key, fixed)) != fixed:
            raise ModelConfigError(
                f"llama3 rope scaling with {key}={rope[key]} is not supported "
                f"(megatron-core fixes it at {fixed})"
            )
    factor = float(rope.get("factor", 0.0))
    if factor <= 1.0:
        raise ModelConfigError(f"llama3 rope scaling needs a factor > 1, got {factor}")
    return {"rope_theta": theta, "rope_scaling_factor": factor}


def _moe_fields(cfg: dict[str, Any], experts: int) -> dict[str, Any]:
    """QwenSpec's mixture-of-experts fields from a Qwen3-MoE config (transformers' rule for
    which layers are sparse: not in `mlp_only_layers` and (i + 1) % `decoder_sparse_step` == 0)."""
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        if not cfg.get(key):
            raise ModelConfigError(f"config.json of a qwen3_moe model lacks {key!r}")
    if not experts:
        raise ModelConfigError("config.json of a qwen3_moe model lacks 'num_experts'")
    top_k = cfg["num_experts_per_tok"]
    if not 1 <= top_k <= experts:
        raise ModelConfigError(f"num_experts_per_tok={top_k} must be in 1..{experts} (num_experts)")
    step = cfg.get("decoder_sparse_step", 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    layers = cfg["num_hidden_layers"]
    return dict(
        num_experts=experts,
        top_k=top_k,
        moe_ffn=cfg["moe_intermediate_size"],
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_layers=tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers)),
    )


RECOMPUTE: dict[str, dict[str, Any]] = {
    "none": {},
    "selective": {"recompute_granularity": "selective"},  # core attention
    "full": {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    },
}


def transformer_config(
    spec: QwenSpec,
    tp: int = 1,
    pp: int = 1,
    precision: str = "fp32",
    fp8_recipe: str | None = None,
    recompute: str = "none",
    initialize: bool = True,
    switches: dict[str, bool] | None = None,
    ep: int = 1,
    aux_loss_coeff: float = 0.0,
    te_spec: bool = False,
) -> Any:
    """The megatron-core `TransformerConfig` for `spec` (`recompute`: a `RECOMPUTE` key;
    `initialize=False` skips random initialisation, for weights loaded right after;
    `switches`: `gpu_switches`, all off by default; `ep`: expert parallel size;
    `aux_loss_coeff` > 0: the router's load-balancing loss with that weight, off by default
    as RL trainers of MoE models run it; `te_spec`: the layers are Transformer Engine's, so
    the experts are its grouped GEMM)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_seed.models.compat import filter_kwargs

    bf16 = precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    kwargs: dict[str, Any] = dict(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.intermediate_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        persist_layer_norm=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=bf16,
        use_cpu_initialization=not torch.cuda.is_available(),
        batch_p2p_sync=torch.cuda.is_available(),
        init_method_std=0.02,
        perform_initialization=initialize,
    )
    kwargs.update(gpu_switches(False, tp, False) if switches is None else switches)
    if spec.is_moe:
        kwargs.update(moe_settings(spec, ep, aux_loss_coeff, grouped_gemm=te_spec))
    if fp8_recipe:
        kwargs.update(fp8="hybrid", fp8_recipe=fp8_recipe)
    if recompute not in RECOMPUTE:
        raise ModelConfigError(f"recompute must be one of {list(RECOMPUTE)}, got {recompute!r}")
    kwargs.update(RECOMPUTE[recompute])
    # fusions that are off may be missing from a megatron-core release; anything else may not
    off = frozenset(k for k in OPTIONAL_SWITCHES if not kwargs[k])
    return TransformerConfig(**filter_kwargs(TransformerConfig.__init__, kwargs, off))


def moe_settings(
    spec: QwenSpec, ep: int, aux_loss_coeff: float, grouped_gemm: bool
) -> dict[str, Any]:
    """`TransformerConfig` fields of a Qwen3-MoE model: its experts, widths and sparse layers,
    Qwen3's router (softmax in fp32; `norm_topk_prob`: the top-k chosen first and their logits
    softmaxed, i.e. renormalised; otherwise the softmax over all experts, then the top k), the
    all-to-all token dispatcher over `ep` ranks, no token dropping; `grouped_gemm`: the
    experts are TE's grouped GEMM (the TE layer spec), else one local MLP per expert (a GPU
    without TE too: megatron-core's own grouped MLP needs a package we do not install)."""
    if aux_loss_coeff < 0:
        raise ModelConfigError(f"the load-balancing loss weight must be >= 0, got {aux_loss_coeff}")
    return dict(
        num_moe_experts=spec.num_experts,
        moe_ffn_hidden_size=spec.moe_ffn,
        moe_router_topk=spec.top_k,
        moe_layer_freq=[int(s) for s in spec.sparse_layers],
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not spec.norm_topk_prob,
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="aux_loss" if aux_loss_coeff else "none",
        moe_aux_loss_coeff=aux_loss_coeff,
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=grouped_gemm,
        expert_model_parallel_size=ep,
    )


OPTIONAL_SWITCHES = (
    "bias_dropout_fusion",
    "bias_activation_fusion",
    "masked_softmax_fusion",
    "apply_rope_fusion",
    "persist_layer_norm",
    "gradient_accumulation_fusion",
    "batch_p2p_sync",
)


def gpu_switches(on_gpu: bool, tp: int, use_te: bool, main_grad: bool = False) -> dict[str, bool]:
    """Megatron's efficiency switches for a model on this device; all off on the CPU.

    - `sequence_parallel` at TP > 1: norms and the residual stream split over the TP ranks
      along the sequence (activations / TP; tokens per micro-batch a multiple of TP,
      `logprobs.token_multiple`).
    - `bias_dropout_fusion`, `bias_activation_fusion` (SwiGLU), `masked_softmax_fusion` (the
      local spec's softmax): fused elementwise kernels.
    - with Transformer Engine: `apply_rope_fusion` (TE's fused RoPE) and, for a model whose
      parameters carry DDP's fp32 `main_grad` (`main_grad`: the trained policy, not the frozen
      reference), `gradient_accumulation_fusion` (weight-gradient GEMMs accumulate into it)
      where megatron-core can run it: its own linear layers (the output layer among them)
      refuse the switch without APEX's `fused_weight_gradient_mlp_cuda` extension.
    """
    return {
        "sequence_parallel": on_gpu and tp > 1,
        "bias_dropout_fusion": on_gpu,
        "bias_activation_fusion": on_gpu,
        "masked_softmax_fusion": on_gpu,
        "apply_rope_fusion": on_gpu and use_te,
        "gradient_accumulation_fusion": on_gpu and use_te and main_grad and wgrad_fusion(),
    }


def wgrad_fusion() -> bool:
    """Whether megatron-core's linear layers accept `gradient_accumulation_fusion`: its own
    check, that APEX's `fused_weight_gradient_mlp_cuda` extension imports."""
    from megatron.core.tensor_parallel import layers

    return bool(layers._grad_accum_fusion_available)


class LocalRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm in Megatron's norm signature, for the local spec's residual-stream
    norms. Under sequence parallelism each TP rank normalises only its slice of the sequence,
    so the weight is marked `sequence_parallel` and `finalize_model_grads` sums its gradient
    over TP (what TE's norms do; megatron-core's `WrappedTorchNorm` refuses the mode)."""

    def __init__(
        self,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "RMSNorm",
    ) -> None:
        if normalization != "RMSNorm" or zero_centered_gamma:
            raise ModelConfigError(f"LocalRMSNorm is a plain RMSNorm, not {normalization}")
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel


class HeadRMSNorm(LocalRMSNorm):
    """Qwen3's q/k norms in the local spec: an RMSNorm over each head's `head_dim`. It sees
    every token of its TP rank's heads whether or not the sequence is split (the QKV
    projection gathers it first), so its weight is not marked `sequence_parallel`;
    `finalize_model_grads` sums q/k norm gradients over TP by name (each rank holds other
    heads). megatron-core's `WrappedTorchNorm` refuses to be built under sequence
    parallelism, which a MoE model at TP > 1 needs."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(config, hidden_size, eps, **kwargs)
        self.weight.sequence_parallel = False


def layer_spec(
    spec: QwenSpec, use_te: bool, core_attention: type | None = None, moe: bool = False
) -> Any:
    """Transformer Engine layer spec on GPUs, the local (torch) spec elsewhere; `moe`: the
    layer's MLP is `spec`'s mixture of experts (TE's grouped GEMM on GPUs, megatron-core's
    `SequentialMLP`, one local MLP per expert, on the CPU).

    ``core_attention``: the local spec's core attention class; by default torch's fused
    causal attention instead of Megatron's [b, heads, s, s] score matrix (2-4x faster
    forward + backward on CPU at 512-2048 tokens, same parameters: `models.attention`).
    """
    from megatron.core.models.gpt import gpt_layer_specs

    experts = spec.num_experts if moe else None
    if use_te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=experts, moe_grouped_gemm=moe, qk_layernorm=spec.qk_norm
        )
    from megatron_seed.models.attention import SdpaDotProductAttention

    local = copy.deepcopy(  # a private copy: the spec may be shared by other callers
        gpt_layer_specs.get_gpt_layer_local_spec(
            num_experts=experts, qk_layernorm=spec.qk_norm, normalization="RMSNorm"
        )
    )
    attention = core_attention or SdpaDotProductAttention
    local.submodules.self_attention.submodules.core_attention = attention
    local.submodules.input_layernorm = LocalRMSNorm
    local.submodules.pre_mlp_layernorm = LocalRMSNorm
    if spec.qk_norm:
        attention_parts = local.submodules.self_attention.submodules
        attention_parts.q_layernorm = attention_parts.k_layernorm = HeadRMSNorm
    return local


def block_spec(config: Any, spec: QwenSpec, use_te: bool, core_attention: type | None) -> Any:
    """The decoder of this pipeline stage: `layer_spec` layers (each dense or MoE as
    `spec.sparse_layers` says), and with the local spec a `LocalRMSNorm` final norm
    (megatron-core's default would refuse sequence parallelism)."""
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    if use_te and not spec.is_moe:
        return layer_spec(spec, use_te)
    kinds = spec.sparse_layers or (False,) * spec.num_layers
    specs = {moe: layer_spec(spec, use_te, core_attention, moe) for moe in set(kinds)}
    offset = get_transformer_layer_offset(config)
    local = [specs[moe] for moe in kinds[offset : offset + get_num_layers_to_build(config)]]
    if use_te:
        from megatron.core.extensions.transformer_engine import TENorm

        return TransformerBlockSubmodules(layer_specs=local, layer_norm=TENorm)
    return TransformerBlockSubmodules(layer_specs=local, layer_norm=LocalRMSNorm)


def build_gpt_model(
    spec: QwenSpec,
    *,
    precision: str = "fp32",
    fp8_recipe: str | None = None,
    use_te: bool | None = None,
    core_attention: type | None = None,
    recompute: str = "none",
    initialize: bool = True,
    main_grad: bool = False,
    sequence_parallel: bool | None = None,
    logit_chunk_tokens: int = 0,
    aux_loss_coeff: float = 0.0,
) -> Any:
    """This process's stage of the model for the initialised Megatron process groups.

    `use_te` defaults to "CUDA is available and Transformer Engine imports";
    `core_attention` overrides the local spec's (`layer_spec`); `recompute`: activation
    recompute in backward (`RECOMPUTE`); `initialize=False`: no random init (every weight is
    about to be loaded); `main_grad`: the model is trained under Megatron's DDP (TE's
    gradient-accumulation fusion); the GPU switches follow `gpu_switches`, and
    `sequence_parallel` overrides that one (it runs on the CPU too); `logit_chunk_tokens` > 0:
    the labelled forward scores the sequence in chunks of about that many tokens
    (`models.chunked`: logits memory O(chunk x V/TP) instead of O(s x V/TP));
    `aux_loss_coeff`: the MoE router's load-balancing loss weight (`moe_settings`).
    """
    from megatron.core import parallel_state as ps

    from megatron_seed.models.chunked import ChunkedLossGPTModel

    tp = ps.get_tensor_model_parallel_world_size()
    pp = ps.get_pipeline_model_parallel_world_size()
    ep = ps.get_expert_model_parallel_world_size()
    spec.check_layout(tp, pp, ep)
    if use_te is None:
        use_te = torch.cuda.is_available() and te_available()
    if fp8_recipe and not use_te:
        raise ModelConfigError("FP8 needs Transformer Engine on a GPU")
    switches = gpu_switches(torch.cuda.is_available(), tp, use_te, main_grad)
    if sequence_parallel is not None:
        switches["sequence_parallel"] = sequence_parallel and tp > 1
    if spec.is_moe and tp > 1:
        # megatron-core's MoE layer refuses to train at TP > 1 without it (the tokens each
        # TP rank dispatches are its slice of the sequence); it runs on the CPU too
        if sequence_parallel is False:
            raise ModelConfigError(
                "a mixture-of-experts model at TP > 1 needs sequence parallelism"
            )
        switches["sequence_parallel"] = True
    config = transformer_config(
        spec,
        tp,
        pp,
        precision,
        fp8_recipe,
        recompute,
        initialize,
        switches,
        ep,
        aux_loss_coeff,
        te_spec=use_te,
    )
    model = ChunkedLossGPTModel(
        config=config,
        transformer_layer_spec=block_spec(config, spec, use_te, core_attention),
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope",
        **rope_kwargs(spec),
    )
    model.logit_chunk_tokens = logit_chunk_tokens
    cast_torch_norms(model, config.params_dtype)
    if not initialize:
        mark_tensor_parallel(model)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def rope_kwargs(spec: QwenSpec) -> dict[str, Any]:
    """megatron-core's RoPE arguments (`GPTModel`, `RotaryEmbedding`) for `spec`: its base
    and, for Llama 3.x, the "llama3" frequency scaling (`LLAMA3_ROPE_FIXED`)."""
    if spec.rope_scaling_factor <= 0:
        return {"rotary_base": int(spec.rope_theta)}
    return {
        "rotary_base": int(spec.rope_theta),
        "rope_scaling": True,
        "rope_scaling_factor": spec.rope_scaling_factor,
    }


def cast_torch_norms(model: Any, dtype: torch.dtype) -> None:
    """Give the local spec's torch norms (`LocalRMSNorm`, megatron-core's `WrappedTorchNorm`
    q/k norms), which torch creates in float32, the model's parameter dtype, as every
    Megatron and TE module has. A float32 parameter in a bf16 model sits out of Megatron's
    mixed-precision optimizer's bf16 groups, whose checkpoint then pairs optimizer states
    with the wrong parameters."""
    for module in model.modules():
        if isinstance(module, torch.nn.RMSNorm | torch.nn.LayerNorm):
            module.to(dtype)


def mark_tensor_parallel(model: Any) -> None:
    """Mark the split weights of Megatron's own tensor-parallel layers as split.

    Megatron sets `tensor_model_parallel` / `partition_dim` on a `ColumnParallelLinear`,
    `RowParallelLinear` or `VocabParallelEmbedding` weight only while initialising it, so a
    model built with `perform_initialization=False` (every weight about to be loaded) has
    unmarked shards. Everything that tells a shard from a TP duplicate then counts them as
    duplicates: the gradient norm (hence clipping) sums them on TP rank 0 only. Transformer
    Engine's layers mark their weights themselves; this adds only what is missing."""
    from megatron.core.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for module in model.modules():
        if isinstance(module, ColumnParallelLinear | VocabParallelEmbedding):
            dim = 0  # output rows (vocabulary rows) are split
        elif isinstance(module, RowParallelLinear):
            dim = 1  # input columns are split
        else:
            continue
        weight = getattr(module, "weight", None)
        if weight is not None and not hasattr(weight, "tensor_model_parallel"):
            set_tensor_model_parallel_attributes(weight, True, dim, 1)


def te_available() -> bool:
    """Whether Transformer Engine imports here."""
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True
