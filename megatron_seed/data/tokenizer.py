"""The Qwen chat tokens the library relies on, and the check that a tokenizer has them.

The chat layout is Qwen's: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message and
``<|im_start|>assistant\n`` as the generation prompt; <|im_end|> is the stop token. Tiny
tokenizers for tests and the CPU job are built by `megatron_seed.testbed.tokenizer`.

A saved tokenizer keeps ``tokenizer_class: TokenizersBackend`` in tokenizer_config.json: with
a missing or ``Qwen2Tokenizer`` class, transformers and vLLM swap in Qwen2's own
pre-tokenizer and the ids change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is imported lazily: `data` stays light to import
    from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Order fixes the ids: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TOKENIZER_CLASS = "TokenizersBackend"


def check_tokenizer(tokenizer: PreTrainedTokenizerFast) -> None:
    """Fail loud unless the Qwen chat special tokens each encode to one id."""
    for token in SPECIAL_TOKENS[1:]:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"tokenizer splits the special token {token!r} into {ids}")
