"""QwenSpec validation (Qwen and Llama configs, Llama 3.1's RoPE scaling against
transformers'), QKV interleaving and the bad-input paths of `seed convert` /
`seed check-parity` (each exits 2 with a one-line reason)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from megatron_seed.models.convert import interleave_qkv, split_qkv
from megatron_seed.models.qwen import ModelConfigError, QwenSpec
from megatron_seed.models.tiny import TINY_LLAMA, TINY_QWEN2, make_tiny_qwen


def _spec(**kw):
    return QwenSpec.from_hf_config({**TINY_QWEN2, **kw})


def test_qwen2_spec_from_hf_config():
    spec = _spec()
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (6, 2, 32)
    assert spec.qkv_bias and not spec.qk_norm


def test_rope_theta_read_from_rope_parameters():
    cfg = {k: v for k, v in TINY_QWEN2.items() if k != "rope_theta"}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    assert QwenSpec.from_hf_config(cfg).rope_theta == 1e6


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(model_type="mistral"), "unsupported architecture"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope scaling"),
        (dict(num_experts=8), "model_type .qwen2. has no experts"),
    ],
)
def test_unsupported_configs_fail_loud(kw, msg):
    with pytest.raises(ModelConfigError, match=msg):
        _spec(**kw)


def _llama(**kw):
    return QwenSpec.from_hf_config({**TINY_LLAMA, **kw})


def test_llama_spec_is_qwen2_without_biases_with_llama3_rope():
    spec = _llama()
    assert spec.model_type == "llama" and not spec.qkv_bias and not spec.qk_norm
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (4, 2, 32)
    assert spec.tie_word_embeddings and spec.rms_norm_eps == 1e-5
    assert (spec.rope_theta, spec.rope_scaling_factor) == (500000.0, 8.0)
    # transformers < 5 wrote rope_theta and rope_scaling at the top level
    legacy = {k: v for k, v in TINY_LLAMA.items() if k != "rope_parameters"}
    rope = {k: v for k, v in TINY_LLAMA["rope_parameters"].items() if k != "rope_theta"}
    old = QwenSpec.from_hf_config({**legacy, "rope_theta": 5e5, "rope_scaling": rope})
    assert (old.rope_theta, old.rope_scaling_factor) == (5e5, 8.0)
    plain = _llama(rope_parameters={"rope_type": "default", "rope_theta": 1e5})
    assert (plain.rope_theta, plain.rope_scaling_factor) == (1e5, 0.0)
    assert not _llama(tie_word_embeddings=False).tie_word_embeddings


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(attention_bias=True), r"llama with attention_bias=True .* is not supported"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
        (
            dict(rope_parameters={**TINY_LLAMA["rope_parameters"], "low_freq_factor": 2.0}),
            "low_freq_factor=2.0 is not supported",
        ),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "'yarn' is not supported"),
    ],
)
def test_llama_configs_we_cannot_build_fail_loud(kw, msg):
    with pytest.raises(ModelConfigError, match=msg) as info:
        _llama(**kw)
    assert "\n" not in str(info.value)


def test_llama3_rope_frequencies_equal_transformers():
    """The inverse frequencies megatron-core's RoPE gets from `rope_kwargs` are
    transformers' "llama3" ones (the log-prob parity of a short sequence barely sees the
    scaling: only the lowest frequencies change)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from megatron_seed.models.qwen import rope_kwargs

    spec = _llama()
    ours = RotaryEmbedding(spec.head_dim, 1.0, use_cpu_initialization=True, **rope_kwargs(spec))
    theirs = LlamaRotaryEmbedding(AutoConfig.for_model(**TINY_LLAMA)).inv_freq
    plain = RotaryEmbedding(spec.head_dim, 1.0, use_cpu_initialization=True, rotary_base=500000)
    assert not torch.allclose(plain.inv_freq, theirs)  # the scaling changes them
    torch.testing.assert_close(ours.inv_freq, theirs, rtol=1e-6, atol=0)


