"""`seed init-model` at real Qwen shapes (Qwen2.5-0.5B with 2 layers, Qwen3-0.6B with 1:
151,936-row embeddings, 0.3-0.7 GB checkpoints): transformers loads what it writes, the
tokenizer has Qwen's special tokens at their real ids, and the weights are a function of the
seed and the tensor's name. (Its input errors and the chat templates: tests/unit/test_qwen_shapes.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from megatron_seed import cli
from megatron_seed.data import check_chat_template
from megatron_seed.models.chat_templates import CHAT_TEMPLATES
from megatron_seed.models.init_model import init_tensor, write_checkpoint
from megatron_seed.models.qwen_tokenizer import ADDED_TOKENS, CORPUS
from megatron_seed.models.shapes import SHAPES

SYSTEM = "You are an expert agent in a house.\nAnswer with one action."


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("init") / "qwen3"
    return write_checkpoint(SHAPES["qwen3-0.6b"], out, layers=1)


@pytest.mark.parametrize(("shape", "layers"), [("qwen2.5-0.5b", 2), ("qwen3-0.6b", 1)])
def test_init_model_writes_a_qwen_folder_transformers_loads(qwen25, qwen3, shape, layers) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, spec = (qwen25 if shape == "qwen2.5-0.5b" else qwen3), SHAPES[shape]
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    cfg = model.config
    assert cfg.model_type == spec.model_type and cfg.vocab_size == 151936
    assert cfg.num_hidden_layers == layers and cfg.hidden_size == spec.hidden
    assert (
        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ) == spec.head_dim and cfg.num_key_value_heads == spec.kv_heads
    assert model.dtype == torch.float32 and cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # the launcher's parameter formula, at this depth
    assert (
        sum(p.numel() for p in model.parameters())
        == dataclasses.replace(spec, layers=layers).params
    )
    del model

    tok = AutoTokenizer.from_pretrained(path)
    added = ADDED_TOKENS[spec.model_type]
    assert len(tok) == 151643 + len(added) == (151665 if shape == "qwen2.5-0.5b" else 151669)
    for i, (token, _special) in enumerate(added):
        assert tok.convert_tokens_to_ids(token) == 151643 + i, token
        assert tok.encode(token, add_special_tokens=False) == [151643 + i]
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token) == (
        "<|im_end|>",
        151645,
        151643,
        None,
    )
    ids = tok.encode("\n".join(CORPUS), add_special_tokens=False)
    assert not [t for t in tok.convert_ids_to_tokens(ids) if t.startswith("<|filler_")]
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATES[spec.model_type]  # where Qwen keeps it
    assert config["tokenizer_class"] == "TokenizersBackend"
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "float32"
    check_chat_template(tok, SYSTEM)


def test_init_model_weights_are_a_function_of_seed_and_name(qwen25, tmp_path) -> None:
    from safetensors.torch import load_file

    one = tmp_path / "one"
    assert (
        cli.main(["init-model", "--shape", "qwen2.5-0.5b", "--layers", "1", "--out", str(one)]) == 0
    )
    two_layers, one_layer = (
        load_file(qwen25 / "model.safetensors"),
        load_file(one / "model.safetensors"),
    )
    assert "model.layers.1.mlp.up_proj.weight" in two_layers and len(one_layer) == 14
    for name, tensor in one_layer.items():  # same seed, another run and depth: identical
        assert torch.equal(tensor, two_layers[name]), name
    for name in (
        "model.layers.1.self_attn.q_proj.bias",
        "model.layers.1.post_attention_layernorm.weight",
    ):
        t = two_layers[name]
        assert torch.equal(t, init_tensor(name, tuple(t.shape), 0, torch.float32))
        assert not torch.equal(t, init_tensor(name, tuple(t.shape), 1, torch.float32))
    norm = two_layers["model.norm.weight"]
    assert 0.05 < float(norm.std()) < 0.2 and abs(float(norm.mean()) - 1) < 0.05
    assert abs(float(two_layers["model.embed_tokens.weight"][:1000].std()) - 0.02) < 1e-3


def test_init_model_writes_a_qwen3_moe_folder_transformers_loads(tmp_path) -> None:
    """Qwen3-30B-A3B at its real width, 1 layer, 8 of its 128 experts (bfloat16, 1.3 GB):
    one tensor per expert, every name transformers expects, the parameter formula exact."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out = tmp_path / "moe"
    argv = ["init-model", "--shape", "qwen3-30b-a3b", "--layers", "1", "--experts", "8"]
    assert cli.main([*argv, "--dtype", "bfloat16", "--out", str(out)]) == 0
    shape = dataclasses.replace(SHAPES["qwen3-30b-a3b"], layers=1, experts=8)
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    cfg = model.config
    assert (cfg.model_type, cfg.num_experts, cfg.num_experts_per_tok) == ("qwen3_moe", 8, 8)
    assert (cfg.moe_intermediate_size, cfg.norm_topk_prob, cfg.hidden_size) == (768, True, 2048)
    assert sum(p.numel() for p in model.parameters()) == shape.params
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        down = f.get_tensor("model.layers.0.mlp.experts.5.down_proj.weight")
    assert {f"model.layers.0.mlp.experts.{e}.up_proj.weight" for e in range(8)} <= names
    assert "model.layers.0.mlp.experts.gate_up_proj" not in names  # not transformers' fusion
    assert down.shape == (2048, 768)
    name = "model.layers.0.mlp.experts.5.down_proj.weight"
    assert torch.equal(down, init_tensor(name, (2048, 768), 0, torch.bfloat16))
    # transformers fuses the experts in memory: expert 5's down projection is the file's
    assert torch.equal(model.model.layers[0].mlp.experts.down_proj[5], down)


def test_init_model_writes_a_smollm2_folder_transformers_loads(tmp_path) -> None:
    """SmolLM2-135M at its real width and vocabulary, 2 layers: a LlamaForCausalLM with tied
    embeddings and the parameter formula's count, SmolLM2's special ids and ChatML template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "smollm2"
    assert (
        cli.main(["init-model", "--shape", "smollm2-135m", "--layers", "2", "--out", str(out)]) == 0
    )
    shape = dataclasses.replace(SHAPES["smollm2-135m"], layers=2)
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert (model.config.vocab_size, model.config.rope_parameters["rope_theta"]) == (49152, 1e5)
    assert sum(p.numel() for p in model.parameters()) == shape.params
    tok = AutoTokenizer.from_pretrained(out)
    assert [tok.encode(t, add_special_tokens=False) for t, _ in ADDED_TOKENS["smollm2"][:3]] == [
        [0], [1], [2]
    ]  # fmt: skip
    assert tok.chat_template == CHAT_TEMPLATES["smollm2"]
    check_chat_template(tok, SYSTEM)
