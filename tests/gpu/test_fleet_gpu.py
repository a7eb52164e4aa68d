"""The fleet's GPU weight transfers through vLLM's IPC and NCCL engines (CUDA vLLM needed).

Each check runs in its own process (`fleet_gpu_check.py`), so that the trainer side can be
given its own CUDA_VISIBLE_DEVICES before CUDA starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
        reason="needs vLLM's CUDA build",
    ),
]


def _check(transport: str, tmp_path: Path, env: dict[str, str]) -> dict:
    out = tmp_path / f"{transport}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.gpu.fleet_gpu_check", transport, str(out)],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_ipc_two_colocated_engines_by_gpu_uuid_without_leaking(tmp_path):
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    result = _check("ipc", tmp_path, {"CUDA_VISIBLE_DEVICES": uuid})  # engines see "0"
    assert all(s["max_gap"] < 0.05 for s in result["syncs"]), result
    first, last = result["memory_first_last"]
    assert last <= first + (16 << 20), result  # 10 syncs: every export was freed


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_group_is_rebuilt_after_an_engine_restart(tmp_path):
    result = _check("nccl", tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert result["restarts"] == [1]
    assert all(s["max_gap"] < 0.05 for s in result["syncs"]), result  # sync 2: after it
