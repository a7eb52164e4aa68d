"""Resolve the GPU image's dependencies for Python 3.12 on Linux x86-64 with pip's resolver.

    python tools/gpu_lock.py            # check: the resolution equals requirements-gpu.lock
    python tools/gpu_lock.py --update   # re-resolve (the lock's pins lifted) and rewrite it

The GPU image (Dockerfile, `tools/install.sh gpu`) installs `requirements-gpu.in` and
`requirements.txt` under the lock's constraints. This script resolves the same two files
on any machine, for the image's interpreter and platform (`pip install --dry-run --report`
with `--python-version 3.12 --platform manylinux_*_x86_64 --only-binary=:all:`), so a lock
that does not resolve fails here, not in a Docker build on a GPU cluster.

Packages that PyPI ships only as sdists (the `# source:` lines of requirements-gpu.in:
Transformer Engine's PyTorch extension, compiled in the image against its torch, and
jericho) cannot be resolved for a foreign platform: each is replaced, for the resolution
only, by a metadata wheel that declares the `Requires-Dist` of its sdist's PKG-INFO, with one
correction: TE's extension requires the core library of the CUDA it is compiled with
(`transformer_engine_cu<major>`, computed by its setup.py), and the sdist's PKG-INFO names the
CUDA of the machine that made the sdist; the wheel names the image's (`CUDA_MAJOR`).
pip runs from a private virtual environment with a current pip (its PEP 658 metadata
support resolves without downloading the multi-GB CUDA wheels); the machine's pip
configuration is ignored. Needs PyPI; about a minute.

The lock records a digest of what it was resolved from (`requirements-gpu.in`,
`requirements.txt` and its own pins): `--update` writes it after a successful resolution, so
a lock whose digest matches its inputs is the resolution of those inputs, and the tests check
that without the network (`lock_digest`, `inputs_digest`).
"""

from __future__ import annotations

import argparse
import base64
import email.parser
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IN_FILE = ROOT / "requirements-gpu.in"
LOCK = ROOT / "requirements-gpu.lock"
SHARED = ROOT / "requirements.txt"
PYTHON = "3.12"
CUDA_MAJOR = "13"  # the image's CUDA (the Dockerfile's BASE_IMAGE)
# Ubuntu 24.04 (glibc 2.39): every manylinux tag it runs, newest first
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(39, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]
PIP_MIN = "25.0"
PYPI = "https://pypi.org/pypi/{name}/json"
HEADER = """\
# The GPU image's full dependency set for Python 3.12 on Linux x86-64: every package pinned.
# Written by `python tools/gpu_lock.py --update` from requirements-gpu.in + requirements.txt;
# `python tools/gpu_lock.py` checks it still resolves to exactly this. Do not edit by hand.
# "source" marks a package built from its sdist in the image.
# inputs sha256: {digest}
"""


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def source_pins(text: str) -> dict[str, str]:
    """The `# source: name==version` lines of requirements-gpu.in."""
    pins = {}
    for m in re.finditer(r"^#\s*source:\s*([A-Za-z0-9_.-]+)==([^\s#]+)", text, re.M):
        pins[canonical(m.group(1))] = m.group(2)
    return pins


def read_lock(path: Path) -> dict[str, str]:
    """{name: version} of a lock file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            if not version:
                raise SystemExit(f"{path}: {line!r} is not pinned with ==")
            pins[canonical(name)] = version.strip()
    return pins


def inputs_digest(pins: dict[str, str]) -> str:
    """sha256 of what a lock is resolved from: requirements-gpu.in, requirements.txt and
    the pins themselves."""
    h = hashlib.sha256()
    for text in (IN_FILE.read_text(), SHARED.read_text()):
        h.update(text.encode() + b"\0")
    h.update("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())).encode())
    return h.hexdigest()


def lock_digest(path: Path) -> str | None:
    """The `# inputs sha256:` a lock file records (None when it has none)."""
    m = re.search(r"^# inputs sha256: ([0-9a-f]{64})$", path.read_text(), re.M)
    return m.group(1) if m else None


def write_lock(path: Path, pins: dict[str, str], sources: set[str]) -> None:
    """The lock: sorted `name==version` lines under a header with the inputs' digest."""
    lines = [
        f"{name}=={version}" + ("  # source" if name in sources else "")
        for name, version in sorted(pins.items())
    ]
    path.write_text(HEADER.format(digest=inputs_digest(pins)) + "\n".join(lines) + "\n")


def as_built_in_the_image(pkg_info: str) -> str:
    """An sdist's PKG-INFO with TE's core-library requirement for the image's CUDA."""
    return re.sub(
        r"^(Requires-Dist:\s*transformer[-_]engine[-_]cu)\d+",
        rf"\g<1>{CUDA_MAJOR}",
        pkg_info,
        flags=re.M,
    )


