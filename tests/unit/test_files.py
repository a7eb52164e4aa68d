"""Outputs never half-exist: `megatron_seed.files` writes through a temporary file and a
rename, so a write that dies leaves the previous file whole and no stray file behind."""

from __future__ import annotations

import json
import os

import pytest

from megatron_seed.files import write_json, write_text


def test_a_write_replaces_the_file_whole(tmp_path):
    path = write_json(tmp_path / "progress.json", {"sft": True})
    assert json.loads(path.read_text()) == {"sft": True} and path.read_text().endswith("\n")
    write_json(path, {"a": [1, 2]}, indent=None)
    assert path.read_text() == '{"a": [1, 2]}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]


def test_a_write_that_dies_leaves_the_old_file_and_nothing_else(tmp_path, monkeypatch):
    path = write_text(tmp_path / "eval.json", "old\n")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_text(path, "new, and long enough to be cut short\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]  # no temporary left
    with pytest.raises(TypeError):  # not JSON: nothing written either
        write_json(path, {"x": object()})
    assert path.read_text() == "old\n"


def test_the_file_gets_a_plain_writes_mode_and_a_link_is_written_through(tmp_path):
    new = write_text(tmp_path / "compare.json", "{}\n")
    assert new.stat().st_mode & 0o777 == 0o666 & ~_umask()  # not mkstemp's 0600
    new.chmod(0o640)
    write_text(new, "[]\n")
    assert new.stat().st_mode & 0o777 == 0o640  # an existing file keeps its mode
    link = tmp_path / "latest.json"
    link.symlink_to(new)
    write_text(link, '{"a": 1}\n')
    assert link.is_symlink() and new.read_text() == '{"a": 1}\n'


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
