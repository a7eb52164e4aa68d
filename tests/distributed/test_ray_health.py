"""`launch.ray_health` against a real local Ray (2 fake GPUs): the check passes for it and
times out, naming what is missing, when it asks for 2 nodes."""

from __future__ import annotations

import os
import subprocess
import sys

RAY_HEAD = """
import sys, tempfile, ray
ctx = ray.init(num_cpus=1, num_gpus=2, include_dashboard=False,
               _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"))
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.readline()
ray.shutdown()
"""


def test_ray_health_against_a_real_local_cluster(monkeypatch) -> None:
    """~30 s: a local Ray with 2 fake GPUs; the check passes for it and times out for 2 nodes."""
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # as in the Slurm script; keeps ~/.ray alone
    monkeypatch.setenv("RAY_AUTH_TOKEN", os.urandom(16).hex())
    head = subprocess.Popen(
        [sys.executable, "-c", RAY_HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        address = head.stdout.readline().strip()
        check = [sys.executable, "-m", "launch.ray_health", "--address", address]
        ok = subprocess.run(
            [*check, "--nodes", "1", "--gpus", "2"], capture_output=True, text=True, timeout=120
        )
        assert ok.returncode == 0 and "ready: 1 nodes, 2 GPUs" in ok.stdout, ok.stderr
        short = subprocess.run(
            [*check, "--nodes", "2", "--gpus", "2", "--timeout", "6"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert short.returncode == 1 and "1/2 nodes" in short.stderr
    finally:
        head.stdin.write("\n")
        head.stdin.flush()
        head.wait(timeout=60)
