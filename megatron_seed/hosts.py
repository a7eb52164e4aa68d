"""Which node this process runs on, as the cluster names it (for logs and placement checks)."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def node_name() -> str:
    """Inside one of Slurm's OCI containers, the node its container is named after (there
    `SLURMD_NODENAME`, if set at all, is the batch script's node, copied into every step);
    else Slurm's name for this node (`SLURMD_NODENAME`, inherited by the job's Ray workers
    too); else the host name. Several Slurm nodes may share one host (a rehearsal cluster)."""
    return container_node() or os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def container_node(cgroup: str | None = None, job: str | None = None) -> str | None:
    """The node of this process's Slurm OCI container, or None outside one.

    Slurm 22.05 gives a container's processes the job's environment but not the task's
    (no `SLURMD_NODENAME`). The runtime names each container `NODE.USER.JOB.STEP.TASK`
    (`launch.oci.oci_conf`), and runc names the container's cgroup after it, which every
    process in it (Ray's workers too) inherits; `cgroup`: /proc/self/cgroup's text, `job`:
    the Slurm job id (default this process's)."""
    job = job or os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    if cgroup is None:
        try:
            cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    for line in cgroup.splitlines():
        name = line.rsplit("/", 1)[-1]
        parts = name.rsplit(".", 4)  # a node name may itself hold dots
        if len(parts) == 5 and parts[2] == job and parts[3].isdigit():
            return parts[0]
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m megatron_seed.hosts CMD [ARG...]`: run CMD with `SLURMD_NODENAME` set to
    this node (`node_name`), so that everything it starts inherits the name (a Ray raylet's
    workers: engines, env workers) where Slurm did not set it (its OCI containers)."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m megatron_seed.hosts CMD [ARG...]", file=sys.stderr)
        return 2
    os.environ["SLURMD_NODENAME"] = node_name()
    os.execvp(argv[0], argv)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
