"""Where a process ran: its node, the container image (if any), its root filesystem and its
Linux namespaces, written as one JSON file per process.

A containerised launch (`seed launch --container-bundle` or `--container-image`) sets
`SEED_PROVENANCE_DIR`; then every trainer rank records itself when it starts, the rank that
joins the Ray cluster runs one task on each Ray node (so the Ray head's and workers'
processes, the engines' and env workers' hosts, record theirs too), and so do the health
checks. Without the variable nothing is written.

- `image`: the image's marker file (/etc/megatron-seed-image, written by its build), None
  outside the image;
- `root`: the device and inode of "/" and the filesystem mounted there (mountinfo): two
  processes in one container (or on the bare host) have the same;
- `namespaces`: the inode of each namespace (`ipc:[4026531839]`): processes that share an
  IPC namespace can use each other's CUDA IPC handles.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from megatron_seed.hosts import node_name

ENV = "SEED_PROVENANCE_DIR"
MARKER = Path("/etc/megatron-seed-image")
NAMESPACES = ("ipc", "mnt", "net", "pid", "uts")


def snapshot(step: str) -> dict[str, Any]:
    """This process's provenance (see the module docstring)."""
    root = os.stat("/")
    try:
        image = json.loads(MARKER.read_text())
    except (OSError, ValueError):
        image = None
    namespaces = {}
    for name in NAMESPACES:
        try:
            namespaces[name] = os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            namespaces[name] = None
    return {
        "step": step,
        "node": node_name(),
        "pid": os.getpid(),
        "uid": os.getuid(),
        "image": image,
        "root": {"device": root.st_dev, "inode": root.st_ino, "mount": _root_mount()},
        "namespaces": namespaces,
    }


def record(step: str, folder: str | None = None) -> Path | None:
    """Write this process's snapshot into `folder` (default `$SEED_PROVENANCE_DIR`) as
    STEP-NODE-PID.json; nothing when neither is set. Returns the file."""
    folder = folder or os.environ.get(ENV)
    if not folder:
        return None
    data = snapshot(step)
    out = Path(folder) / f"{step}-{data['node']}-{data['pid']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, out)
    return out


def record_ray_nodes(step: str = "ray-node") -> int:
    """Run one task on every alive Ray node that records that node's Ray worker process
    (spawned by the node's raylet, so inside the Ray step's container); returns how many
    nodes recorded. Nothing (0) without `$SEED_PROVENANCE_DIR`."""
    folder = os.environ.get(ENV)
    if not folder:
        return 0
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(record)
    refs = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(step, folder)
        for node in ray.nodes()
        if node.get("Alive")
    ]
    return sum(1 for path in ray.get(refs) if path is not None)


def _root_mount() -> str | None:
    """'SOURCE FSTYPE' of the filesystem mounted at / for this process (mountinfo)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:  # the last mount at / is the one in effect
        fields = line.split()
        if len(fields) > 4 and fields[4] == "/":
            sep = fields.index("-")
            found = f"{fields[sep + 2]} {fields[sep + 1]}"
    return found