def test_the_built_llama_model_rotates_with_the_llama3_frequencies():
    """`build_gpt_model` hands `rope_kwargs` to the model it builds: its rotary embedding has
    transformers' "llama3" inverse frequencies (a model built without the scaling would still
    pass the log-prob parity of short sequences, within 1e-4)."""
    import subprocess
    import sys

    code = f"""
import torch
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from megatron_seed.models.parallel import init_parallel
from megatron_seed.models.qwen import QwenSpec, build_gpt_model
cfg = {TINY_LLAMA!r}
init_parallel(1, 1)
model = build_gpt_model(QwenSpec.from_hf_config(cfg))
theirs = LlamaRotaryEmbedding(AutoConfig.for_model(**cfg)).inv_freq
torch.testing.assert_close(model.rotary_pos_emb.inv_freq, theirs, rtol=1e-6, atol=0)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-1500:]


@pytest.mark.parametrize(
    "tp,pp,msg", [(4, 1, "attention heads"), (3, 1, "query groups"), (1, 3, "layers")]
)
def test_layout_checks(tp, pp, msg):
    with pytest.raises(ModelConfigError, match=msg):
        _spec().check_layout(tp, pp)


def test_qkv_interleave_matches_hand_layout():
    spec = _spec(hidden_size=4, num_attention_heads=4, num_key_value_heads=2, head_dim=1)
    q = torch.tensor([[1.0], [2.0], [3.0], [4.0]])  # heads 0..3, head_dim 1
    k = torch.tensor([[10.0], [20.0]])
    v = torch.tensor([[100.0], [200.0]])
    fused = interleave_qkv(spec, q, k, v)
    # group 0: q heads 0,1 | k0 | v0 ; group 1: q heads 2,3 | k1 | v1
    assert fused.flatten().tolist() == [1, 2, 10, 100, 3, 4, 20, 200]
    back = split_qkv(spec, fused)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v), strict=True))


def _seed(capsys: pytest.CaptureFixture, *args: str) -> SimpleNamespace:
    """`seed ARGS` in this process (the inputs are refused before any rank starts)."""
    from megatron_seed import cli

    code = cli.main(list(args))
    return SimpleNamespace(returncode=code, stderr=capsys.readouterr().err)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_qwen(tmp_path_factory.mktemp("m") / "qwen2")


def _copy(src, dst, skip=()):
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_cli_bad_inputs(tiny, tmp_path, capsys):
    cases = {
        "no config.json": _copy(tiny, tmp_path / "a", skip={"config.json"}),
        "no *.safetensors": _copy(tiny, tmp_path / "b", skip={"model.safetensors"}),
    }
    arch = _copy(tiny, tmp_path / "c")
    cfg = json.loads((arch / "config.json").read_text())
    (arch / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    cases["unsupported architecture"] = arch
    vocab = _copy(tiny, tmp_path / "d")
    (vocab / "config.json").write_text(json.dumps({**cfg, "vocab_size": 512}))
    cases["vocab mismatch"] = vocab
    for msg, path in cases.items():
        r = _seed(capsys, "check-parity", "--hf", str(path))
        assert r.returncode == 2, (msg, r.stderr)
        assert msg in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    r = _seed(
        capsys,
        "convert",
        "hf-to-megatron",
        "--hf",
        str(tiny),
        "--out",
        str(tmp_path / "o"),
        "--tp",
        "4",
    )
    assert r.returncode == 2 and "TP=4 does not divide the attention heads" in r.stderr


@pytest.mark.parametrize(
    ("mode", "granularity", "layers"),
    [("none", None, None), ("selective", "selective", None), ("full", "full", 1)],
)
def test_recompute_reaches_megatron(mode, granularity, layers):
    """The option is a field megatron-core knows (not silently filtered out)."""
    from megatron_seed.models.qwen import transformer_config

    spec = _spec()
    config = transformer_config(spec, recompute=mode)
    assert config.recompute_granularity == granularity
    assert config.recompute_num_layers == layers
    with pytest.raises(ModelConfigError, match="recompute must be one of"):
        transformer_config(spec, recompute="some")
