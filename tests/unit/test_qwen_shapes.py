"""Real Qwen and Llama shapes on the CPU: `seed init-model` checkpoints (published config
numbers, reproducible random weights, a tokenizer with the family's special tokens at their
real ids and its chat template) and `ChatBuilder` against the Qwen2.5, Qwen3 and SmolLM2
templates."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from megatron_seed import cli
from megatron_seed.data import (
    Analysis,
    ChatBuilder,
    TrajectoryRecord,
    Turn,
    build_sequences,
    check_chat_template,
    default_system_prompt,
)
from megatron_seed.models.chat_templates import CHAT_TEMPLATES, QWEN2_5_CHAT_TEMPLATE
from megatron_seed.models.init_model import write_checkpoint
from megatron_seed.models.qwen_tokenizer import build_qwen_tokenizer
from megatron_seed.models.shapes import SHAPES, TINY

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SYSTEM = "You are an expert agent in a house.\nAnswer with one action."
TURNS = [  # (observation, action): several lines, spaces, a tab, unicode; no think blocks
    (
        "You are in the kitchen.\nYou see a cabinet 1, a  mug 2 and a café table 1.",
        "go to cabinet 1",
    ),
    ("You arrive at cabinet 1.\tThe cabinet 1 is closed.\n", "open cabinet 1"),
    ("You open the cabinet 1. In it, you see a plate 3.", " take plate 3 from cabinet 1"),
]


@pytest.fixture(scope="module")
def tokenizers():
    return {family: build_qwen_tokenizer(family) for family in ("qwen2", "qwen3")}


def _ids(tok, messages: list[dict], generation_prompt: bool) -> list[int]:
    return list(
        tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
        )
    )


# ---------------------------------------------------------------- ChatBuilder vs template


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("system", [None, SYSTEM])
def test_chat_builder_ids_equal_the_checkpoint_templates(tokenizers, family, system) -> None:
    tok = tokenizers[family]
    chat = ChatBuilder(tok, system)
    messages = [] if system is None else [{"role": "system", "content": system}]
    for k, (user, action) in enumerate(TURNS):
        messages.append({"role": "user", "content": user})
        prompt = chat.prompt_ids(user) if k == 0 else chat.append_user(user)
        assert prompt == _ids(tok, messages, generation_prompt=True), (family, system, k)
        chat.append_action([*tok.encode(action, add_special_tokens=False), tok.eos_token_id])
        messages.append({"role": "assistant", "content": action})
    built = chat.sequence().input_ids
    full = _ids(tok, messages, generation_prompt=False)
    text = tok.decode(built)
    if family == "qwen2":
        assert built == full
        # the template's default system prompt, exactly when the chat has none
        assert text.startswith(f"<|im_start|>system\n{system or QWEN_SYSTEM}<|im_end|>\n")
    else:
        # Qwen3 renders a chat's final reply with an empty think block; the sequence holds
        # the sampled ids, and the template's history (earlier turns) has no think block
        header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
        cut = max(i for i in range(len(built)) if built[i : i + len(header)] == header)
        think = tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
        assert full == built[: cut + len(header)] + think + built[cut + len(header) :]
        assert QWEN_SYSTEM not in text and text.startswith(
            "<|im_start|>system" if system else "<|im_start|>user"
        )


def test_default_system_prompts(tokenizers, tiny_tokenizer) -> None:
    assert default_system_prompt(tokenizers["qwen2"]) == QWEN_SYSTEM
    assert default_system_prompt(tokenizers["qwen3"]) is None
    assert default_system_prompt(tiny_tokenizer) is None  # the test bed's: unchanged
    assert tiny_tokenizer.decode(ChatBuilder(tiny_tokenizer).prompt_ids("hi")) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_skill_in_the_system_prompt_extends_the_default_one(tokenizers) -> None:
    tok = tokenizers["qwen2"]
    user, action = TURNS[0]
    ids = [*tok.encode(action, add_special_tokens=False), tok.eos_token_id]
    record = TrajectoryRecord(
        task_id="t",
        group_id="g",
        game="g",
        family="f",
        turns=[Turn(user, action, ids, [-0.5] * len(ids))],
        reward=1.0,
        won=True,
        skill="Open before you take.",
        analysis=Analysis("t", valid=True),
    )
    (pair,) = build_sequences(record, tok, skill_insert_at="system")
    assert tok.decode(pair.student.input_ids).startswith(
        f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>"
    )
    assert tok.decode(pair.teacher.input_ids).startswith(
        f"<|im_start|>system\n{QWEN_SYSTEM}\n[Hindsight skill]\nOpen before you take.\n<|im_end|>"
    )
    assert pair.student.action_ids() == pair.teacher.action_ids() == ids


def test_a_template_the_builder_does_not_follow_fails_loud() -> None:
    tok = build_qwen_tokenizer("qwen3")
    # a thinking-only generation prompt (as Qwen3's 2507 thinking checkpoints have)
    tok.chat_template = CHAT_TEMPLATES["qwen3"].replace(
        "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking",
        "{{- '<|im_start|>assistant\\n<think>\\n' }}\n    {%- if enable_thinking",
    )
    assert tok.chat_template != CHAT_TEMPLATES["qwen3"]
    for _ in range(2):  # a failed check is not remembered as passed
        with pytest.raises(ValueError) as err:
            ChatBuilder(tok)
        message = str(err.value)
        assert "\n" not in message, message
        assert "differ at token" in message and "turn-1 prompt" in message, message
        assert "template '<think>', builder (end)" in message, message
    # history rendered differently: trailing whitespace of messages trimmed
    tok.chat_template = QWEN2_5_CHAT_TEMPLATE.replace(
        "message.content + '<|im_end|>'", "message.content | trim + '<|im_end|>'"
    )
    with pytest.raises(ValueError, match=r"differ at token \d+ of the turn-2 prompt"):
        check_chat_template(tok)
    tok.chat_template = CHAT_TEMPLATES["qwen3"]  # the real one passes
    ChatBuilder(tok)


def test_a_tokenizer_without_chat_template_is_not_checked() -> None:
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    tok = build_tokenizer(["go to cabinet 1, open it"] * 4, 300)
    tok.chat_template = None
    check_chat_template(tok, SYSTEM)
    assert tok.decode(ChatBuilder(tok).prompt_ids("hi")).startswith("<|im_start|>user\nhi")


def test_the_tokenizer_is_built_the_same_every_time(tokenizers) -> None:
    again = build_qwen_tokenizer("qwen2")
    assert again.backend_tokenizer.to_str() == tokenizers["qwen2"].backend_tokenizer.to_str()
    merges = json.loads(again.backend_tokenizer.to_str())["model"]["merges"]
    assert len(merges) == 655  # the corpus's (docs/launch.md)


# ---------------------------------------------------------------- seed init-model


@pytest.mark.parametrize(
    ("name", "billions"), [("qwen2.5-0.5b", 0.49), ("qwen2.5-1.5b", 1.54), ("qwen3-0.6b", 0.6)]
)
def test_new_shapes_match_published_sizes(name: str, billions: float) -> None:
    assert SHAPES[name].params / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize(
    ("name", "billions"),
    [("smollm2-135m", 0.1345), ("smollm2-360m", 0.3618), ("smollm2-1.7b", 1.711),
     ("llama-3.1-8b", 8.030), ("llama-3.1-70b", 70.55)],
)  # fmt: skip
def test_llama_shapes_write_configs_transformers_and_megatron_read_alike(name, billions) -> None:
    """The published sizes; transformers builds a Llama of exactly that many parameters from
    the written config (on the meta device) and `QwenSpec` reads the same numbers back."""
    from megatron_seed.models.init_model import hf_config, tensor_specs
    from megatron_seed.models.qwen import QwenSpec

    shape = SHAPES[name]
    assert shape.params / 1e9 == pytest.approx(billions, rel=0.001)
    config = hf_config(shape, shape.layers)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert sum(torch.Size(s).numel() for _, s in tensor_specs(config)) == shape.params
    spec = QwenSpec.from_hf_config(config)
    assert spec.num_params == shape.params and not spec.qkv_bias and not spec.qk_norm
    assert (spec.rope_theta, spec.rope_scaling_factor) == (
        shape.rope_theta,
        8.0 if name.startswith("llama-3.1") else 0.0,
    )


_layout_tokenizer = functools.cache(build_qwen_tokenizer)  # one per layout, read-only here


@pytest.mark.parametrize(
    ("layout", "ids", "total"),
    [("smollm2", (0, 1, 2), 49152), ("llama3-chatml", (128000, 128001, 128002), 128003)],
)
@pytest.mark.parametrize("system", [None, SYSTEM])
def test_llama_family_tokenizers_speak_chatml(layout, ids, total, system) -> None:
    """SmolLM2's tokens sit at its ids 0-16 and its template (a default system message) is
    what `ChatBuilder` renders; Llama 3.1 shapes get ChatML in Llama 3's reserved range."""
    tok = _layout_tokenizer(layout)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == list(ids)
    assert len(tok) == total and tok.eos_token == "<|im_end|>"
    check_chat_template(tok, system)
    text = tok.decode(ChatBuilder(tok, system).prompt_ids("hi"))
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    if system is None and layout == "smollm2":
        assert text.startswith(f"<|im_start|>system\n{default}<|im_end|>\n")
    else:
        assert default not in text


