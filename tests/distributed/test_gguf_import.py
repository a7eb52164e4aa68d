"""GGUF import, CI-sized: a tiny untied Llama written to GGUF here with the `gguf` package's
writer (F32 norms and o_proj, an F16 embedding and down_proj, Q8_0 and Q4_1 projections, q/k
rows permuted as llama.cpp's converter stores them, the tiny tokenizer and its chat template
as metadata), imported with `seed convert gguf-to-hf`, then: its weights are exactly the
dequantized file's and transformers loading the GGUF gives the same model and tokenizer;
Megatron log-probs match at TP=1, TP=2 and PP=2 with a bit-exact HF->Megatron->HF round trip;
a vLLM fleet serves it, and after a sync of changed weights from a Megatron trainer its
log-probs equal the trainer's. The one-line refusals: not GGUF, truncated, an architecture, a tensor
type or a RoPE scaling that cannot be imported.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from megatron_seed import cli  # noqa: E402
from megatron_seed.models.tiny import make_tiny_qwen  # noqa: E402
from tests.cli_checks import refused_in_one_line  # noqa: E402

Q = gguf.GGMLQuantizationType
# HF name suffix -> (GGUF name suffix, stored type); layer tensors are blk.{i}.<suffix>
LAYER_TENSORS = {
    "input_layernorm.weight": ("attn_norm.weight", Q.F32),
    "self_attn.q_proj.weight": ("attn_q.weight", Q.Q8_0),
    "self_attn.k_proj.weight": ("attn_k.weight", Q.Q4_1),
    "self_attn.v_proj.weight": ("attn_v.weight", Q.Q4_1),
    "self_attn.o_proj.weight": ("attn_output.weight", Q.F32),
    "post_attention_layernorm.weight": ("ffn_norm.weight", Q.F32),
    "mlp.gate_proj.weight": ("ffn_gate.weight", Q.Q4_1),
    "mlp.up_proj.weight": ("ffn_up.weight", Q.Q8_0),
    "mlp.down_proj.weight": ("ffn_down.weight", Q.F16),
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": ("token_embd.weight", Q.F16),
    "model.norm.weight": ("output_norm.weight", Q.F32),
    "lm_head.weight": ("output.weight", Q.Q8_0),
}
PROBE = "<|im_start|>user\nYour task is to: put a clean mug in coffeemachine 1.<|im_end|>\n"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for its RoPE (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _stored(name: str, w: np.ndarray, qtype: int, cfg: dict) -> np.ndarray:
    """The tensor as the file stores it (q/k permuted, quantized)."""
    if name.endswith("q_proj.weight"):
        w = permute(w, cfg["num_attention_heads"])
    elif name.endswith("k_proj.weight"):
        w = permute(w, cfg["num_key_value_heads"])
    return gguf.quants.quantize(np.ascontiguousarray(w), qtype)


def write_llama_gguf(hf_dir: Path, tokenizer, path: Path, arch: str = "llama", extra=()) -> dict:
    """Write `hf_dir` (a tiny HF Llama) as a GGUF file; return the HF tensors the file
    holds after dequantization (what an import must reproduce exactly)."""
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    sd = {k: v.numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    _add_tokenizer(w, tokenizer, cfg["vocab_size"])
    expected: dict[str, torch.Tensor] = {}
    names = {**GLOBAL_TENSORS}
    for i in range(cfg["num_hidden_layers"]):
        for hf, (name, qtype) in LAYER_TENSORS.items():
            names[f"model.layers.{i}.{hf}"] = (f"blk.{i}.{name}", qtype)
    for hf, (name, qtype) in names.items():
        data = _stored(hf, sd[hf], qtype, cfg)
        w.add_tensor(name, data, raw_dtype=qtype)
        expected[hf] = _dequantized(sd[hf], qtype)
    for name, array, qtype in extra:  # (name, array, stored type or None)
        w.add_tensor(name, array, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def _dequantized(w: np.ndarray, qtype: int) -> torch.Tensor:
    """`w` stored as `qtype` and read back (per row block: it commutes with the q/k row
    permutation, so the permuted file reads back to this, rows restored)."""
    stored = gguf.quants.quantize(np.ascontiguousarray(w), qtype)
    return torch.from_numpy(gguf.quants.dequantize(stored, qtype).reshape(w.shape).copy())


def _add_tokenizer(w, tokenizer, vocab: int) -> None:
    """The tiny tokenizer as llama.cpp's metadata: byte-level BPE ("gpt2") with Qwen2's split
    regex ("qwen2"), its special tokens as CONTROL, padded to the model's vocabulary."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    ids = {t: i for t, i in spec["model"]["vocab"].items()}
    tokens = [t for t, _ in sorted(ids.items(), key=lambda kv: kv[1])]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(tokenizer.chat_template)


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny untied Llama (default RoPE, as a GGUF without rope_freqs carries), vocabulary
    the tokenizer's rounded up to 4 (divisible by TP=2)."""
    vocab = -(-len(tiny_tokenizer) // 4) * 4
    rope = {"rope_type": "default", "rope_theta": 100000.0}
    return make_tiny_qwen(
        tmp_path_factory.mktemp("gguf") / "src", seed=7, model_type="llama",
        vocab_size=vocab, tie_word_embeddings=False, rope_parameters=rope,
    )  # fmt: skip


@pytest.fixture(scope="module")
def gguf_file(source, tiny_tokenizer) -> tuple[Path, dict]:
    path = source.parent / "tiny-llama.gguf"
    return path, write_llama_gguf(source, tiny_tokenizer, path)


@pytest.fixture(scope="module")
def imported(gguf_file) -> Path:
    out = gguf_file[0].parent / "imported"
    assert cli.main(["convert", "gguf-to-hf", "--gguf", str(gguf_file[0]), "--out", str(out)]) == 0
    return out


def test_import_is_the_dequantized_file_and_what_transformers_loads(
    gguf_file, imported, tiny_tokenizer
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, expected = gguf_file
    weights = load_file(str(imported / "model.safetensors"))
    assert set(weights) == set(expected)
    for name, tensor in expected.items():  # dequantized, q/k rows back in HF order
        assert weights[name].dtype == torch.float32 and torch.equal(weights[name], tensor), name
    direct = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    for name, tensor in direct.state_dict().items():
        assert torch.equal(weights[name], tensor), name
    tok = AutoTokenizer.from_pretrained(imported)
    from_file = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    want = tiny_tokenizer.encode(PROBE + " café 42", add_special_tokens=False)
    assert tok.encode(PROBE + " café 42", add_special_tokens=False) == want
    assert from_file.encode(PROBE + " café 42", add_special_tokens=False) == want
    assert tok.chat_template == tiny_tokenizer.chat_template and tok.eos_token == "<|im_end|>"
    config = json.loads((imported / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2)])
def test_imported_llama_parity_and_roundtrip(imported, tp, pp) -> None:
    from megatron_seed.models.parity import check_parity

    result = check_parity(imported, tp, pp, batch=2, seq=32)
    assert result["max_abs_diff"] <= 1e-4, result
    assert result["ranks_agree"] and result["roundtrip_exact"], result["mismatched"]


def test_fleet_serves_the_import_and_follows_a_weight_sync(imported, tiny_tokenizer) -> None:
    """One vLLM engine on the imported folder: it generates what transformers generates
    (greedy), and after a Megatron trainer streams changed weights its log-probs equal the
    trainer's (the refit probe's check; the TP=2 export path: test_fleet.py)."""
    ray = pytest.importorskip("ray")
    from megatron_seed.models.parallel import spawn
    from megatron_seed.rollout.engine import EngineSpec, SamplingSpec
    from megatron_seed.rollout.fleet import Fleet, FleetSpec
    from tests.distributed.fleet_workers import trainer_syncs_fleet

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    fleet = Fleet(str(imported), FleetSpec(engines=1, engine=EngineSpec(kv_cache_bytes=32 << 20)))
    try:
        prompt = tiny_tokenizer.encode(PROBE + "<|im_start|>assistant\n", add_special_tokens=False)
        (out,) = fleet.generate([prompt], SamplingSpec(max_tokens=8, temperature=0.0))
        assert len(out.token_ids) > 0  # 8 unless the model ends its reply first
        assert out.token_ids == _hf_greedy(imported, prompt, 8)[: len(out.token_ids)]
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, len(tiny_tokenizer), (2, 32), generator=g)  # [b, s]
        results = spawn(trainer_syncs_fleet, 1, str(imported), 1, fleet.address, ids, 1, 1 << 20)
        (sync,) = results[0]["rounds"]
        assert float((sync["before"] - sync["trainer"]).abs().max()) > 1e-2  # weights changed
        assert float((sync["after"][0] - sync["trainer"]).abs().max()) <= 1e-4
    finally:
        fleet.close()
        ray.shutdown()


