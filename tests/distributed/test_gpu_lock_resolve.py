"""pip's resolver lands on the GPU lock (`tools/gpu_lock.py` runs it for the image's Python
3.12 on linux x86-64; ~1 minute, needs the package index)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_lock_resolves_for_python_312_linux() -> None:
    """pip's resolver, for the image's interpreter and platform, lands exactly on the lock
    (tools/gpu_lock.py; needs PyPI, as the install does)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_lock.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resolve for Python 3.12 linux x86-64" in proc.stdout
