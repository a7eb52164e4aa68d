"""Slurm's own OCI containers (`srun --container=BUNDLE`, `seed launch --container-bundle`).

`tools/local_image.sh bundle` exports the image as an OCI bundle (`rootfs/` and runc's
default `config.json`), then `python -m launch.oci configure BUNDLE [--mount DIR ...]`
rewrites its `config.json` for jobs (`bundle_config`):

- only a mount namespace of its own, as enroot does: the host's network (Ray, torchrun and
  NCCL reach the other nodes as on bare metal), hostname (gloo resolves it), process IDs
  (Ray's raylet watches its drivers' pids) and IPC namespace (CUDA IPC between an engine and
  a trainer rank in separate containers of one node works as with Docker's `--ipc=host`);
- the rootfs read-only (every step of every job shares one unpacked image), tmpfs on /root,
  /home and /var/tmp;
- the host's /tmp (a Ray driver talks to its node's raylet through the session's sockets
  there), /dev/shm (Ray's object store) and, read-only, /etc/hosts and /etc/resolv.conf
  (torchrun's rendezvous resolves the node's host name) bound in, and the `--mount` folders: the shared
  filesystem the jobs' model, games, output and job folders live on, as a site's container
  configuration mounts it for every job (`check_visible` refuses a job whose folders are
  outside them);
- its user, the open-files limit Ray needs, and the image's environment.

Slurm 22.05 keeps these settings; it sets the command, adds the submitting environment
(without the task's `SLURMD_NODENAME`: `megatron_seed.hosts` reads the node from the
container's name) and points the root at `BUNDLE/rootfs`. It does not switch the user, so
on a cluster shared by several users the runtime should be rootless runc, as in Slurm's
containers guide. Each node needs an `oci.conf` beside its `slurm.conf` (`oci_conf`); on
GPU nodes the runtime must also expose the GPUs (NVIDIA's runc wrapper).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# the namespaces the containers keep; everything else is the host's
NAMESPACES = ("mount",)
PRIVATE_DIRS = ("/root", "/home", "/var/tmp")  # writable per container (tmpfs)
HOST_DIRS = ("/tmp", "/dev/shm")  # shared with the host and the node's other steps
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")  # the host's names (read-only), as enroot
OPEN_FILES = 20000
MARKER = "etc/megatron-seed-image"  # in the rootfs: written by the image's build


class BundleError(ValueError):
    """The image bundle cannot be used; one line."""


def check_bundle(bundle: str | Path) -> Path:
    """The image bundle's absolute path, refused in one line unless it has `config.json` and
    a `rootfs/` with the image's marker file."""
    path = Path(bundle).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise BundleError(f"{path} is not an OCI bundle: no config.json (tools/local_image.sh)")
    if not (path / "rootfs" / MARKER).is_file():
        raise BundleError(f"{path}/rootfs is not a megatron-seed image (no /{MARKER})")
    return path


def bundle_config(
    config: dict[str, Any],
    mounts: list[str],
    uid: int,
    gid: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The bundle's `config.json` for jobs, from runc's default `config` (see the module
    docstring); `mounts`: host folders bound at their own paths; `env`: the image's
    environment (PATH, VIRTUAL_ENV, ...)."""
    config = json.loads(json.dumps(config))  # a copy
    config["root"] = {"path": "rootfs", "readonly": True}
    config.pop("hostname", None)  # the host's (runc refuses one without a UTS namespace)
    process = config.setdefault("process", {})
    process["terminal"] = False
    process["user"] = {"uid": uid, "gid": gid}
    process["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": OPEN_FILES, "soft": OPEN_FILES}]
    if env:
        process["env"] = [f"{k}={v}" for k, v in env.items()]
    config.setdefault("linux", {})["namespaces"] = [{"type": t} for t in NAMESPACES]
    # host folders replace runc's own /dev/shm; nothing else of its defaults changes
    shared = [*HOST_DIRS, *sorted(set(mounts) - set(HOST_DIRS))]
    kept = [m for m in config.get("mounts", []) if m["destination"] not in shared]
    tmpfs = [
        {"destination": d, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=1777"]}
        for d in PRIVATE_DIRS
    ]
    files = [{**_bind(f), "options": ["rbind", "ro"]} for f in HOST_FILES if Path(f).is_file()]
    config["mounts"] = kept + tmpfs + [_bind(p) for p in shared] + files
    return config


def configure(bundle: str | Path, mounts: list[str], uid: int | None = None) -> Path:
    """Rewrite `bundle`'s config.json for jobs (`bundle_config`) from runc's default, kept
    beside it as config.runc.json; the mounts must exist. Returns the bundle."""
    path = check_bundle(bundle)
    missing = [m for m in mounts if not Path(m).is_dir()]
    if missing:
        raise BundleError(f"folders to mount that do not exist on this machine: {missing}")
    default = path / "config.runc.json"
    if not default.is_file():
        default.write_text((path / "config.json").read_text())
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if uid == os.getuid() else uid
    absolute = [str(Path(m).resolve()) for m in mounts]
    config = bundle_config(json.loads(default.read_text()), absolute, uid, gid, image_env(path))
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def check_visible(bundle: Path, folders: list[str]) -> None:
    """Refuse, in one line, folders a job needs that its containers would not see: each
    must lie under one of the bundle's bind mounts."""
    config = json.loads((bundle / "config.json").read_text())
    binds = [Path(m["destination"]) for m in config.get("mounts", []) if m.get("type") == "bind"]
    hidden = [f for f in folders if not any(Path(f).resolve().is_relative_to(b) for b in binds)]
    if hidden:
        shown = ", ".join(str(b) for b in binds) or "nothing"
        raise BundleError(
            f"the containers would not see {hidden}: the bundle mounts {shown} "
            f"(python -m launch.oci configure {bundle} --mount DIR)"
        )


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
    kill and delete for each step's container, named NODE.USER.JOB.STEP.TASK (the node is
    read back from that name inside the container: `megatron_seed.hosts`)."""
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


def _bind(path: str) -> dict[str, Any]:
    return {"destination": path, "type": "bind", "source": path, "options": ["rbind", "rw"]}


def main(argv: list[str] | None = None) -> int:
    """`python -m launch.oci configure BUNDLE [--mount DIR ...] [--uid UID]`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m launch.oci", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    conf = sub.add_parser("configure", help="write the bundle's config.json for jobs")
    conf.add_argument("bundle")
    conf.add_argument("--mount", action="append", default=[], help="a host folder jobs see")
    conf.add_argument("--uid", type=int, default=None, help="the containers' user (default: yours)")
    args = parser.parse_args(argv)
    try:
        path = configure(args.bundle, args.mount, args.uid)
    except BundleError as err:
        print(f"launch.oci: {err}", file=sys.stderr)
        return 2
    print(f"launch.oci: {path}/config.json: jobs see {', '.join([*HOST_DIRS, *args.mount])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
