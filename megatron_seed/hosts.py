"""Which node this process runs on, as the cluster names it (for logs and placement checks)."""

from __future__ import annotations

import os
import socket


def node_name() -> str:
    """Slurm's name for this node (`SLURMD_NODENAME`, inherited by the job's Ray workers too),
    else the host name. Several Slurm nodes may share one host (a rehearsal cluster)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
