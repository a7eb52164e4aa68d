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


def test_the_jobs_bundle_shares_the_hosts_namespaces_and_mounts_its_folders(tmp_path):
    image = _image_bundle(tmp_path)
    job, model = tmp_path / "jobs", tmp_path / "model"
    job.mkdir(), model.mkdir()
    out = oci.write_job_bundle(image, job / "oci" / "b1", [(str(job), str(job)),
                                                          (str(model), "/model")], uid=1234)  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    # one unpacked image for every step: its rootfs by absolute path, read-only
    assert config["root"] == {"path": str(image / "rootfs"), "readonly": True}
    # only a mount namespace: the host's network, hostname, pids and IPC (CUDA IPC, Ray)
    assert config["linux"]["namespaces"] == [{"type": "mount"}]
    mounts = {m["destination"]: m for m in config["mounts"]}
    for host_dir in ("/tmp", "/dev/shm"):  # Ray's session sockets and object store
        assert mounts[host_dir]["source"] == host_dir and mounts[host_dir]["type"] == "bind"
    assert mounts[str(job)]["source"] == str(job) and mounts["/model"]["source"] == str(model)
    for private in ("/root", "/home", "/var/tmp"):
        assert mounts[private]["type"] == "tmpfs"
    assert "/proc" in mounts  # runc's own mounts stay
    assert sum(m["destination"] == "/dev/shm" for m in config["mounts"]) == 1
    process = config["process"]
    assert process["user"] == {"uid": 1234, "gid": 1234} and process["terminal"] is False
    assert process["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 20000, "soft": 20000}]
    assert "PATH=/opt/venv/bin:/usr/bin" in process["env"]


def test_a_bundle_that_cannot_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(oci.BundleError, match=r"no config\.json"):
        oci.check_bundle(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(oci.BundleError, match="not a megatron-seed image"):
        oci.check_bundle(tmp_path)
    image = _image_bundle(tmp_path / "ok")
    with pytest.raises(oci.BundleError, match="do not exist on this machine"):
        oci.write_job_bundle(image, tmp_path / "job", [("/no/such/folder", "/data")])


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
    assert data["image"] is None  # this machine is not the image
    root = os.stat("/")
    assert (data["root"]["device"], data["root"]["inode"]) == (root.st_dev, root.st_ino)
    assert data["namespaces"]["ipc"] == os.readlink("/proc/self/ns/ipc")
    assert data["root"]["mount"]  # 'SOURCE FSTYPE' of /
