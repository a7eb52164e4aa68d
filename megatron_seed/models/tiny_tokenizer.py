"""A tiny Qwen-style byte-level BPE tokenizer for tests, benchmarks and the default CPU job.

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

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import pre_tokenizers, trainers

from megatron_seed.data.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    check_tokenizer,
    qwen_byte_level_bpe,
    save_tokenizer,
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
__all__ = ["CHAT_TEMPLATE", "build_tokenizer", "save_tokenizer"]  # save_tokenizer: data.tokenizer


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
    backend = qwen_byte_level_bpe()  # exactly Qwen2's normaliser and pre-tokeniser
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
