"""Up-front validation of user-supplied checkpoints (fail loud before any compute)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron_seed.errors import CommandError
from megatron_seed.models.qwen import ModelConfigError, QwenSpec


def validate_hf_dir(path: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> QwenSpec:
    """Check a HF checkpoint folder and the requested layout; raise CommandError (one line)."""
    from megatron_seed.models.convert import HFCheckpoint

    p = Path(path)
    if not p.is_dir():
        raise CommandError(f"{p} is not a directory")
    try:
        ckpt = HFCheckpoint(p)
        ckpt.spec.check_layout(tp, pp, ep)
    except ModelConfigError as err:
        raise CommandError(str(err)) from None
    return ckpt.spec


def checked_tokenizer(path: str | Path, spec: QwenSpec) -> Any:
    """The tokenizer of the model folder ``path``, loaded and checked against ``spec``: every
    id within the model's vocabulary; `CommandError` (one line) naming what is wrong."""
    from transformers import AutoTokenizer

    if not (Path(path) / "tokenizer.json").is_file():
        raise CommandError(f"{path} has no tokenizer.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # tokenizers reports a bad file as a plain Exception or KeyError
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        raise CommandError(f"{path}: unreadable tokenizer ({reason})") from None
    largest = max(tokenizer.get_vocab().values(), default=-1)
    if largest >= spec.vocab_size:
        raise CommandError(
            f"{path}: the tokenizer has ids up to {largest}, the model's vocabulary "
            f"{spec.vocab_size}: they are not each other's"
        )
    return tokenizer


def validate_base_model(path: str | Path) -> QwenSpec:
    """Check a pretrained model folder a job starts from (`seed run --model`, `seed compare
    --model`) before any work: an HF checkpoint this project can build, a tokenizer that
    loads, fits the model's vocabulary, has the chat tokens as single ids, and renders its
    chat template (where the folder has one) as `ChatBuilder` does; `CommandError` (one line)
    naming what is wrong."""
    from megatron_seed.data import check_chat_template, check_tokenizer

    spec = validate_hf_dir(path)
    tokenizer = checked_tokenizer(path, spec)
    try:
        check_tokenizer(tokenizer)
        check_chat_template(tokenizer)
    except ValueError as err:
        raise CommandError(f"{path}: {err}") from None
    return spec
