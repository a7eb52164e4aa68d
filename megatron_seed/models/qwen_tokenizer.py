"""A Qwen-format tokenizer for random checkpoints of real shapes (`seed init-model`).

So that such a checkpoint needs nothing downloaded, `build_qwen_tokenizer` makes a tokenizer
that a Qwen checkpoint's users cannot tell apart by its interface:

- byte-level BPE with exactly Qwen2's normaliser and pre-tokeniser
  (`megatron_seed.data.tokenizer.qwen_byte_level_bpe`), trained on `CORPUS` (13 KB of
  English and household-agent text, built in: the same 655 merges on every machine);
- padded to Qwen's vocabulary: ids from the last merge up to 151642 are filler entries
  (``<|filler_N|>``) that no merge produces, so encoding never yields them, and Qwen's added
  tokens sit at their real ids: <|endoftext|> = 151643, <|im_start|> = 151644,
  <|im_end|> = 151645, ... <|file_sep|> = 151664 (Qwen2.5's 22), and for Qwen3
  <tool_response> = 151665 ... </think> = 151668 (ids and the special/non-special split as
  in the published tokenizer_config.json files' `added_tokens_decoder`);
- eos = <|im_end|>, pad = <|endoftext|>, no bos, and the family's chat template
  (`megatron_seed.models.chat_templates`) in tokenizer_config.json, where Qwen keeps it.

The Llama-family shapes get the same BPE laid out as their vocabularies (`LAYOUTS`): SmolLM2's
17 special tokens at ids 0-16 as its tokenizer has them (<|endoftext|> 0, <|im_start|> 1,
<|im_end|> 2, ...: the metadata of the SmolLM2-135M-Instruct GGUF) and its ChatML template;
for Llama 3.1, ChatML's three tokens at the start of Llama 3's reserved special range
(128000-128002): the library's chat layout is ChatML (`data.tokenizer`), not Llama 3's
header tokens, so a random Llama-3.1-shaped checkpoint speaks ChatML.

The checkpoint's embedding keeps the published padded size (config.json `vocab_size` 151936
or 152064 for Qwen, 128256 for Llama 3.1), larger than the tokenizer, as in the real models.
Text ids differ from the real tokenizers' (the merges are this corpus's), which nothing here
depends on: what must match are the special ids, the pre-tokenisation and the chat format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_seed.data.tokenizer import (
    ENDOFTEXT,
    IM_END,
    check_tokenizer,
    qwen_byte_level_bpe,
    save_tokenizer,
)
from megatron_seed.models.chat_templates import CHAT_TEMPLATES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

FIRST_ADDED_ID = 151643  # Qwen: 151643 byte-level BPE tokens (ids 0..151642), then these
# (content, special) in id order, from Qwen2.5's tokenizer_config.json `added_tokens_decoder`
QWEN2_5_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
QWEN3_ADDED_TOKENS = (
    *QWEN2_5_ADDED_TOKENS,
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
# SmolLM2's special tokens, ids 0-16 (the GGUF's `tokenizer.ggml.tokens`, all CONTROL)
SMOLLM2_ADDED_TOKENS: tuple[tuple[str, bool], ...] = tuple(
    (t, True)
    for t in [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<repo_name>",
        "<reponame>",
        "<file_sep>",
        "<filename>",
        "<gh_stars>",
        "<issue_start>",
        "<issue_comment>",
        "<issue_closed>",
        "<jupyter_start>",
        "<jupyter_text>",
        "<jupyter_code>",
        "<jupyter_output>",
        "<jupyter_script>",
        "<empty_output>",
    ]
)
CHATML_ADDED_TOKENS = (("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True))


@dataclass(frozen=True)
class TokenizerLayout:
    """Where a vocabulary's added tokens sit: `added` (content, special) from id
    `first_added_id` on; the BPE and its fillers take the other ids below `size`."""

    added: tuple[tuple[str, bool], ...]
    first_added_id: int
    size: int = 0  # ids in the tokenizer; 0: up to the last added token

    @property
    def total(self) -> int:
        """Number of ids the tokenizer holds."""
        return self.size or self.first_added_id + len(self.added)


# Qwen3-MoE checkpoints ship Qwen3's tokenizer
LAYOUTS: dict[str, TokenizerLayout] = {
    "qwen2": TokenizerLayout(QWEN2_5_ADDED_TOKENS, FIRST_ADDED_ID),
    "qwen3": TokenizerLayout(QWEN3_ADDED_TOKENS, FIRST_ADDED_ID),
    "qwen3_moe": TokenizerLayout(QWEN3_ADDED_TOKENS, FIRST_ADDED_ID),
    "smollm2": TokenizerLayout(SMOLLM2_ADDED_TOKENS, 0, 49152),
    "llama3-chatml": TokenizerLayout(CHATML_ADDED_TOKENS, 128000),
}
ADDED_TOKENS = {name: layout.added for name, layout in LAYOUTS.items()}
DEFAULT_MERGES = 4000  # the corpus yields fewer; training stops when no pair repeats

_PLACE_WORDS = (
    "cabinet countertop drawer fridge microwave sinkbasin stoveburner toaster coffeemachine "
    "shelf desk dresser bed sofa armchair sidetable diningtable garbagecan laundryhamper "
    "safe bathtubbasin toilet towelholder handtowelholder cart ottoman"
)
_THING_WORDS = (
    "apple bread egg lettuce potato tomato mug cup plate bowl pan pot knife fork spoon "
    "spatula kettle saltshaker peppershaker soapbar soapbottle spraybottle towel candle "
    "cloth book pen pencil laptop cellphone keychain creditcard remotecontrol alarmclock "
    "watch vase statue pillow box newspaper cd desklamp floorlamp"
)
_PLACES, _THINGS = _PLACE_WORDS.split(), _THING_WORDS.split()
_PROSE = """\
You are in the middle of a room. Looking quickly around you, you see several pieces of
furniture, a few appliances and a door that leads to the hallway. The goal: put a clean
mug in the coffee machine. First find the mug, then clean it in the sink basin, then move
it to the coffee machine. Nothing happens. You pick up the mug from the countertop. You
open the fridge and see an apple, a loaf of bread and two eggs. You close the drawer.
The microwave is closed. You heat the potato with the microwave. You cool the tomato with
the fridge. You turn on the desk lamp and examine the book under its light.

