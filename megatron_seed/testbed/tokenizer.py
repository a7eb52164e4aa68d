"""A tiny Qwen-style byte-level BPE tokenizer for tests and the default CPU job (test bed).

Trained with the `tokenizers` library, wrapped as a transformers `PreTrainedTokenizerFast`
(in transformers 5 that class is `TokenizersBackend`). It has Qwen's three special tokens
and a Qwen-style chat template, so the chat layout of a real Qwen checkpoint and of the
tiny model are the same: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message and
``<|im_start|>assistant\\n`` as the generation prompt.

Saving keeps ``tokenizer_class: TokenizersBackend`` in tokenizer_config.json: with a missing
or ``Qwen2Tokenizer`` class, transformers and vLLM swap in Qwen2's own pre-tokenizer and the
ids change. `save_tokenizer` checks the class and that a reload encodes identically.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from megatron_seed.data.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TOKENIZER_CLASS,
    check_tokenizer,
)

if TYPE_CHECKING:  # transformers is imported lazily: `data` stays light to import
    from transformers import PreTrainedTokenizerFast

# Qwen's layout without Qwen's default system message or tool-call branches.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet plus the special tokens
# transformers' Qwen2Tokenizer pre-tokenisation pattern (models/qwen2/tokenization_qwen2.py)
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def build_tokenizer(
    corpus_texts: Iterable[str], vocab_size: int, out_dir: str | Path | None = None
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `corpus_texts`; optionally save it to `out_dir`.

    The vocabulary holds at most `vocab_size` entries (fewer if the corpus has fewer
    merges; read `len(tokenizer)`). eos = <|im_end|> (the chat stop token, as in Qwen
    instruct models), pad = <|endoftext|>. No BOS, nothing added by `encode`.
    """
    from transformers import PreTrainedTokenizerFast

    if vocab_size < _MIN_VOCAB:
        raise ValueError(f"vocab_size must be >= {_MIN_VOCAB} (256 bytes + specials)")
    backend = Tokenizer(models.BPE())
    # Exactly Qwen2's normaliser and pre-tokeniser: transformers picks its Qwen2Tokenizer
    # class for a folder whose config.json says model_type qwen2 (whatever
    # tokenizer_config.json says), and that class rebuilds these two. Identical ones keep
    # the ids identical however the folder is loaded (transformers, vLLM).
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus_texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    check_tokenizer(tokenizer)
    if out_dir is not None:
        save_tokenizer(tokenizer, out_dir)
    return tokenizer


def save_tokenizer(
    tokenizer: PreTrainedTokenizerFast, out_dir: str | Path, probe: str | None = None
) -> Path:
    """`save_pretrained`, then check tokenizer_class and that a reload gives identical ids."""
    from transformers import AutoTokenizer

    out = Path(out_dir)
    tokenizer.save_pretrained(out)
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
