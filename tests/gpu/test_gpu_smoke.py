"""The GPU smoke script on a GPU (its CPU dry run: tests/distributed/test_gpu_smoke_cpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_smoke.py"


def _run(tmp_path, *args):
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_gpu_smoke(tmp_path):
    result = _run(tmp_path, "--steps", "3", "--seq", "1024")
    for name, mode in result["modes"].items():
        assert mode["finite"], name
        assert mode["parity"]["mean_abs_diff"] < 0.05, (name, mode["parity"])
        assert mode["packing"]["mean_abs_diff"] < 0.05, (name, mode["packing"])
        assert 0.0 < mode["mfu"] < 1.0, name
        assert mode["memory"]["peak_over_model_total"] <= 1.0, (name, mode["memory"])
        assert mode["resume"]["abs_diff"] <= 1e-3 * max(1.0, abs(mode["resume"]["loss_continued"]))
        if name == "moe":  # routing replay through TE's grouped GEMM
            replay = mode["routing_replay"]
            assert replay["routes_replayed"] == 1.0 and replay["finite"]
            assert replay["moved_mean_abs"] > 1e-3  # the random routes were followed
