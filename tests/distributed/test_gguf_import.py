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
from tests.gguf_files import Q, write_llama_gguf  # noqa: E402

PROBE = "<|im_start|>user\nYour task is to: put a clean mug in coffeemachine 1.<|im_end|>\n"


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