Think step by step, then answer with one action. An action is a short command such as
"go to the shelf", "open the cabinet" or "look". If an action is not admissible, nothing
happens and the room stays the same. A plan that worked before is a good first guess;
loops waste steps. When the task is done the episode ends with a success.

The weather was mild for most of the week, with light rain on Tuesday and a clear, cold
morning on Friday. People walked their dogs along the river, children played in the park
after school, and the market stayed open late on Saturday. Numbers such as 3, 14, 2025 and
1.5 appear in ordinary text, and so do questions: what time is it? where are my keys?
Reading, writing, counting and sorting are everyday skills; so are cooking, cleaning,
planning a trip and explaining an idea to a friend in plain words.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, 1))
"""


def _corpus() -> list[str]:
    """The training text: prose plus household-agent commands and observations."""
    lines = _PROSE.splitlines()
    for i, place in enumerate(_PLACES):
        n = i % 3 + 1
        lines += [
            f"go to {place} {n}",
            f"open {place} {n}",
            f"close {place} {n}",
            f"You arrive at {place} {n}. On the {place} {n}, you see nothing.",
            f"The {place} {n} is open. In it, you see a {_THINGS[i % len(_THINGS)]} 1.",
        ]
    for i, thing in enumerate(_THINGS):
        place = _PLACES[i % len(_PLACES)]
        lines += [
            f"take {thing} {i % 4 + 1} from {place} {i % 3 + 1}",
            f"move {thing} {i % 4 + 1} to {_PLACES[(i + 5) % len(_PLACES)]} 1",
            f"heat {thing} 1 with microwave 1, clean {thing} 1 with sinkbasin 1",
            f"You pick up the {thing} {i % 4 + 1} from the {place} {i % 3 + 1}.",
            f"examine {thing} 1",
        ]
    return lines


CORPUS: tuple[str, ...] = tuple(_corpus())


def build_qwen_tokenizer(
    model_type: str, model_max_length: int = 32768, merges: int = DEFAULT_MERGES
) -> PreTrainedTokenizerFast:
    """The tokenizer of layout `model_type` (a `LAYOUTS` key: "qwen2" for Qwen2/2.5, "qwen3",
    "smollm2", "llama3-chatml"); see the module docstring. Deterministic: the same merges and
    ids on every call."""
    from tokenizers import AddedToken, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if model_type not in LAYOUTS:
        raise ValueError(f"unknown model_type {model_type!r}; expected one of {list(LAYOUTS)}")
    layout = LAYOUTS[model_type]
    trained = qwen_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + merges,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trained.train_from_iterator(CORPUS, trainer)
    model = json.loads(trained.to_str())["model"]
    vocab = _laid_out(dict(model["vocab"]), layout)
    backend = qwen_byte_level_bpe(vocab, [tuple(m) for m in model["merges"]])
    for content, special in layout.added:  # already in the vocabulary: they keep their ids
        token = AddedToken(content, special=special, normalized=False)
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[t for t, special in layout.added if special and t != ENDOFTEXT],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATES[model_type]
    for i, (content, _special) in enumerate(layout.added):
        if tokenizer.convert_tokens_to_ids(content) != layout.first_added_id + i:
            raise RuntimeError(f"{content} is not at id {layout.first_added_id + i}")
    if len(tokenizer) != layout.total:
        raise RuntimeError(f"the tokenizer holds {len(tokenizer)} ids, not {layout.total}")
    check_tokenizer(tokenizer)
    return tokenizer


def _laid_out(trained: dict[str, int], layout: TokenizerLayout) -> dict[str, int]:
    """The trained BPE vocabulary moved to the ids the layout leaves free (in order), the
    added tokens at theirs, and filler entries (``<|filler_N|>``, which no merge produces) on
    every other id below the layout's size."""
    if sorted(trained.values()) != list(range(len(trained))):
        raise RuntimeError("trained BPE vocabulary ids are not contiguous")
    first = layout.first_added_id
    reserved = range(first, first + len(layout.added))
    free = [i for i in range(layout.total) if i not in reserved]
    if len(free) < len(trained):
        raise RuntimeError(f"{len(trained)} BPE tokens do not fit in layout of {layout.total}")
    vocab = {token: free[i] for token, i in sorted(trained.items(), key=lambda kv: kv[1])}
    vocab.update({f"<|filler_{i}|>": i for i in free[len(trained) :]})
    vocab.update({content: first + k for k, (content, _special) in enumerate(layout.added)})
    return vocab


def save_qwen_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> Path:
    """Save with the chat template in tokenizer_config.json; a reload must encode the same
    ids (`save_tokenizer`)."""
    probe = "".join(f"{t} x{t}" for t, _ in ADDED_TOKENS["qwen3"]) + " go to cabinet 1\n"
    return save_tokenizer(tokenizer, out_dir, probe=probe, template_in_config=True)
