"""Bad inputs derived from good ones, for the corruption test (`tests/unit/test_corruption.py`).

Every generator takes a known-good input and yields ``(what, write)`` pairs: ``what`` names
the corruption, ``write(path)`` puts the bad input at ``path`` (a file or a folder). Nothing
here knows which command reads the input: the kinds of damage are the same for all of them
(cut short, emptied, another JSON type at the top or in one field, a member missing, another
kind of file in its place).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Writer = Callable[[Path], None]
# members whose format shows a cut (a prose file cut in half is still prose), by suffix or
# by name (a dist-checkpoint's index, `.metadata`, has no suffix)
STRUCTURED = (".json", ".jsonl", ".safetensors", ".parquet", ".distcp", ".pt", ".gguf")
STRUCTURED_NAMES = (".metadata",)
# the first bytes of a parquet file (`PAR1`): a real sibling of a JSONL corpus
PARQUET_BYTES = b"PAR1\x15\x04\x15\x10\x15\x14L\x15\x02\x15\x00\x12\x00\x00PAR1"


def writes(text: str | bytes) -> Writer:
    """A writer of ``text`` (or bytes) at its path, parent folders made."""

    def write(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)

    return write


def wrong_type(value: Any) -> Any:
    """A JSON value of another type than ``value`` (an object becomes a number, a number a
    string, a string a list, a list an object)."""
    if isinstance(value, dict):
        return 7
    if isinstance(value, bool | int | float):
        return "seven"
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {"x": 1}
    return [1]


def cut_offsets(n: int) -> list[int]:
    """Where to cut an ``n``-byte file: its first byte, a third, a half, just before its end."""
    return sorted({1, n // 3, n // 2, max(n - 2, 1)})


def json_variants(good: str, fields: int | None = None) -> Iterator[tuple[str, Writer]]:
    """A JSON object cut at several offsets, emptied, another JSON type at the top, and each of
    its first ``fields`` fields (all: None) given a value of another type."""
    for n in cut_offsets(len(good)):
        yield f"cut at byte {n}", writes(good[:n])
    yield "empty", writes("")
    yield "a list at the top", writes("[1, 2]")
    yield "a string at the top", writes('"text"')
    data = json.loads(good)
    for key in list(data)[:fields]:
        bad = {**data, key: wrong_type(data[key])}
        yield f"field {key!r} of another type", writes(json.dumps(bad))
        if isinstance(data[key], bool | int | float):  # the value as a string: "1", "false"
            quoted = {**data, key: json.dumps(data[key])}
            yield f"field {key!r} as a string", writes(json.dumps(quoted))


def file_variants(good: bytes) -> Iterator[tuple[str, Writer]]:
    """A binary file cut at several offsets, emptied, and a JSON and a parquet file in its
    place."""
    for n in cut_offsets(len(good)):
        yield f"cut at byte {n}", writes(good[:n])
    yield "empty", writes(b"")
    yield "a JSON file", writes('{"model_type": "llama"}\n')
    yield "a parquet file", writes(PARQUET_BYTES)


def module_variants(good: str, attr: str) -> Iterator[tuple[str, Writer]]:
    """A Python module that defines ``attr``, cut at several offsets, emptied, ``attr`` of
    another type, a module that raises while it is imported, and a JSON and a parquet file in
    its place."""
    for n in cut_offsets(len(good)):
        yield f"cut at byte {n}", writes(good[:n])
    yield "empty", writes("")
    yield f"{attr} of another type", writes(f"{good}\n{attr} = 7\n")
    yield "an import that raises", writes(f"{good}\nraise RuntimeError('not today')\n")
    yield "a JSON file", writes('{"model_type": "llama"}\n')
    yield "a parquet file", writes(PARQUET_BYTES)


def jsonl_variants(good: str) -> Iterator[tuple[str, Writer]]:
    """JSONL records cut inside their last record, a record that is no object, one record's
    fields of another type, and a parquet file in their place."""
    lines = good.splitlines()
    last = len(good) - len(lines[-1]) - 1  # where the last record starts
    for n in sorted({last + 2, last + len(lines[-1]) // 2, len(good) - 3}):
        yield f"cut at byte {n}", writes(good[:n])
    yield "a record that is a list", writes("\n".join([*lines[:-1], "[1, 2]"]) + "\n")
    first = json.loads(lines[0])
    for key in first:
        bad = json.dumps({**first, key: wrong_type(first[key])})
        yield f"field {key!r} of another type", writes("\n".join([bad, *lines[1:]]) + "\n")
        if isinstance(first[key], bool | int | float):
            quoted = json.dumps({**first, key: json.dumps(first[key])})
            yield f"field {key!r} as a string", writes("\n".join([quoted, *lines[1:]]) + "\n")
    yield "a parquet file", writes(PARQUET_BYTES)


def folder_variants(
    good: Path,
    json_fields: int | None = 4,
    optional: tuple[str, ...] = (),
    unread: tuple[str, ...] = (),
) -> Iterator[tuple[str, Writer]]:
    """A folder of files with one member missing, each structured member (`STRUCTURED`) cut to
    half, each JSON member
    corrupted as `json_variants` does (its first ``json_fields`` fields), the folder empty, and
    a file in the folder's place. ``optional``: members (paths or file names) the folder may lack; ``unread``:
    members no reader of the folder reads (left alone)."""
    members = sorted(p.relative_to(good) for p in good.rglob("*") if p.is_file())

    def copy_then(change: Callable[[Path], None]) -> Writer:
        def write(path: Path) -> None:
            shutil.copytree(good, path)
            change(path)

        return write

    for rel in members:
        if rel.name in unread:  # a record of how the folder was made, read by no reader
            continue
        if rel.name not in optional and str(rel) not in optional:
            yield f"{rel} missing", copy_then(lambda p, rel=rel: (p / rel).unlink())
        size = (good / rel).stat().st_size
        if size > 2 and (rel.suffix in STRUCTURED or rel.name in STRUCTURED_NAMES):
            half = (good / rel).read_bytes()[: size // 2]
            yield (
                f"{rel} cut to half",
                copy_then(lambda p, rel=rel, b=half: (p / rel).write_bytes(b)),
            )
        if rel.suffix == ".json":
            text = (good / rel).read_text()
            if text.lstrip().startswith("{"):
                for what, write in json_variants(text, json_fields):
                    if not what.startswith("cut"):  # cut to half above
                        yield f"{rel}: {what}", copy_then(lambda p, rel=rel, w=write: w(p / rel))
    yield "an empty folder", lambda p: p.mkdir(parents=True)
    yield "a file in the folder's place", writes("not a folder\n")
