"""QwenSpec of Qwen3-MoE configs: the expert fields, which layers are sparse, the layout
checks with expert parallelism, and the parameter count against transformers' model."""

from __future__ import annotations

import pytest

from megatron_seed.models.qwen import ModelConfigError, QwenSpec, moe_settings
from megatron_seed.models.tiny import TINY_QWEN3, TINY_QWEN3_MOE


def test_a_qwen3_moe_config_gives_its_experts_and_router_rule():
    spec = QwenSpec.from_hf_config({**TINY_QWEN3_MOE, "num_hidden_layers": 4})
    assert (spec.num_experts, spec.top_k, spec.moe_ffn) == (8, 2, 64)
    assert spec.norm_topk_prob and spec.qk_norm and spec.is_moe
    assert spec.sparse_layers == (True, True, True, True)
    # transformers' own name for the expert count in saved configs
    cfg = {k: v for k, v in TINY_QWEN3_MOE.items() if k != "num_experts"}
    assert QwenSpec.from_hf_config({**cfg, "num_local_experts": 8}).num_experts == 8


def test_sparse_layers_follow_transformers_rule():
    cfg = {**TINY_QWEN3_MOE, "num_hidden_layers": 6, "decoder_sparse_step": 2,
           "mlp_only_layers": [3]}  # fmt: skip
    spec = QwenSpec.from_hf_config(cfg)
    # (i + 1) % 2 == 0 and i not in [3]
    assert spec.sparse_layers == (False, True, False, False, False, True)
    settings = moe_settings(spec, ep=2, aux_loss_coeff=0.0, grouped_gemm=False)
    assert settings["moe_layer_freq"] == [0, 1, 0, 0, 0, 1]
    assert settings["moe_router_load_balancing_type"] == "none"
    assert settings["moe_router_pre_softmax"] is False  # renormalised: top-k, then softmax


def test_the_parameter_count_is_transformers_count():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**TINY_QWEN3_MOE, "num_hidden_layers": 3, "mlp_only_layers": [1]}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    assert QwenSpec.from_hf_config(cfg).num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "cfg,tp,ep,message",
    [
        (TINY_QWEN3_MOE, 1, 3, "EP=3 does not divide the 8 experts"),
        (TINY_QWEN3, 1, 2, "EP=2 is for mixture-of-experts models"),
        ({**TINY_QWEN3_MOE, "moe_intermediate_size": 63}, 3, 1, "TP=3 does not divide"),
        ({**TINY_QWEN3_MOE, "num_experts_per_tok": 9}, 1, 1, "num_experts_per_tok=9"),
    ],
)
def test_layouts_that_cannot_work_fail_in_one_line(cfg, tp, ep, message):
    with pytest.raises(ModelConfigError, match=message) as err:
        QwenSpec.from_hf_config(cfg).check_layout(tp, 1, ep)
    assert "\n" not in str(err.value)


def test_a_negative_load_balancing_weight_is_refused():
    spec = QwenSpec.from_hf_config(TINY_QWEN3_MOE)
    with pytest.raises(ModelConfigError, match="load-balancing"):
        moe_settings(spec, ep=1, aux_loss_coeff=-1.0, grouped_gemm=False)


@pytest.mark.parametrize(
    "shape,total,active",
    [  # Qwen's model cards: 30.5B total / 3.3B activated, 235B / 22B
        (dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
              moe_intermediate_size=768), 30.53e9, 3.35e9),
        (dict(hidden_size=4096, num_hidden_layers=94, num_attention_heads=64,
              moe_intermediate_size=1536), 235.09e9, 22.19e9),
    ],
)  # fmt: skip
def test_active_parameters_are_the_model_cards(shape, total, active):
    cfg = {**TINY_QWEN3_MOE, "vocab_size": 151936, "num_key_value_heads": 4, "head_dim": 128,
           "num_experts": 128, "num_experts_per_tok": 8, **shape}  # fmt: skip
    spec = QwenSpec.from_hf_config(cfg)
    assert spec.num_params == pytest.approx(total, rel=1e-3)
    assert spec.active_params == pytest.approx(active, rel=1e-3)


def test_active_parameters_drop_exactly_the_unrouted_experts():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**TINY_QWEN3_MOE, "num_hidden_layers": 3, "mlp_only_layers": [1]}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    total = sum(p.numel() for p in model.parameters())
    # experts of the two sparse layers, counted from transformers' own modules
    one_expert = (
        sum(
            p.numel()
            for n, p in model.named_parameters()
            if n.startswith("model.layers.0.mlp.experts")
        )
        // cfg["num_experts"]
    )
    unrouted = 2 * (cfg["num_experts"] - cfg["num_experts_per_tok"]) * one_expert
    assert QwenSpec.from_hf_config(cfg).active_params == total - unrouted
    dense = QwenSpec.from_hf_config(TINY_QWEN3)
    assert dense.active_params == dense.num_params


def test_experts_are_a_grouped_gemm_only_on_te_layers(monkeypatch):
    """A GPU without Transformer Engine builds the local spec (one MLP per expert): the
    config must not ask for the grouped GEMM there, whatever the device."""
    import torch

    from megatron_seed.models.qwen import transformer_config

    spec = QwenSpec.from_hf_config(TINY_QWEN3_MOE)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not transformer_config(spec).moe_grouped_gemm
    assert moe_settings(spec, ep=1, aux_loss_coeff=0.0, grouped_gemm=True)["moe_grouped_gemm"]


def test_the_moe_benchmark_compares_models_of_equal_active_parameters(tmp_path, tiny_tokenizer):
    """`seed bench moe`'s dense twin runs every token through as many parameters as the MoE
    model (its MLP is k experts wide); only the router's h x E per layer differs."""
    from megatron_seed.benchmarks.moe import write_models

    shape = {"hidden": 64, "heads": 2, "layers": 2, "experts": 4, "top_k": 2, "expert_ffn": 32}
    models = write_models(tmp_path, tiny_tokenizer, shape)
    moe, dense = (QwenSpec.from_pretrained(models[k]) for k in ("moe", "dense"))
    assert (moe.num_experts, moe.top_k, moe.moe_ffn) == (4, 2, 32)
    assert dense.intermediate_size == 64 and not dense.is_moe
    idle = 2 * (4 - 2) * 3 * 64 * 32
    assert moe.num_params - idle - dense.num_params == 2 * 64 * 4  # the routers
