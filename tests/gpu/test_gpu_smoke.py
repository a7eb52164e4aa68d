"""The GPU smoke script: a dry run of its code path on the CPU, the real run on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_cpu_dry_run(tmp_path):
    """The whole script on a tiny model: parity with transformers, a finite SEED update, an
    exact resume, and the trainer's memory equal to the launcher's static model."""
    result = _run(tmp_path, "--cpu-tiny")
    (mode,) = result["modes"].values()
    assert mode["parity"]["max_abs_diff"] < 1e-4
    assert mode["packing"]["max_abs_diff"] < 1e-5  # packed rows score as the padded ones
    assert mode["finite"] and mode["train_tokens_per_s"] > 0
    assert mode["resume"]["abs_diff"] == 0.0
    # float32 on the CPU: 4 (weights) + 4 (grads) + 8 (Adam) + 4 (reference) bytes per
    # parameter, the model's 2 + 4 + 12 + 2 of mixed precision
    assert abs(mode["memory"]["held_over_model_static"] - 1.0) < 0.01
    assert mode["batch"]["seq"] >= 128  # about --seq tokens per sequence


@pytest.mark.gpu
def test_gpu_smoke(tmp_path):
    result = _run(tmp_path, "--steps", "3", "--seq", "1024")
    for name, mode in result["modes"].items():
        assert mode["finite"], name
        assert mode["parity"]["mean_abs_diff"] < 0.05, (name, mode["parity"])
        assert mode["packing"]["mean_abs_diff"] < 0.05, (name, mode["packing"])
        assert 0.0 < mode["mfu"] < 1.0, name
        assert mode["memory"]["peak_over_model_total"] <= 1.0, (name, mode["memory"])
        assert mode["resume"]["abs_diff"] <= 1e-3 * max(1.0, abs(mode["resume"]["loss_continued"]))
