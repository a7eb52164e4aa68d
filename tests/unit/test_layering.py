"""Dependencies point one way: the library never imports the CPU test bed, and nothing
outside `envs/alfworld/` imports ALFWorld code or knows its task marker."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_seed.cli import COMMANDS, DEFAULT_JOB

REPO = Path(__file__).resolve().parents[2]
LIBRARY = ("megatron_seed", "envs", "launch")


def _modules(exclude: str) -> list[str]:
    names = []
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts).removesuffix(".__init__")
            if not name.startswith(exclude):
                names.append(name)
    return names


def _loads_test_bed(modules: dict[str, str]) -> list[str]:
    """The keys of ``modules`` (label -> module) whose import, in a fresh process one after
    another, loads a module of the test bed."""
    code = (
        "import importlib, json, sys\n"
        "bad = []\n"
        f"for label, module in {modules!r}.items():\n"
        "    importlib.import_module(module)\n"
        "    if any(m.startswith('megatron_seed.testbed') for m in sys.modules):\n"
        "        bad.append(label)\n"
        "        for m in [m for m in sys.modules if m.startswith('megatron_seed.testbed')]:\n"
        "            del sys.modules[m]\n"
        "print(json.dumps(bad))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def into_test_bed() -> list[str]:
    """Every `seed` command's module but the default job's (labelled ``seed NAME``), then
    every library module outside the test bed: those that load the test bed."""
    commands = {f"seed {n}": m for n, (m, _) in COMMANDS.items() if n != DEFAULT_JOB}
    library = {name: name for name in _modules("megatron_seed.testbed")}
    return _loads_test_bed({**commands, **library})


def test_the_library_never_imports_the_test_bed(into_test_bed: list[str]) -> None:
    modules = _modules("megatron_seed.testbed")
    assert "megatron_seed.pipeline.stage2" in modules and len(modules) > 50
    assert into_test_bed == []


def test_no_command_but_the_default_job_lives_in_the_test_bed(into_test_bed: list[str]) -> None:
    """`seed compare`, `seed bench`, `seed smoke`, ...: product code; `seed run` alone is
    the test bed's (the routing table names each command's module)."""
    assert COMMANDS[DEFAULT_JOB][0].startswith("megatron_seed.testbed.")
    assert {"compare", "bench", "smoke", "train", "eval"} <= set(COMMANDS)
    assert [label for label in into_test_bed if label.startswith("seed ")] == []


def test_the_checker_sees_a_test_bed_import(tmp_path: Path, monkeypatch) -> None:
    """The same check names the command and the module that do import the test bed, and
    only those."""
    (tmp_path / "bad_module.py").write_text("import megatron_seed.testbed.tiny\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    modules = {
        "seed games": "envs.commands",
        "seed run": COMMANDS[DEFAULT_JOB][0],
        "seed compare": "megatron_seed.compare.commands",
        "bad": "bad_module",
    }
    assert _loads_test_bed(modules) == ["seed run", "bad"]


ALFWORLD_IMPORT = re.compile(
    r"^\s*(?:from|import)\s+(?:alfworld|textworld|envs\.alfworld)\b", re.MULTILINE
)
MARKER = "Your task is " + "to"  # ALFWorld's task line, split so this file does not hold it


def _outside_alfworld() -> list[Path]:
    files = []
    for package in (*LIBRARY, "tools"):
        for path in (REPO / package).rglob("*.py"):
            if "envs/alfworld" not in path.relative_to(REPO).as_posix():
                files.append(path)
    return files


def test_alfworld_lives_in_its_own_package() -> None:
    files = _outside_alfworld()
    assert any(p.name == "stage2.py" for p in files)
    offenders = [
        str(p.relative_to(REPO))
        for p in files
        if ALFWORLD_IMPORT.search(p.read_text()) or MARKER in p.read_text()
    ]
    assert offenders == []
    # and the patterns do find what they look for
    assert ALFWORLD_IMPORT.search((REPO / "envs/alfworld/env.py").read_text())
    assert MARKER in (REPO / "envs/alfworld/prompt.py").read_text()
