"""Outputs that never half-exist: a file is written under a temporary name in its folder and
renamed into place, so a reader (a resumed job, `seed compare --merge`, a user) sees the old
file or the whole new one, never a file cut short by a crash or a full disk; a folder that a
command makes whole (a converted or imported checkpoint) is made under a hidden name beside
it and renamed when the work succeeded (`staged_folder`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()  # read once: os.umask can only be read by setting it


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file in the same folder, flushed to
    disk, then `os.replace`); returns the path. The file gets the mode a plain write would
    give it (an existing file's, else 0666 less the umask; `mkstemp`'s own is 0600), and a
    symbolic link is written through, not replaced."""
    path = Path(path).resolve()
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~UMASK
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, data: Any, indent: int | None = 2, **dumps: Any) -> Path:
    """``data`` as JSON (one line when ``indent`` is None), newline-terminated, written
    atomically (`write_text`); ``dumps``: more `json.dumps` options."""
    return write_text(path, json.dumps(data, indent=indent, **dumps) + "\n")


@contextlib.contextmanager
def staged_folder(out: str | Path) -> Iterator[Path]:
    """A folder output that appears whole or not at all: the work writes into a hidden
    sibling (``.NAME.partial-XXXX``, with the mode of the empty folder it replaces or of a
    plain `mkdir`) that is renamed to ``out`` when the block ends and removed, with any
    parent folder made for it, when the block raises (an error, or the `KeyboardInterrupt`/
    `SystemExit` of a stop). ``out`` must not exist or be an empty folder
    (`errors.new_output_dir` checks it before the work)."""
    out = Path(out).resolve()  # a link to a folder: the stage goes beside its target
    made = next((p for p in reversed(out.parents) if not p.exists()), None)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    stage.chmod(out.stat().st_mode & 0o7777 if out.is_dir() else 0o777 & ~UMASK)
    try:
        yield stage
        if out.is_dir():
            out.rmdir()  # empty: a non-empty one was refused before the work
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(made or stage, ignore_errors=True)
        raise
