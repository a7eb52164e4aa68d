"""`tools/local_image.sh` takes the Debian mirror apt really uses (not a comment line's
address) and stops at the first failed step: a failed debootstrap marks no base complete and
nothing is imported or built after it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "local_image.sh"


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)  # fmt: skip


def test_the_mirror_is_the_one_apt_uses(tmp_path):
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n"
        "# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
        "URIs: http://mirror.example.org/debian\n"
        "Suites: bookworm\n"
    )
    assert (
        _run(["mirror"], {"SEED_APT_DIR": str(apt)}).stdout == "http://mirror.example.org/debian\n"
    )
    (apt / "sources.list.d" / "debian.sources").unlink()
    (apt / "sources.list").write_text(
        "# deb http://snapshot.debian.org/archive/debian/20250520T000000Z bookworm main\n"
        "deb [signed-by=/k.gpg] http://ftp.example.net/debian bookworm main\n"
    )
    assert _run(["mirror"], {"SEED_APT_DIR": str(apt)}).stdout == "http://ftp.example.net/debian\n"
    (apt / "sources.list").write_text("")  # none: Debian's own
    assert _run(["mirror"], {"SEED_APT_DIR": str(apt)}).stdout == "http://deb.debian.org/debian\n"
    env = {"SEED_APT_DIR": str(apt), "SEED_DEBIAN_MIRROR": "http://given.example/debian"}
    assert _run(["mirror"], env).stdout == "http://given.example/debian\n"


def test_a_failed_debootstrap_stops_the_build(tmp_path):
    """Fake podman, runc and debootstrap on PATH, each logging its call; debootstrap fails."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    fakes = {"podman": 'echo "podman $*" >> LOG; [[ "$1 $2" == "image exists" ]] && exit 1; exit 0',
             "runc": 'echo "runc $*" >> LOG', "debootstrap": 'echo "debootstrap $*" >> LOG; '
             'echo "E: Failed getting release file" >&2; exit 1'}  # fmt: skip
    for name, body in fakes.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body.replace("LOG", str(log)) + "\n")
        (bin_dir / name).chmod(0o755)
    store = tmp_path / "store"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SEED_IMAGE_STORE": str(store),
           "SEED_DEBIAN_MIRROR": "http://unreachable.example/debian"}  # fmt: skip
    proc = _run(["all"], env)
    assert proc.returncode != 0
    assert "debootstrap from http://unreachable.example/debian failed" in proc.stderr
    assert "Failed getting release file" in proc.stderr  # the cause, not a later symptom
    calls = log.read_text().splitlines()
    assert calls[-1].startswith("debootstrap ")  # nothing imported, built or exported after
    assert not (store / "base-rootfs" / ".complete").exists()
