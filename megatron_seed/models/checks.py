"""Up-front validation of user-supplied checkpoints (fail loud before any compute)."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pydantic

from megatron_seed.errors import CommandError
from megatron_seed.models.qwen import ModelConfigError, QwenSpec


def validate_hf_dir(path: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> QwenSpec:
    """Check a HF checkpoint folder (what `seed convert` and `seed check-parity` read) and the
    requested layout: every JSON member an object (`check_json_members`) with its fields'
    types (`check_config_types`, `check_member_schemas`), the weights' headers readable and
    matching the config, and a tokenizer, where the folder has one, loadable with ids within
    the vocabulary. `CommandError` (one line) naming the file."""
    return _checked_folder(path, tp, pp, ep, needs_tokenizer=False)[0]


def validate_policy_dir(path: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> QwenSpec:
    """`validate_hf_dir` for a folder a policy is played or trained from (`seed eval`, `seed
    sft`, `seed train`): its tokenizer is required (tokenizer.json, tokenizer_config.json)."""
    return _checked_folder(path, tp, pp, ep, needs_tokenizer=True)[0]


def _checked_folder(
    path: str | Path, tp: int = 1, pp: int = 1, ep: int = 1, needs_tokenizer: bool = True
) -> tuple[QwenSpec, Any]:
    """`validate_hf_dir`'s checks; (the model's spec, its tokenizer or None)."""
    from megatron_seed.models.convert import HFCheckpoint

    p = Path(path)
    if not p.is_dir():
        raise CommandError(f"{p} is not a directory")
    check_json_members(p)
    check_member_schemas(p)
    try:
        ckpt = HFCheckpoint(p)
        check_config_types(p / "config.json")
        ckpt.spec.check_layout(tp, pp, ep)
    except ModelConfigError as err:
        raise CommandError(str(err)) from None
    if not (p / "tokenizer.json").is_file():
        if not needs_tokenizer:
            return ckpt.spec, None
        raise CommandError(f"{p} has no tokenizer.json")
    if not (p / "tokenizer_config.json").is_file():  # save_pretrained always writes one
        raise CommandError(f"{p} has no tokenizer_config.json")
    return ckpt.spec, checked_tokenizer(p, ckpt.spec)


def validate_megatron_dir(path: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> QwenSpec:
    """Check a megatron-seed Megatron checkpoint (what `seed convert megatron-to-hf` reads and
    a trainer checkpoint holds) before any process starts: ``hf/`` with the architecture
    (config.json of its types; a tokenizer, where there is one, that loads and fits the
    vocabulary) and ``model/`` a complete dist-checkpoint of that architecture
    (`check_dist_checkpoint`). `CommandError` (one line) naming the file."""
    p = Path(path)
    if not p.is_dir():
        raise CommandError(f"{p} is not a directory")
    hf = p / "hf"
    if not (hf / "config.json").is_file():
        raise CommandError(f"{p} is not a megatron-seed checkpoint (no hf/config.json)")
    check_json_members(hf)
    check_member_schemas(hf)
    try:
        check_config_types(hf / "config.json")
        spec = QwenSpec.from_pretrained(hf)
        spec.check_layout(tp, pp, ep)
    except ModelConfigError as err:
        raise CommandError(str(err)) from None
    if (hf / "tokenizer.json").is_file():
        checked_tokenizer(hf, spec)
    # global shapes, whatever layout wrote it: a checkpoint of this architecture or not
    shapes = check_dist_checkpoint(p / "model")
    proj = (spec.hidden_size, spec.num_heads * spec.head_dim)
    found = {
        "embedding.word_embeddings.weight": shapes.get("embedding.word_embeddings.weight"),
        "layers x attention output projection": _per_layer(shapes, "self_attention.linear_proj"),
    }
    need = {
        "embedding.word_embeddings.weight": (spec.vocab_size, spec.hidden_size),
        "layers x attention output projection": (spec.num_layers, *proj),
    }
    for what, shape in need.items():
        if found[what] != shape:
            got = list(found[what]) if found[what] else "absent"
            raise CommandError(
                f"{p / 'model'}: {what} is {got}, {hf / 'config.json'} needs {list(shape)}: "
                "a checkpoint of another model"
            )
    return spec


def _per_layer(shapes: dict[str, tuple[int, ...]], name: str) -> tuple[int, ...] | None:
    """(layers, *shape) of the decoder's per-layer tensor ``name``.weight, stored either
    stacked over the layers (``decoder.layers.NAME.weight``, Megatron's layer spec for dense
    models) or once per layer (``decoder.layers.I.NAME.weight``); None when absent or when
    the layers disagree."""
    stacked = shapes.get(f"decoder.layers.{name}.weight")
    if stacked is not None:
        return stacked
    pattern = re.compile(rf"decoder\.layers\.(\d+)\.{re.escape(name)}\.weight")
    per = {int(m.group(1)): shape for key, shape in shapes.items() if (m := pattern.fullmatch(key))}
    if not per or sorted(per) != list(range(len(per))) or len(set(per.values())) != 1:
        return None
    return (len(per), *next(iter(per.values())))


class _DistCheckpointConfig(pydantic.BaseModel):
    """metadata.json of a Megatron dist-checkpoint (megatron-core's `CheckpointingConfig`):
    the backends this project writes and reads."""

    model_config = pydantic.ConfigDict(strict=True, extra="allow")
    sharded_backend: typing.Literal["torch_dist"]
    sharded_backend_version: int
    common_backend: typing.Literal["torch"]
    common_backend_version: int


def check_dist_checkpoint(folder: Path) -> dict[str, tuple[int, ...]]:
    """A Megatron dist-checkpoint folder whole before anything loads it: metadata.json of the
    torch_dist format, the index (``.metadata``, torch.distributed.checkpoint's) readable,
    every byte range it names inside its file, ``common.pt`` loadable (megatron-core's own
    reader). Returns every tensor's global shape, by name; `CommandError` naming the file.
    Reads the index and common.pt, not the tensors."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

    if not folder.is_dir():
        raise CommandError(f"{folder} is not a directory (a Megatron dist-checkpoint expected)")
    config = folder / "metadata.json"
    if not config.is_file():
        raise CommandError(f"{folder} is not a Megatron dist-checkpoint (no metadata.json)")
    try:
        _DistCheckpointConfig.model_validate_json(config.read_bytes())
    except pydantic.ValidationError as err:
        raise CommandError(f"{config}: {first_error(err)}") from None
    index = folder / ".metadata"
    if not index.is_file():
        raise CommandError(f"{folder} has no .metadata (the checkpoint's index)")
    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as err:  # a pickle cut short or of something else: EOFError, ...
        raise CommandError(f"{index}: unreadable ({type(err).__name__}: {err})"[:200]) from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise CommandError(f"{index}: not a torch.distributed.checkpoint index")
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        data = folder / name
        if not data.is_file():
            raise CommandError(f"{data} is missing (the checkpoint's index names it)")
        if data.stat().st_size < end:
            raise CommandError(
                f"{data} is cut short: {data.stat().st_size} bytes, its index reads to {end}"
            )
    common = folder / "common.pt"
    if not common.is_file():
        raise CommandError(f"{folder} has no common.pt")
    try:
        load_common_state_dict(str(folder))
    except Exception as err:  # torch.load of a file cut short or of another kind
        raise CommandError(f"{common}: unreadable ({type(err).__name__})") from None
    return {
        key: tuple(meta.size)
        for key, meta in metadata.state_dict_metadata.items()
        if getattr(meta, "size", None) is not None
    }


def first_error(err: pydantic.ValidationError) -> str:
    """A pydantic error's first complaint in one line: the field, its value, what was wrong."""
    first = err.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "the top"
    return f"{field} is {first.get('input')!r:.40} ({first['msg']})"


def check_json_members(folder: Path) -> None:
    """Every ``*.json`` file of a model folder parses and holds a JSON object; `CommandError`
    naming the first that does not (a file cut short, emptied, or another JSON type)."""
    import json

    for member in sorted(folder.glob("*.json")):
        try:
            data = json.loads(member.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise CommandError(f"{member} is not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise CommandError(f"{member}: a JSON object expected, got {type(data).__name__}")


def check_config_types(config_path: Path) -> None:
    """config.json's fields of the types transformers declares for them: its own loader
    (`AutoConfig.from_pretrained`, strict about the model class's fields) and the base class's
    annotations (``architectures``, ``dtype``, ...), checked with pydantic; `ModelConfigError`
    naming the file and the field."""
    import json

    import torch
    import transformers.configuration_utils as configuration
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(config_path.parent))
    except Exception as err:  # StrictDataclassFieldValidationError, ValueError, KeyError
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise ModelConfigError(f"{config_path}: {reason}") from None
    hints = typing.get_type_hints(
        configuration.PreTrainedConfig, globalns=vars(configuration), localns={"torch": torch}
    )
    data = json.loads(config_path.read_text())
    for key, hint in hints.items():
        if key in data and typing.get_origin(hint) is not typing.ClassVar:
            try:
                pydantic.TypeAdapter(
                    hint, config={"arbitrary_types_allowed": True}
                ).validate_python(data[key], strict=True)
            except pydantic.ValidationError:
                raise ModelConfigError(
                    f"{config_path}: {key} is {data[key]!r:.40}, transformers declares {hint}"
                ) from None


class _GenerationConfig(pydantic.BaseModel):
    """generation_config.json's fields that transformers and vLLM read (defaults of sampling,
    the stop ids); the rest pass unchecked."""

    model_config = pydantic.ConfigDict(extra="allow", strict=True)
    from_model_config: bool | None = pydantic.Field(None, alias="_from_model_config")
    transformers_version: str | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_length: int | None = None
    max_new_tokens: int | None = None
    bos_token_id: int | list[int] | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | list[int] | None = None
    use_cache: bool | None = None
    output_attentions: bool | None = None
    output_hidden_states: bool | None = None


_Token = str | dict[str, typing.Any] | None


class _TokenizerConfig(pydantic.BaseModel):
    """tokenizer_config.json's fields that transformers' tokenizers read; the rest pass."""

    model_config = pydantic.ConfigDict(extra="allow", strict=True)
    tokenizer_class: str | None = None
    backend: str | None = None
    model_max_length: int | float | None = None
    padding_side: str | None = None
    truncation_side: str | None = None
    chat_template: str | list[dict[str, typing.Any]] | None = None
    bos_token: _Token = None
    eos_token: _Token = None
    pad_token: _Token = None
    unk_token: _Token = None
    added_tokens_decoder: dict[str, dict[str, typing.Any]] | None = None
    additional_special_tokens: list[typing.Any] | None = None
    extra_special_tokens: list[typing.Any] | dict[str, typing.Any] | None = None
    clean_up_tokenization_spaces: bool | None = None
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    add_prefix_space: bool | None = None
    split_special_tokens: bool | None = None
    legacy: bool | None = None
    errors: str | None = None


_SCHEMAS = {"generation_config.json": _GenerationConfig, "tokenizer_config.json": _TokenizerConfig}


def check_member_schemas(folder: Path) -> None:
    """generation_config.json and tokenizer_config.json, where present, hold their fields'
    types (`_GenerationConfig`, `_TokenizerConfig`); `CommandError` naming file and field."""
    import json

    for name, schema in _SCHEMAS.items():
        member = folder / name
        if not member.is_file():
            continue
        try:
            schema.model_validate(json.loads(member.read_text()))
        except pydantic.ValidationError as err:
            raise CommandError(f"{member}: {first_error(err)}") from None


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

    spec, tokenizer = _checked_folder(path, needs_tokenizer=True)
    try:
        check_tokenizer(tokenizer)
        check_chat_template(tokenizer)
    except ValueError as err:
        raise CommandError(f"{path}: {err}") from None
    return spec
