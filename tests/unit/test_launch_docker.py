"""The GPU image: hadolint-clean, and installed by the same script and lists as the CPU install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not on PATH")
def test_dockerfile_passes_hadolint() -> None:
    proc = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_installs_only_through_the_shared_install_script() -> None:
    steps = _instructions()
    runs = [args for word, args in steps if word == "RUN"]
    installs = [r for r in runs if "install.sh" in r]
    assert installs == ["bash tools/install.sh gpu"]
    assert not any(re.search(r"pip3? install|uv pip|conda install", r) for r in runs)
    # Every file the install reads is in the image before the install runs...
    at = steps.index(("RUN", "bash tools/install.sh gpu"))
    copied = " ".join(args for word, args in steps[:at] if word == "COPY")
    for name in (
        "requirements.txt",
        "requirements-gpu.in",
        "requirements-gpu.lock",
        "tools/install.sh",
        "pyproject.toml",
    ):
        assert name in copied, name
    # ...but not the whole source (that layer comes after, so edits keep the cache).
    assert "COPY . ." not in [f"COPY {a}" for w, a in steps[:at] if w == "COPY"]
    assert ("COPY", ". .") in steps[at:]


def test_dockerfile_base_and_user() -> None:
    steps = _instructions()
    # a CUDA devel base (nvcc for TE's extension) whose CUDA major is torch's in the lock
    base = next(a for w, a in steps if w == "ARG" and a.startswith("BASE_IMAGE="))
    match = re.fullmatch(r"BASE_IMAGE=nvidia/cuda:(\d+)\.[\d.]+-cudnn-devel-ubuntu24\.04", base)
    assert match, base
    lock = (ROOT / "requirements-gpu.lock").read_text()
    assert f"nvidia-nccl-cu{match.group(1)}==" in lock
    users = [a for w, a in steps if w == "USER"]
    assert users and not users[-1].startswith(("root", "0"))


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "runs"):
        assert entry in ignored


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_cpu_and_gpu_installs_read_the_same_requirements(target: str, tmp_path: Path) -> None:
    """Run tools/install.sh with a fake `python` that records each pip call."""
    log = tmp_path / "pip.log"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/bash\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    args = ["bash", str(ROOT / "tools" / "install.sh")] + ([target] if target == "gpu" else [])
    subprocess.run(args, env=env, check=True, capture_output=True, timeout=60)
    calls = log.read_text().splitlines()
    installs = [c for c in calls if " install " in f" {c} "]
    assert any(c.endswith(f"-r {ROOT}/requirements.txt") for c in installs), calls
    assert installs[-1].endswith(f"--no-deps -e {ROOT}")
    gpu = (
        f"-c {ROOT}/requirements-gpu.lock -r {ROOT}/requirements-gpu.in -r {ROOT}/requirements.txt"
    )
    assert any(c.endswith(gpu) for c in installs) == (target == "gpu"), calls
    te = [c for c in installs if "transformer-engine-torch" in c]
    if target == "gpu":  # the pinned TE extension, built against the installed torch
        assert te == [
            f"-m pip install --disable-pip-version-check -q --no-build-isolation --no-deps "
            f"transformer-engine-torch=={_locked('transformer-engine-torch')}"
        ], te
    else:
        assert te == []


def _locked(name: str) -> str:
    for line in (ROOT / "requirements-gpu.lock").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==")[1].split()[0]
    raise AssertionError(f"{name} not in the lock")


def test_gpu_lock_pins_every_package_and_marks_the_source_builds() -> None:
    import tools.gpu_lock as gpu_lock

    pins = gpu_lock.read_lock(ROOT / "requirements-gpu.lock")
    sources = gpu_lock.source_pins((ROOT / "requirements-gpu.in").read_text())
    assert {"torch", "vllm", "transformer-engine", "megatron-core", "ray"} <= pins.keys()
    for name, version in sources.items():
        assert pins[name] == version
    # what the .in file pins is what the lock holds
    for line in (ROOT / "requirements-gpu.in").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = re.sub(r"\[.*\]", "", line).split("==")
            assert pins[gpu_lock.canonical(name)] == version, line
    # megatron-core: the release the CPU install runs its tests with
    import importlib.metadata

    assert pins["megatron-core"] == importlib.metadata.version("megatron-core")
