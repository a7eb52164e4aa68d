"""The Qwen chat tokens the library relies on, and the check that a tokenizer has them.

The chat layout is Qwen's: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message and
``<|im_start|>assistant\n`` as the generation prompt; <|im_end|> is the stop token. Tiny
tokenizers for tests and the CPU job are built by `megatron_seed.models.tiny_tokenizer`, the
Qwen-format ones of `seed init-model` by `megatron_seed.models.qwen_tokenizer`; both start
from `qwen_byte_level_bpe` and are written by `save_tokenizer`.

A saved tokenizer keeps ``tokenizer_class: TokenizersBackend`` in tokenizer_config.json: with
a missing or ``Qwen2Tokenizer`` class, transformers and vLLM swap in Qwen2's own
pre-tokenizer and the ids change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is imported lazily: `data` stays light to import
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Order fixes the ids: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TOKENIZER_CLASS = "TokenizersBackend"
# what a model folder's tokenizer is made of (the file-name prefixes an export copies; the
# chat template lives in chat_template.jinja in transformers 5 folders)
TOKENIZER_FILES = ("tokenizer", "special_tokens", "vocab", "merges", "chat_template")


def check_tokenizer(tokenizer: PreTrainedTokenizerFast) -> None:
    """Fail loud unless the Qwen chat special tokens each encode to one id."""
    for token in SPECIAL_TOKENS[1:]:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"tokenizer splits the special token {token!r} into {ids}")


# transformers' Qwen2Tokenizer pre-tokenisation pattern (models/qwen2/tokenization_qwen2.py)
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def qwen_byte_level_bpe(
    vocab: dict[str, int] | None = None, merges: list[tuple[str, str]] | None = None
) -> Tokenizer:
    """A byte-level BPE (empty, or with `vocab` and `merges`) with exactly Qwen2's
    normaliser (NFC), pre-tokeniser (its split regex, then ByteLevel) and decoder.

    Exactly Qwen2's: transformers picks its Qwen2Tokenizer class for a folder whose
    config.json says model_type qwen2 (whatever tokenizer_config.json says), and that class
    rebuilds these; identical ones keep the ids identical however the folder is loaded
    (transformers, vLLM).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    model = models.BPE() if vocab is None else models.BPE(vocab=vocab, merges=merges or [])
    backend = Tokenizer(model)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def save_tokenizer(
    tokenizer: PreTrainedTokenizerFast,
    out_dir: str | Path,
    probe: str | None = None,
    template_in_config: bool = False,
) -> Path:
    """`save_pretrained`, then check tokenizer_class and that a reload gives identical ids.

    template_in_config: keep the chat template in tokenizer_config.json (as the Qwen
    checkpoints ship it) instead of a separate chat_template.jinja.
    """
    from transformers import AutoTokenizer

    out = Path(out_dir)
    tokenizer.save_pretrained(out, save_jinja_files=not template_in_config)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") != TOKENIZER_CLASS:
        # Without it transformers/vLLM substitute Qwen2's pre-tokenizer (FACTS.md).
        config["tokenizer_class"] = TOKENIZER_CLASS
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    reloaded = AutoTokenizer.from_pretrained(out)
    probe = probe or (
        f"{IM_START}user\nThe goal: put a  clean mug in  coffeemachine 1.{IM_END}\n"
        f"{IM_START}assistant\ngo to countertop 2\n\t{IM_END}\n unicode: café ü 42"
    )
    want = tokenizer.encode(probe, add_special_tokens=False)
    got = reloaded.encode(probe, add_special_tokens=False)
    if want != got:
        raise RuntimeError(f"tokenizer saved to {out} reloads with different ids")
    return out