def _hf_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of `prompt` (float32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return ids[0, len(prompt) :].tolist()


# ---------------------------------------------------------------- one-line refusals


def _refused(capsys, gguf_path: Path, out: Path, *more: str) -> str:
    argv = ["convert", "gguf-to-hf", "--gguf", str(gguf_path), "--out", str(out), *more]
    err = refused_in_one_line(capsys, argv)
    assert not out.exists()  # refused before anything is written
    return err


def test_refusals_are_one_line(gguf_file, source, tiny_tokenizer, tmp_path, capsys) -> None:
    path, _ = gguf_file
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    assert "is not a GGUF file" in _refused(capsys, text, tmp_path / "a")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "truncated" in _refused(capsys, cut, tmp_path / "b")
    other = tmp_path / "gemma.gguf"
    write_llama_gguf(source, tiny_tokenizer, other, arch="gemma")
    assert "architecture 'gemma' cannot be imported" in _refused(capsys, other, tmp_path / "c")
    q8k = tmp_path / "q8k.gguf"  # 292 bytes per 256 values: a type gguf has no numpy code for
    extra = [("blk.0.extra.weight", np.zeros((4, 292), np.uint8), Q.Q8_K)]
    write_llama_gguf(source, tiny_tokenizer, q8k, extra=extra)
    assert "Q8_K (1 tensors) cannot be dequantized" in _refused(capsys, q8k, tmp_path / "d")
    rope = tmp_path / "rope.gguf"
    extra = [("rope_freqs.weight", np.ones(16, np.float32), None)]
    write_llama_gguf(source, tiny_tokenizer, rope, extra=extra)
    assert "rope_freqs.weight cannot be imported" in _refused(capsys, rope, tmp_path / "e")
    # options another direction reads are refused, not ignored
    assert "not --tp --pp" in _refused(capsys, path, tmp_path / "f", "--tp", "2", "--pp", "2")
    argv = ["convert", "hf-to-hf", "--hf", str(tmp_path), "--gguf", str(path), "--out", "g"]
    assert "gguf-to-hf only" in refused_in_one_line(capsys, argv)
