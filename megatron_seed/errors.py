"""User-facing errors, in a leaf module every layer may import.

`ConfigError` (a bad config value) and `CommandError` (bad command input) are printed by the
`seed` command as one line with exit code 2, before any compute is spent.
"""

from __future__ import annotations

import argparse
from pathlib import Path


class CommandError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


class ConfigError(CommandError, ValueError):
    """A config value out of its allowed range, of the wrong type, or an unknown key."""


def output_dir(path: str | Path, flag: str = "--out") -> Path:
    """An output folder that may be created or written into: `CommandError` if the path is
    an existing file (checked before any work, so nothing is left half-written)."""
    out = Path(path)
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                raise CommandError(f"{flag} {out}: {p} exists and is not a folder")
            break
    return out


def new_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """`output_dir` for a folder a command makes whole (`files.staged_folder`): it must not
    exist yet or be empty, so that nothing of another output is mixed into it."""
    out = output_dir(path, flag)
    if out.is_dir() and any(out.iterdir()):
        raise CommandError(f"{flag} {out} is not empty: name a new folder")
    return out


def output_file(path: str | Path, flag: str = "--out") -> Path:
    """An output file that may be written: `CommandError` if the path is a folder or lies
    under an existing file (checked before any work)."""
    out = Path(path)
    if out.is_dir():
        raise CommandError(f"{flag} {out} is a folder; name a file")
    output_dir(out.parent, flag)
    return out


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