@pytest.mark.parametrize(
    ("name", "total", "active"), [("qwen3-30b-a3b", 30.5, 3.3), ("qwen3-235b-a22b", 235, 22)]
)
def test_moe_shapes_match_published_total_and_active_sizes(name, total, active) -> None:
    shape = SHAPES[name]
    assert shape.model_type == "qwen3_moe"
    assert shape.params / 1e9 == pytest.approx(total, rel=0.01)
    assert shape.active_params / 1e9 == pytest.approx(active, rel=0.02)


def test_init_model_bad_input_is_one_line_exit_2(tmp_path, capsys) -> None:
    def fails(argv: list[str], needle: str) -> None:
        assert cli.main(["init-model", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("seed init-model: error: "), err
        assert needle in err, (needle, err)

    out = str(tmp_path / "m")
    fails(["--shape", "qwen9", "--out", out], "unknown shape 'qwen9'; choose from qwen3-0.6b")
    fails(["--shape", "tiny", "--out", out], "unknown shape 'tiny'")  # not a Qwen shape
    fails(["--shape", "qwen2.5-0.5b", "--layers", "0", "--out", out], "--layers must be in 1..24")
    fails(["--shape", "qwen2.5-0.5b", "--layers", "25", "--out", out], "got 25")
    fails(["--shape", "qwen3-0.6b", "--dtype", "float16", "--out", out], "unknown dtype 'float16'")
    fails(["--shape", "qwen3-0.6b", "--experts", "8", "--out", out], "is a dense model")
    moe = ["--shape", "qwen3-30b-a3b", "--out", out]
    fails([*moe, "--experts", "4"], "--experts must be in 8..128")  # fewer than its top-8
    fails([*moe, "--experts", "129"], "got 129")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_text("stale")
    fails(["--shape", "qwen3-0.6b", "--out", out], "is not empty")
    fails(
        ["--shape", "qwen3-0.6b", "--out", str(tmp_path / "m" / "model.safetensors")],
        "not a folder",
    )
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["model.safetensors"]
    with pytest.raises(ValueError, match="vocab 512 cannot hold its tokenizer's ids"):
        write_checkpoint(TINY, tmp_path / "tiny")
    assert not (tmp_path / "tiny").exists()


@pytest.mark.parametrize(
    ("changes", "msg"),
    [(dict(family="lama"), "is not 'qwen' or 'llama'"), (dict(qk_norm=True), "no q/k/v bias"),
     (dict(experts=8, top_k=2, expert_ffn=64), "experts")],
)  # fmt: skip
def test_a_shape_of_no_family_we_build_is_refused(changes, msg) -> None:
    """A typo in `family` would have written a Qwen config, and a Llama shape with a Qwen3
    feature a config silently without it."""
    import dataclasses

    with pytest.raises(ValueError, match=msg):
        dataclasses.replace(SHAPES["smollm2-135m"], **changes)
