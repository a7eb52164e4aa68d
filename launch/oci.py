"""Slurm's own OCI containers (`srun --container=BUNDLE`, `seed launch --container-bundle`).

`tools/local_image.sh bundle` exports the image as an OCI bundle: `rootfs/` and runc's
default `config.json`. A job does not run in that bundle as it is: `write_job_bundle` writes
the job's own `config.json` (a bundle folder in the job folder) that

- points at the image's rootfs (an absolute `root.path`), read-only, so every step of every
  job shares one unpacked image;
- keeps only a mount namespace of its own, as enroot does: the host's network (Ray, torchrun
  and NCCL reach the other nodes as on bare metal), hostname (gloo resolves it), process IDs
  (Ray's raylet watches its drivers' pids) and IPC namespace (CUDA IPC between an engine and
  a trainer rank in separate containers of one node works as with Docker's `--ipc=host`);
- bind-mounts the host's /tmp (a Ray driver talks to its node's raylet through the session's
  sockets there), /dev/shm (Ray's object store), the job folder and the model, games and
  output folders at their own paths, with tmpfs on /root, /home and /var/tmp;
- runs as the submitting user, like pyxis, with the open-files limit Ray needs.

Slurm fills in each step's command, environment and working directory. Each node needs an
`oci.conf` beside its `slurm.conf` naming the runtime (`oci_conf`); on GPU nodes the runtime
must also expose the GPUs (NVIDIA's runc wrapper, `nvidia-container-runtime`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# the namespaces a job's containers keep; everything else is the host's
NAMESPACES = ("mount",)
PRIVATE_DIRS = ("/root", "/home", "/var/tmp")  # writable per container (tmpfs)
HOST_DIRS = ("/tmp", "/dev/shm")  # shared with the host and the node's other steps
OPEN_FILES = 20000


class BundleError(ValueError):
    """The image bundle cannot be used; one line."""


def check_bundle(bundle: str | Path) -> Path:
    """The image bundle's absolute path, refused in one line unless it has `config.json` and
    a `rootfs/` with the image's marker file."""
    path = Path(bundle).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise BundleError(f"{path} is not an OCI bundle: no config.json (tools/local_image.sh)")
    if not (path / "rootfs" / "etc" / "megatron-seed-image").is_file():
        raise BundleError(
            f"{path}/rootfs is not a megatron-seed image (no /etc/megatron-seed-image)"
        )
    return path


def job_config(
    bundle: Path,
    mounts: list[tuple[str, str]],
    uid: int,
    gid: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The job's `config.json`, from the image bundle's (see the module docstring);
    `mounts`: (host, container) folders; `env`: the image's environment (PATH, VIRTUAL_ENV,
    ...), which Slurm's step environment is added to."""
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(bundle / "rootfs"), "readonly": True}
    process = config.setdefault("process", {})
    process["terminal"] = False
    process["user"] = {"uid": uid, "gid": gid}
    process["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": OPEN_FILES, "soft": OPEN_FILES}]
    if env:
        process["env"] = [f"{k}={v}" for k, v in env.items()]
    linux = config.setdefault("linux", {})
    linux["namespaces"] = [{"type": t} for t in NAMESPACES]
    # host and job folders replace runc's own /dev/shm; nothing else of its defaults changes
    kept = [m for m in config.get("mounts", []) if m["destination"] not in HOST_DIRS]
    binds = [_bind(p, p) for p in HOST_DIRS] + [_bind(s, d) for s, d in sorted(set(mounts))]
    tmpfs = [
        {"destination": d, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=1777"]}
        for d in PRIVATE_DIRS
    ]
    config["mounts"] = kept + tmpfs + binds
    return config


def write_job_bundle(
    bundle: str | Path, folder: str | Path, mounts: list[tuple[str, str]], uid: int | None = None
) -> Path:
    """Write the job's bundle (its `config.json`) into `folder` and return `folder`; the
    mounts must exist (a missing host folder would fail every step at its start)."""
    image = check_bundle(bundle)
    missing = [src for src, _ in mounts if not Path(src).exists()]
    if missing:
        raise BundleError(f"container mounts that do not exist on this machine: {missing}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if uid == os.getuid() else uid
    config = job_config(image, mounts, uid, gid, image_env(image))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def image_env(bundle: Path) -> dict[str, str]:
    """The image's own environment (its Dockerfile's ENV), from the bundle's
    `image-config.json` (`tools/local_image.sh` keeps it); empty when absent."""
    try:
        cfg = json.loads((bundle / "image-config.json").read_text())
    except (OSError, ValueError):
        return {}
    pairs = (item.partition("=") for item in cfg.get("Env") or [])
    return {k: v for k, _, v in pairs}


def oci_conf(runtime: str = "runc", state_dir: str = "/run/seed-oci") -> str:
    """An `oci.conf` for Slurm 22.05+ (beside `slurm.conf` on every node): runc run, state,
    kill and delete for each step's container, named by node, user, job, step and task."""
    name = "%n.%u.%j.%s.%t"
    base = f"{runtime} --root={state_dir}"
    lines = [
        "# written by megatron-seed: Slurm's OCI containers through runc",
        f'RunTimeQuery="{base} state {name}"',
        f'RunTimeKill="{base} kill -a {name} SIGTERM"',
        f'RunTimeDelete="{base} delete --force {name}"',
        f'RunTimeRun="{base} run {name} -b %b"',
    ]
    return "\n".join(lines) + "\n"


def _bind(source: str, destination: str) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", "rw"],
    }