def sdist_metadata(name: str, version: str) -> str:
    """The PKG-INFO of `name==version`'s sdist on PyPI (its declared requirements)."""
    with urllib.request.urlopen(PYPI.format(name=name), timeout=60) as r:
        release = json.load(r)["releases"].get(version) or []
    sdists = [f for f in release if f["packagetype"] == "sdist"]
    if not sdists:
        raise SystemExit(f"{name}=={version}: PyPI has no sdist of this release")
    url = sdists[0]["url"]
    if url.startswith("../"):  # some indexes answer with relative links
        url = "https://pypi.org/" + url.lstrip("./")
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        top = [m for m in tar.getmembers() if m.name.count("/") == 1]
        info = next((m for m in top if m.name.endswith("/PKG-INFO")), None)
        if info is None:
            raise SystemExit(f"{name}=={version}: its sdist has no PKG-INFO")
        return tar.extractfile(info).read().decode()


def metadata_wheel(folder: Path, name: str, version: str, pkg_info: str) -> Path:
    """A wheel with no code that declares `pkg_info`'s requirements (resolution only)."""
    meta = email.parser.Parser().parsestr(pkg_info)
    dist = f"{name.replace('-', '_')}-{version}"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if meta.get("Requires-Python"):
        lines.append(f"Requires-Python: {meta['Requires-Python']}")
    lines += [f"Provides-Extra: {e}" for e in meta.get_all("Provides-Extra") or []]
    lines += [f"Requires-Dist: {r}" for r in meta.get_all("Requires-Dist") or []]
    files = {
        f"{dist}.dist-info/METADATA": "\n".join(lines) + "\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: gpu_lock\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for arc, text in files.items():
            whl.writestr(arc, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
            record.append(f"{arc},sha256={digest.decode().rstrip('=')},{len(text.encode())}")
        record.append(f"{dist}.dist-info/RECORD,,")
        whl.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def resolver_pip(cache: Path) -> list[str]:
    """A pip >= PIP_MIN in a private venv (created once under `cache`)."""
    venv = cache / "pip-venv"
    python = venv / "bin" / "python"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--isolated", "-q", f"pip>={PIP_MIN}"],
        check=True,
        env=env,
    )
    return [str(python), "-m", "pip"]


def resolve(pip: list[str], lock: Path | None, sources: dict[str, str]) -> dict[str, str]:
    """{name: version} pip's resolver picks for the image (under `lock` when given)."""
    with tempfile.TemporaryDirectory() as tmp:
        links = Path(tmp) / "sdist-metadata"
        links.mkdir()
        for name, version in sources.items():
            metadata_wheel(
                links, name, version, as_built_in_the_image(sdist_metadata(name, version))
            )
        # the image installs TE's extension itself; its metadata wheel enters the
        # resolution as a requirement of its own, at the pinned version
        reqs = Path(tmp) / "sources.txt"
        reqs.write_text("".join(f"{n}=={v}\n" for n, v in sources.items()))
        report = Path(tmp) / "report.json"
        cmd = [
            *pip,
            "install",
            "--isolated",
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report),
            "--target",
            str(Path(tmp) / "target"),
            "--python-version",
            PYTHON,
            "--implementation",
            "cp",
            *[a for p in PLATFORMS for a in ("--platform", p)],
            "--only-binary=:all:",
            "--find-links",
            str(links),
            "-r",
            str(IN_FILE),
            "-r",
            str(SHARED),
            "-r",
            str(reqs),
        ]
        if lock is not None:
            cmd += ["-c", str(lock)]
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            tail = "\n".join(line for line in lines if "depends on" in line or "ERROR" in line)
            raise SystemExit(f"the GPU dependencies do not resolve for Python {PYTHON}:\n{tail}")
        installs = json.loads(report.read_text())["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def main() -> int:
    """Check or update requirements-gpu.lock; print the key versions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="re-resolve and rewrite the lock")
    parser.add_argument(
        "--cache", default=str(Path.home() / ".cache" / "megatron-seed"), help="pip venv here"
    )
    args = parser.parse_args()
    sources = source_pins(IN_FILE.read_text())
    pip = resolver_pip(Path(args.cache))
    if args.update:
        pins = resolve(pip, None, sources)
        write_lock(LOCK, pins, set(sources))
        print(f"wrote {LOCK.name}: {len(pins)} packages")
    else:
        if not LOCK.is_file():
            raise SystemExit(f"no {LOCK.name}: run with --update")
        locked = read_lock(LOCK)
        pins = resolve(pip, LOCK, sources)
        if pins != locked:
            diff = sorted(set(pins.items()) ^ set(locked.items()))
            raise SystemExit(f"{LOCK.name} is stale (resolved vs locked differ): {diff[:10]}")
        if lock_digest(LOCK) != inputs_digest(locked):
            raise SystemExit(f"{LOCK.name}: its inputs digest is stale: run with --update")
        print(f"{LOCK.name}: {len(pins)} packages resolve for Python {PYTHON} linux x86-64")
    key = ("torch", "vllm", "transformer-engine", "transformer-engine-torch", "megatron-core")
    print(", ".join(f"{k}=={pins[k]}" for k in key if k in pins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
