"""Outputs never half-exist: `megatron_seed.files` writes through a temporary file and a
rename, so a write that dies leaves the previous file whole and no stray file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def test_a_staged_folder_appears_whole_or_not_at_all(tmp_path):
    from megatron_seed.files import UMASK, staged_folder

    with staged_folder(tmp_path / "a" / "b" / "out") as stage:
        assert stage.parent == tmp_path / "a" / "b" and stage.name.startswith(".out.partial-")
        (stage / "config.json").write_text("{}")
    out = tmp_path / "a" / "b" / "out"
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # no partial left
    assert out.stat().st_mode & 0o777 == 0o777 & ~UMASK
    # the work fails half-way: nothing at the output, nor the parent folders made for it
    with pytest.raises(RuntimeError, match="rank 1 died"), staged_folder(tmp_path / "x/y") as stage:
        (stage / "model").mkdir()
        raise RuntimeError("rank 1 died")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    # an empty folder is replaced; a failure leaves it as it was
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyboardInterrupt), staged_folder(tmp_path / "empty") as stage:
        raise KeyboardInterrupt
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    (tmp_path / "empty").chmod(0o750)
    with staged_folder(tmp_path / "empty") as stage:
        (stage / "w").write_text("1")
    assert (tmp_path / "empty" / "w").read_text() == "1"
    assert (tmp_path / "empty").stat().st_mode & 0o777 == 0o750  # the folder's own mode kept
    # a link to an empty folder: the output lands in its target, the link stays
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with staged_folder(tmp_path / "link") as stage:
        (stage / "config.json").write_text("{}")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target" / "config.json").is_file()


def test_a_failed_conversion_leaves_nothing_at_out(tmp_path, monkeypatch, capsys):
    """`seed convert` writes in worker processes: when one dies, what they wrote goes."""
    from megatron_seed import cli
    from megatron_seed.models import parallel
    from megatron_seed.models.tiny import make_tiny_qwen

    model = make_tiny_qwen(tmp_path / "model")

    def dies_half_way(fn, world, direction, src, out, *layout):
        (Path(out) / "model").mkdir()
        (Path(out) / "model" / "__0_0.distcp").write_bytes(b"half")
        raise RuntimeError("distributed run failed: rank 0: killed")

    monkeypatch.setattr(parallel, "spawn", dies_half_way)
    monkeypatch.setenv("SEED_ERROR_DIR", str(tmp_path / "errors"))
    argv = ["convert", "hf-to-megatron", "--hf", str(model), "--out", str(tmp_path / "o/meg")]
    assert cli.main(argv) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors", "model"]
    # a folder holding something is refused before any work: two checkpoints would mix
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    argv[-1] = str(tmp_path / "full")
    assert cli.main(argv) == 2 and "is not empty" in capsys.readouterr().err
