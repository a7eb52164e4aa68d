"""Slurm's OCI containers: the job's bundle over the image's (`launch.oci`), the oci.conf
of the rehearsal cluster, and the provenance each process records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from launch import oci
from megatron_seed import provenance


def _image_bundle(tmp_path: Path) -> Path:
    """A bundle as tools/local_image.sh leaves it: runc's own config.json (runc spec when
    runc is installed, else its default written out), rootfs/ with the image's marker."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "etc").mkdir(parents=True)
    (bundle / "rootfs" / "etc" / "megatron-seed-image").write_text('{"image": "megatron-seed:cpu"}')
    if shutil.which("runc"):
        subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    else:
        (bundle / "config.json").write_text(json.dumps(RUNC_DEFAULT))
    (bundle / "image-config.json").write_text(
        json.dumps({"Env": ["PATH=/opt/venv/bin:/usr/bin", "VIRTUAL_ENV=/opt/venv"]})
    )
    return bundle


RUNC_DEFAULT = {  # the parts of runc 1.1's `runc spec` that the job's config changes
    "ociVersion": "1.0.2-dev",
    "process": {"terminal": True, "user": {"uid": 0, "gid": 0}, "args": ["sh"], "cwd": "/",
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]},
    "root": {"path": "rootfs", "readonly": True},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}],
    "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
}  # fmt: skip


def test_the_bundle_shares_the_hosts_namespaces_and_mounts_the_shared_folders(tmp_path):
    image = _image_bundle(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    oci.configure(image, [str(shared)], uid=1234)
    config = json.loads((image / "config.json").read_text())
    # one unpacked image for every step, read-only; Slurm points the root at BUNDLE/rootfs
    assert config["root"] == {"path": "rootfs", "readonly": True}
    # only a mount namespace: the host's network, hostname, pids and IPC (CUDA IPC, Ray)
    assert config["linux"]["namespaces"] == [{"type": "mount"}] and "hostname" not in config
    mounts = {m["destination"]: m for m in config["mounts"]}
    for host_dir in ("/tmp", "/dev/shm", str(shared)):  # Ray's sockets, its object store
        assert mounts[host_dir]["source"] == host_dir and mounts[host_dir]["type"] == "bind"
    for private in ("/root", "/home", "/var/tmp"):
        assert mounts[private]["type"] == "tmpfs"
    assert "/proc" in mounts  # runc's own mounts stay
    if Path("/etc/hosts").is_file():  # the host's names: torchrun resolves the node's name
        assert mounts["/etc/hosts"]["options"] == ["rbind", "ro"]
    assert sum(m["destination"] == "/dev/shm" for m in config["mounts"]) == 1
    process = config["process"]
    assert process["user"] == {"uid": 1234, "gid": 1234} and process["terminal"] is False
    assert process["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 20000, "soft": 20000}]
    assert "PATH=/opt/venv/bin:/usr/bin" in process["env"]
    # configuring again starts from runc's default, not from the last result
    oci.configure(image, [], uid=1234)
    again = {m["destination"] for m in json.loads((image / "config.json").read_text())["mounts"]}
    assert str(shared) not in again and "/tmp" in again


def test_a_job_whose_folders_the_containers_cannot_see_is_refused(tmp_path):
    image = _image_bundle(tmp_path)
    shared = tmp_path / "shared"
    (shared / "model").mkdir(parents=True)
    oci.configure(image, [str(shared)])
    oci.check_visible(image, [str(shared / "model"), "/tmp/seed-jobs"])  # under its mounts
    with pytest.raises(oci.BundleError, match="would not see") as err:
        oci.check_visible(image, [str(shared / "model"), "/srv/games"])
    assert "/srv/games" in str(err.value) and "\n" not in str(err.value)


def test_a_bundle_that_cannot_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(oci.BundleError, match=r"no config\.json"):
        oci.check_bundle(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(oci.BundleError, match="not a megatron-seed image"):
        oci.check_bundle(tmp_path)
    image = _image_bundle(tmp_path / "ok")
    with pytest.raises(oci.BundleError, match="do not exist on this machine"):
        oci.configure(image, ["/no/such/folder"])


def test_the_rehearsal_cluster_writes_oci_conf_beside_slurm_conf(tmp_path):
    from launch.local_cluster import LocalCluster, write_config

    cluster = LocalCluster(tmp_path)
    write_config(cluster)
    conf = (tmp_path / "oci.conf").read_text()
    for key in ("RunTimeQuery", "RunTimeKill", "RunTimeDelete", "RunTimeRun"):
        assert f"{key}=" in conf  # Slurm ignores --container without all four
    assert "run %n.%u.%j.%s.%t -b %b" in conf and f"--root={tmp_path}/oci-state" in conf


def test_provenance_is_recorded_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(provenance.ENV, raising=False)
    assert provenance.record("trainer-rank0") is None
    monkeypatch.setenv(provenance.ENV, str(tmp_path / "prov"))
    path = provenance.record("trainer-rank0")
    data = json.loads(path.read_text())
    assert path.name == f"trainer-rank0-{data['node']}-{os.getpid()}.json"
    marker = Path("/etc/megatron-seed-image")  # present inside the image only
    assert data["image"] == (json.loads(marker.read_text()) if marker.is_file() else None)
    root = os.stat("/")
    assert (data["root"]["device"], data["root"]["inode"]) == (root.st_dev, root.st_ino)
    assert data["namespaces"]["ipc"] == os.readlink("/proc/self/ns/ipc")
    assert data["root"]["mount"]  # 'SOURCE FSTYPE' of /


def test_inside_a_slurm_container_the_node_comes_from_its_name(monkeypatch):
    """Slurm 22.05 gives an OCI container no SLURMD_NODENAME; runc names its cgroup after
    the container, which oci.conf names NODE.USER.JOB.STEP.TASK."""
    from megatron_seed.hosts import container_node

    cgroup = "9:name=systemd:/n2.root.8.0.1\n8:pids:/n2.root.8.0.1\n"
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    assert container_node(cgroup) == "n2"
    assert container_node("0::/gpu-node.cluster.org.alice.8.3.0\n") == "gpu-node.cluster.org"
    assert container_node("0::/user.slice/session-3.scope\n") is None  # not a container
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    assert container_node(cgroup) is None  # another job's container name
    monkeypatch.delenv("SLURM_JOB_ID")
    assert container_node(cgroup) is None
