"""The multi-node path for real: a two-node Slurm cluster on this machine (slurm-wlm and
munge from Debian), `seed launch tiny --executor slurm --nodes 2 --wait`, a Ray cluster
across both nodes, torchrun across both nodes, one engine on each node; a node lost during
update 2, and the rerun that resumes and completes (one launch that fails and one that
succeeds: a clean two-update launch would repeat the rerun's checks)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launch.local_cluster import (
    LocalCluster,
    cancel_jobs,
    down,
    job_processes,
    kill_node,
    up,
)
from launch.rehearsal import finish, launch_two_nodes, steps, wait_for_update

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="Slurm rehearsal: Linux"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """Two nodes (n1, n2) with 2 GPU slots each; stopped by pid afterwards."""
    cluster = LocalCluster(tmp_path_factory.mktemp("slurm"), nodes=2, gpus=2, port=17300)
    up(cluster)
    try:
        yield cluster
    finally:
        down(cluster)


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(cluster: LocalCluster):
    """A failed test must not leave its job (and its Ray on the fixed ports) running."""
    yield
    cancel_jobs(cluster, 60.0)


@pytest.fixture(scope="module")
def world(tiny_world: Path) -> Path:
    return tiny_world


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str, str]:
    """(exit code, output, Slurm job id, the job's log text)."""
    run = finish(proc, timeout, time.monotonic())
    return run.code, run.output, run.job_id, run.logs


# `ray start` in the default folder leaves this behind; a later plain ray.init() here would
# try to join the dead cluster it names
RAY_CLUSTER_FILE = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"


def _assert_nothing_left(cluster: LocalCluster, job_id: str, since: float) -> None:
    assert not RAY_CLUSTER_FILE.exists() or RAY_CLUSTER_FILE.stat().st_mtime < since
    deadline = time.monotonic() + 30
    while job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(1)
    assert job_processes(job_id) == [], "processes of the job outlived it"
    # a job whose node was lost stays COMPLETING (CG) on its other nodes until their slurmd
    # report its end: seconds on an idle machine, longer on a loaded one
    deadline = time.monotonic() + 90
    while (queue := _queue(cluster)) and time.monotonic() < deadline:
        time.sleep(2)
    assert queue == ""


def _queue(cluster: LocalCluster) -> str:
    run = subprocess.run(["squeue", "-h"], env=cluster.env(), capture_output=True, text=True)
    return run.stdout.strip()


def _placement(logs: str) -> tuple[set[str], list[str], list[str]]:
    """(nodes with a trainer rank, the engines' nodes, the env workers' nodes)."""
    ranks = set(re.findall(r"trainer rank \d/2 on node (n\d)", logs))
    fleet = re.search(r"fleet: engines on ([n\d, ]+); env workers on ([n\d, ]+) \(", logs)
    assert fleet, logs[-3000:]
    return ranks, sorted(fleet.group(1).split(", ")), sorted(fleet.group(2).split(", "))


def test_a_lost_node_fails_fast_and_the_rerun_resumes_across_both_nodes(
    cluster: LocalCluster, world: Path, tmp_path: Path
) -> None:
    """Update 1 trains across both nodes; n2 is killed during update 2: the job fails fast,
    naming the node, and leaves nothing behind; with n2 back, the rerun resumes update 2
    across both nodes (one trainer rank, one engine and one env worker on each) and
    completes."""
    out, jobs, since = tmp_path / "out", tmp_path / "jobs", time.time()
    proc = launch_two_nodes(cluster, world, jobs, out)
    wait_for_update(out, proc)  # update 1 is done, update 2 runs
    killed = kill_node(cluster, "n2")
    lost_at = time.monotonic()
    code, output, job_id, _ = _finish(proc, 180)
    took = time.monotonic() - lost_at
    assert code != 0, output[-4000:]
    assert "lost node(s): n2" in output, output[-4000:]
    assert took < 120, f"the failure took {took:.0f} s to surface"
    assert len(killed) > 3  # slurmd, slurmstepd, the trainer rank, the Ray worker, ...
    _assert_nothing_left(cluster, job_id, since)
    assert steps(out) == [1]

    up(cluster)  # the node comes back
    since = time.time()
    code, output, job_id, logs = _finish(launch_two_nodes(cluster, world, jobs, out), 600)
    assert code == 0, output[-4000:]
    assert f"job {job_id} COMPLETED" in output
    assert steps(out) == [1, 2]  # resumed after update 1: nothing duplicated, nothing missing
    assert "[update 1/2]" not in logs and "[update 2/2]" in logs
    ranks, engines, env_workers = _placement(logs)
    assert ranks == {"n1", "n2"}  # one trainer rank on each node (DP=2)
    assert engines == ["n1", "n2"]  # one engine on each node's fleet GPU slot
    assert env_workers == ["n1", "n2"]  # the env workers spread over the nodes
    assert (out / "checkpoints" / "step_000002").is_dir()
    assert (out / "final_hf" / "model.safetensors").is_file()
    _assert_nothing_left(cluster, job_id, since)
