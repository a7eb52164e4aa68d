"""GGUF file -> Hugging Face checkpoint folder (`seed convert gguf-to-hf --gguf FILE --out DIR`).

A GGUF file (llama.cpp's format) holds the weights, quantized or not, and the tokenizer and
chat template as metadata. transformers reads it (`from_pretrained(..., gguf_file=...)`): it
dequantizes every tensor with the `gguf` package's numpy kernels, undoes the q/k row
permutation llama.cpp applies to Llama checkpoints, and rebuilds the tokenizer from the
metadata. `inspect_gguf` checks the file first and refuses in one line what cannot become a
model here: not a GGUF file, a truncated one, an architecture other than llama/qwen2/qwen3, a
tensor type the `gguf` package cannot dequantize, or Llama 3.1's RoPE scaling (llama.cpp
stores it as a `rope_freqs` tensor, which transformers' loader drops). `gguf_to_hf` then
lets transformers load it in float32 and writes the `save_pretrained` folder every other
command reads.

Quantization is lossy: a Q4_1 file dequantized is not the bf16 model it was made from. What
this folder reproduces exactly is transformers loading the same GGUF file, and that is what
`seed check-parity` and the tests compare against.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # GGUF `general.architecture` values imported
_MAGIC = b"GGUF"


class GGUFError(ValueError):
    """A GGUF file that cannot be imported (one line)."""


@dataclass(frozen=True)
class GGUFInfo:
    """What `inspect_gguf` read from a file's header."""

    path: Path
    architecture: str
    tensor_types: dict[str, int]  # GGML type name -> number of tensors stored in it
    name: str  # `general.name`, "" when absent

    def describe(self) -> str:
        """The tensor types, most frequent first: "Q4_1 x210, F32 x61, Q8_0 x1"."""
        ordered = sorted(self.tensor_types.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{t} x{n}" for t, n in ordered)


def readable_types() -> frozenset[str]:
    """GGML tensor types the installed `gguf` package dequantizes (transformers uses its
    `gguf.dequantize`): F32, F16 and every type with a numpy implementation."""
    from gguf import quants

    # `_type_traits` is private: read as of gguf 0.19.0 (requirements.txt pins it); a new
    # pin needs this name checked again
    return frozenset({"F32", "F16", *(t.name for t in quants._type_traits)})


def _require_packages() -> None:
    """transformers reads GGUF files only with `gguf` and `accelerate` installed."""
    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError:
            raise GGUFError(
                f"GGUF import needs the {package!r} package (requirements.txt; "
                "tools/install.sh installs it)"
            ) from None


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Read and check a GGUF file's header and tensor table without loading any weight;
    `GGUFError` (one line) for anything `gguf_to_hf` could not import."""
    _require_packages()
    from gguf import GGUFReader

    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"{p} is not a file")
    with p.open("rb") as handle:
        magic = handle.read(len(_MAGIC))
    if magic != _MAGIC:
        raise GGUFError(f"{p} is not a GGUF file (it starts with {magic!r}, not {_MAGIC!r})")
    try:
        reader = GGUFReader(p)
    except Exception as err:  # the reader's own errors: short reads, bad offsets, new types
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        raise GGUFError(
            f"{p} cannot be read by gguf {version('gguf')} (truncated, corrupt or of a newer "
            f"format): {reason}"
        ) from None
    size = p.stat().st_size
    end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise GGUFError(f"{p} is truncated: its tensors end at byte {end}, the file at {size}")
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{p}: architecture {arch!r} cannot be imported (supported: {', '.join(ARCHITECTURES)})"
        )
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        # llama.cpp stores Llama 3.1's "llama3" RoPE scaling as this tensor; transformers'
        # loader drops it, and the model would silently run unscaled RoPE
        raise GGUFError(f"{p}: RoPE scaling stored as rope_freqs.weight cannot be imported")
    types = dict(collections.Counter(t.tensor_type.name for t in reader.tensors))
    unreadable = sorted(set(types) - readable_types())
    if unreadable:
        which = ", ".join(f"{t} ({types[t]} tensors)" for t in unreadable)
        raise GGUFError(f"{p}: tensor type(s) {which} cannot be dequantized by the gguf package")
    return GGUFInfo(p, arch, types, str(_field(reader, "general.name") or ""))


def _field(reader: Any, key: str) -> Any:
    """A metadata value of the file, or None."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_to_hf(
    gguf_file: str | Path, out_dir: str | Path, log: Callable[[str], None] | None = None
) -> Path:
    """Import `gguf_file` into `out_dir` (config.json, float32 safetensors, tokenizer files
    with the chat template): the model and tokenizer transformers builds from the file. The
    architecture is checked against the Megatron side (`QwenSpec`) before any weight is
    dequantized; a reload of the written tokenizer must encode as the file's does."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from megatron_seed.data.tokenizer import save_tokenizer
    from megatron_seed.models.qwen import ModelConfigError, QwenSpec

    info = inspect_gguf(gguf_file)
    folder, name = str(info.path.parent), info.path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    try:
        spec = QwenSpec.from_hf_config(config.to_dict())
    except ModelConfigError as err:
        raise GGUFError(f"{info.path}: {err}") from None
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    _drop_gguf_quantizer(model)
    model.save_pretrained(out)
    tokenizer.model_max_length = spec.max_position_embeddings  # the file leaves it unset
    save_tokenizer(tokenizer, out)
    if log is not None:
        template = "with" if tokenizer.chat_template else "without"
        log(
            f"{info.name or name}: {spec.model_type}, {spec.num_layers} layers, "
            f"{spec.num_params / 1e6:.1f}M parameters; {info.describe()} dequantized to "
            f"float32; tokenizer of {len(tokenizer)} tokens {template} a chat template"
        )
    return out


def _drop_gguf_quantizer(model: Any) -> None:
    """Make a GGUF-loaded model savable: its weights are already dequantized float tensors,
    but transformers keeps a GGUF quantizer on it (and its config) and refuses to save a model
    quantized with one."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
