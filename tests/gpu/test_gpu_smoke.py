"""The GPU smoke script on a GPU (its CPU dry run: tests/distributed/test_gpu_smoke_cpu.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_smoke.py"


def smoke_module():
    """tools/gpu_smoke.py as a module (its `problems` checks a result)."""
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path, *args, ok: bool = True):
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_gpu_smoke(tmp_path):
    """Every mode that ran passes the checks of what it measured (skipped modes and numbers a
    mode does not have are not read)."""
    result = _run(tmp_path, "--steps", "3", "--seq", "1024", ok=False)
    assert result["done"]
    assert smoke_module().problems(result) == [] == result["problems"]
