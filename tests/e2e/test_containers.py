"""The project's image, built here from its Dockerfile (`tools/local_image.sh`), and the
two-node Slurm job with every step inside it (`seed launch --container-bundle`): the same
updates as on bare metal at the same seed, every process's provenance inside the image, a
lost node failing the job and the rerun resuming.

Marked `container`: it needs root, podman, runc and debootstrap, and its first build takes
about 17 minutes, so it runs only when asked for (`python -m pytest -m container
tests/e2e/test_containers.py`); docs/testing.md says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from launch.local_cluster import LocalCluster, down, kill_node, up
from launch.rehearsal import finish, launch_two_nodes, steps, wait_for_update

ROOT = Path(__file__).resolve().parents[2]
STORE = Path(os.environ.get("SEED_IMAGE_STORE", "/var/tmp/megatron-seed-image"))
IMAGE = "localhost/megatron-seed:cpu"

pytestmark = [
    pytest.mark.container,
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("podman", "runc", "debootstrap")),
        reason="needs root, podman, runc and debootstrap",
    ),
]


@pytest.fixture(scope="module")
def bundle() -> Path:
    """The CPU image and its OCI bundle, built (or reused) by the project's one command."""
    subprocess.run(["bash", str(ROOT / "tools" / "local_image.sh")], check=True, timeout=3600)
    return STORE / "bundle"


def _in_image(command: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": str(STORE / "containers.conf")}
    return subprocess.run(
        ["podman", "run", "--rm", IMAGE, "bash", "-c", command],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_image_runs_the_cli_agrees_with_itself_and_passes_the_unit_tests(bundle):
    run = _in_image(
        "seed --help > /dev/null && cd /opt/megatron-seed && bash tools/pip_check.sh && "
        "python -m pytest -q -p no:cacheprovider tests/unit 2>&1 | tail -3",
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "passed" in run.stdout and "failed" not in run.stdout, run.stdout[-2000:]


TIMINGS = ("time/", "busy/", "cpu/", "idle/")  # seconds measured, not computed


def _metrics(out: Path) -> list[dict]:
    """metrics.jsonl without its timings (the only values that may differ between runs)."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    return [
        {
            k: v
            for k, v in r.items()
            if not k.startswith(TIMINGS) and not k.endswith(("_s", "seconds"))
        }
        for r in rows
    ]


def _provenance(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def test_the_two_node_job_in_the_image_matches_bare_metal_and_survives_a_lost_node(
    bundle, tmp_path, tiny_world
):
    cluster = LocalCluster(tmp_path / "cluster", nodes=2, gpus=2, port=17400)
    up(cluster)
    try:
        bare, boxed = tmp_path / "out-bare", tmp_path / "out-container"
        t = time.monotonic()
        run = finish(launch_two_nodes(cluster, tiny_world, tmp_path / "jobs-bare", bare), 900, t)
        assert run.code == 0, run.output[-3000:]
        t = time.monotonic()
        jobs = tmp_path / "jobs"
        proc = launch_two_nodes(cluster, tiny_world, jobs, boxed, bundle=bundle)
        run = finish(proc, 900, t)
        assert run.code == 0, run.output[-3000:] + run.logs[-3000:]
        # the same two updates, number for number, as on bare metal at the same seed
        assert steps(boxed) == [1, 2]
        assert _metrics(boxed) == _metrics(bare)
        # every process that recorded itself ran inside the image, in a mount namespace of
        # its own, on the host's IPC namespace (CUDA IPC across a node's containers)
        records = _provenance(jobs / "provenance")
        host_ipc, host_mnt = os.readlink("/proc/self/ns/ipc"), os.readlink("/proc/self/ns/mnt")
        assert records
        for r in records:
            assert r["image"] and r["image"]["image"] == "megatron-seed:cpu", r
            assert r["namespaces"]["ipc"] == host_ipc and r["namespaces"]["mnt"] != host_mnt, r
        nodes = {(r["step"].split("-rank")[0], r["node"]) for r in records}
        for step in ("trainer", "ray-node"):  # trainer ranks and Ray workers on both nodes
            assert {(step, "n1"), (step, "n2")} <= nodes, nodes

        # a lost node fails the containerised job as fast as on bare metal; the rerun resumes
        lost_out = tmp_path / "out-lost"
        t = time.monotonic()
        proc = launch_two_nodes(cluster, tiny_world, jobs, lost_out, bundle=bundle)
        wait_for_update(lost_out, proc)
        lost = time.monotonic()
        kill_node(cluster, "n2")
        run = finish(proc, 600, t)
        detected = time.monotonic() - lost
        assert run.code != 0 and detected < 90, (run.code, detected)
        up(cluster)
        t = time.monotonic()
        run = finish(launch_two_nodes(cluster, tiny_world, jobs, lost_out, bundle=bundle), 900, t)
        assert run.code == 0, run.output[-3000:]
        assert steps(lost_out) == [1, 2]
    finally:
        down(cluster)
