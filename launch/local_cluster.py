"""A real Slurm cluster of N nodes on this one machine, for rehearsing multi-node launches.

    python -m launch.local_cluster up DIR [--nodes 2] [--gpus 2]   # or tools/local_cluster.sh
    export SLURM_CONF=DIR/slurm.conf                                 # then sbatch, seed launch
    python -m launch.local_cluster kill-node DIR n2                  # a node dies
    python -m launch.local_cluster up DIR                            # ... and comes back
    python -m launch.local_cluster down DIR

Debian's slurm-wlm and munge (installed with apt-get when missing and running as root): one
munged and one slurmctld, and one slurmd per node (`slurmd -N n1`, `-N n2`, ... on distinct
ports, all on localhost). Each node has `--gpus` GPU GRES backed by empty placeholder files,
so jobs asking `--gpus-per-node` schedule; nothing sees a real device. Everything lives in
DIR (configuration, state, logs, the munge key and socket), and `down` stops by pid exactly
the daemons `up` started. `up` is idempotent: it starts what is not running (a node killed
with `kill-node` rejoins) and waits until every node is idle.

`kill-node` simulates losing a machine: SIGKILL to the node's slurmd, its job steps
(`slurmstepd`) and every process of this cluster's jobs running on it (`SLURMD_NODENAME`,
`SLURM_CONF`): the job's tasks, a Ray raylet started there and the Ray workers it spawned.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol")
# "ROOT:NODE" in the environment of a node's slurmd and its slurmstepd processes
NODE_MARK = "SEED_LOCAL_NODE"


class ClusterError(RuntimeError):
    """The local cluster could not be set up; one line."""


@dataclass(frozen=True)
class LocalCluster:
    """Paths and shape of one local cluster (all files under `root`)."""

    root: Path
    nodes: int = 2
    gpus: int = 2
    port: int = 17100  # slurmctld; node i listens on port + i

    @property
    def conf(self) -> Path:
        """The slurm.conf clients use (`SLURM_CONF`)."""
        return self.root / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        """n1, n2, ..."""
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def env(self) -> dict[str, str]:
        """This environment with the cluster's `SLURM_CONF`."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def pid_file(self, name: str) -> Path:
        """Where the pid of daemon `name` (munged, slurmctld, slurmd-n1, ...) is kept."""
        return self.root / "pids" / f"{name}.pid"


def install(runner: str = "apt-get") -> None:
    """Install slurm-wlm and munge from Debian when their commands are missing."""
    if all(shutil.which(d) for d in DAEMONS):
        return
    if os.geteuid() != 0:
        raise ClusterError(
            "slurm-wlm and munge are not installed; as root: apt-get install -y slurm-wlm munge"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        [runner, "update", "-q"],
        [runner, "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"],
    ):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise ClusterError(f"{' '.join(cmd)} failed: {' '.join(tail)}")


def write_config(cluster: LocalCluster) -> None:
    """slurm.conf, gres.conf, oci.conf, the placeholder GPU files and the munge key under
    `root`."""
    root = cluster.root
    for sub in ("state", "spool", "log", "pids", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(cluster.gpus):
        (root / f"fakegpu{i}").touch()
    key = root / "munge" / "munge.key"
    if not key.is_file():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (root / "munge").chmod(0o700)
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    lines = [
        "# written by launch.local_cluster",
        "ClusterName=seedlocal",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={cluster.port}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/pids/slurmctld.daemon.pid",
        f"SlurmdPidFile={root}/pids/slurmd.%n.daemon.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",  # a node that died rejoins when its slurmd registers again
        # a node silent this long is DOWN and its jobs requeued: room for a busy 2-core
        # machine's slurmd (real clusters often use 300 s)
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=10",
        "MinJobAge=600",  # finished jobs stay visible to scontrol for 10 minutes
        "GresTypes=gpu",
    ]
    for i, name in enumerate(cluster.node_names, start=1):
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 "
            f"Port={cluster.port + i} CPUs={cpus} Gres=gpu:{cluster.gpus} State=UNKNOWN"
        )
    nodes = f"n[1-{cluster.nodes}]" if cluster.nodes > 1 else "n1"
    lines.append(f"PartitionName=local Nodes={nodes} Default=YES MaxTime=INFINITE State=UP")
    cluster.conf.write_text("\n".join(lines) + "\n")
    shape = {"nodes": cluster.nodes, "gpus": cluster.gpus, "port": cluster.port}
    (root / "cluster.json").write_text(json.dumps(shape) + "\n")
    files = f"{root}/fakegpu[0-{cluster.gpus - 1}]" if cluster.gpus > 1 else f"{root}/fakegpu0"
    (root / "gres.conf").write_text(f"NodeName={nodes} Name=gpu File={files}\n")
    # Slurm's OCI containers (`srun --container`, `seed launch --container-bundle`) through
    # runc; every node reads it beside slurm.conf (here all nodes share this folder)
    from launch.oci import oci_conf

    (root / "oci.conf").write_text(oci_conf(state_dir=f"{root}/oci-state"))


def up(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    """Install if needed, write the configuration, start what is not running, wait for idle."""
    install()
    write_config(cluster)
    root = cluster.root
    sock = f"{root}/munge/munge.socket"
    _start(
        cluster,
        "munged",
        [
            "munged",
            "-F",
            "--force",
            f"--socket={sock}",
            f"--key-file={root}/munge/munge.key",
            f"--pid-file={root}/pids/munged.daemon.pid",
            f"--log-file={root}/log/munged.log",
            f"--seed-file={root}/munge/munged.seed",
        ],
    )
    _wait_for(lambda: Path(sock).exists(), 10.0, "munged did not open its socket")
    _start(cluster, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(cluster.conf)])
    _wait_for(lambda: _scontrol_ok(cluster), 20.0, "slurmctld does not answer")
    for name in cluster.node_names:
        _start(
            cluster,
            f"slurmd-{name}",
            ["slurmd", "-D", "-N", name, "-f", str(cluster.conf)],
            extra_env={NODE_MARK: f"{root}:{name}"},
        )
    _wait_for(lambda: _all_idle(cluster), timeout_s, lambda: f"nodes not idle: {_states(cluster)}")


def down(cluster: LocalCluster) -> list[str]:
    """Cancel the cluster's jobs and stop the daemons `up` started (by pid); their names."""
    if _alive(cluster, "slurmctld"):
        with contextlib.suppress(ClusterError):
            cancel_jobs(cluster, 20.0)
    stopped = []
    names = [f"slurmd-{n}" for n in cluster.node_names] + ["slurmctld", "munged"]
    for name in names:
        if _stop(cluster, name):
            stopped.append(name)
    return stopped


def cancel_jobs(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    """scancel every job of the cluster and wait until the queue is empty (`ClusterError`
    when it is not within `timeout_s`)."""
    subprocess.run(["scancel", "--full", "--user", "root"], env=cluster.env(), check=False)
    _wait_for(lambda: not _jobs(cluster), timeout_s, "jobs still running")


def kill_node(cluster: LocalCluster, node: str) -> list[int]:
    """SIGKILL a node's slurmd, its steps and its jobs' processes, those in containers too
    (a lost machine); the pids."""
    if node not in cluster.node_names:
        raise ClusterError(f"no node {node!r} in this cluster ({', '.join(cluster.node_names)})")
    pids, mark = [], f"{cluster.root}:{node}"
    pid = _read_pid(cluster, f"slurmd-{node}")
    if pid is not None:
        pids.append(pid)
    for proc, environ in _processes():
        ours = "SLURM_JOB_ID" in environ and environ.get("SLURM_CONF") == str(cluster.conf)
        if environ.get(NODE_MARK) == mark or (
            ours and (environ.get("SLURMD_NODENAME") or _container_node(proc, environ)) == node
        ):
            pids.append(proc)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return sorted(set(pids))


def _container_node(pid: int, environ: dict[str, str]) -> str | None:
    """The node of a process in one of Slurm's OCI containers (no SLURMD_NODENAME there:
    `megatron_seed.hosts.container_node`)."""
    from megatron_seed.hosts import container_node

    try:
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    return container_node(cgroup, environ.get("SLURM_JOB_ID"))


def job_processes(job_id: str) -> list[int]:
    """Pids of live processes started under Slurm job `job_id` (they carry SLURM_JOB_ID)."""
    return [pid for pid, env in _processes() if env.get("SLURM_JOB_ID") == str(job_id)]


def _processes() -> Iterator[tuple[int, dict[str, str]]]:
    """(pid, environment) of every readable process except this one."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
        yield (
            int(entry.name),
            {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs},
        )


def _start(
    cluster: LocalCluster, name: str, argv: list[str], extra_env: dict[str, str] | None = None
) -> None:
    if _alive(cluster, name):
        return
    log = open(cluster.root / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**cluster.env(), **(extra_env or {})},
        start_new_session=True,  # outlives `up`; `down` stops it by pid
    )
    log.close()
    cluster.pid_file(name).write_text(f"{proc.pid}\n")
    time.sleep(0.3)
    if proc.poll() is not None:
        tail = (cluster.root / "log" / f"{name}.stdout").read_text(errors="replace")
        raise ClusterError(f"{name} exited at start: {' '.join(tail.split()[-30:])}")


def _read_pid(cluster: LocalCluster, name: str) -> int | None:
    path = cluster.pid_file(name)
    if not path.is_file():
        return None
    try:
        return int(path.read_text().strip())
    except ValueError:
        return None


def _alive(cluster: LocalCluster, name: str) -> bool:
    pid = _read_pid(cluster, name)
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _stop(cluster: LocalCluster, name: str, grace_s: float = 10.0) -> bool:
    pid = _read_pid(cluster, name)
    if pid is None or not _alive(cluster, name):
        cluster.pid_file(name).unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(cluster, name) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(cluster, name):
        os.kill(pid, signal.SIGKILL)
    cluster.pid_file(name).unlink(missing_ok=True)
    return True


def _scontrol(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scontrol", *args], env=cluster.env(), capture_output=True, text=True, timeout=20
    )


def _scontrol_ok(cluster: LocalCluster) -> bool:
    return _scontrol(cluster, "ping").returncode == 0


def _states(cluster: LocalCluster) -> dict[str, str]:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], env=cluster.env(), capture_output=True, text=True
    ).stdout
    return dict(line.split(None, 1) for line in out.strip().splitlines() if " " in line)


def _all_idle(cluster: LocalCluster) -> bool:
    states = _states(cluster)
    for name, state in states.items():
        if state.rstrip("*") == "down" and _alive(cluster, f"slurmd-{name}"):
            _scontrol(cluster, "update", f"nodename={name}", "state=resume")
    return len(states) == cluster.nodes and all(s == "idle" for s in states.values())


def _jobs(cluster: LocalCluster) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True
    ).stdout
    return out.split()


def _wait_for(cond: Callable[[], bool], timeout_s: float, what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() >= deadline:
            raise ClusterError(what() if callable(what) else what)
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """`up | down | kill-node NODE` on the cluster in DIR."""
    parser = argparse.ArgumentParser(
        prog="python -m launch.local_cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("up", "down", "kill-node"))
    parser.add_argument("dir", help="folder for the cluster's configuration, state and logs")
    parser.add_argument("node", nargs="?", help="kill-node: the node (n1, n2, ...)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=2, help="GPU GRES per node (placeholders)")
    parser.add_argument("--port", type=int, default=17100, help="slurmctld's port")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.gpus < 1:
        parser.error("--nodes and --gpus must be >= 1")
    root = Path(args.dir).resolve()
    cluster = LocalCluster(root, args.nodes, args.gpus, args.port)
    if args.action != "up" and (root / "cluster.json").is_file():  # the shape `up` wrote
        cluster = LocalCluster(root, **json.loads((root / "cluster.json").read_text()))
    try:
        if args.action == "up":
            start = time.monotonic()
            up(cluster)
            print(
                f"{cluster.nodes} nodes idle in {time.monotonic() - start:.1f} s; "
                f"export SLURM_CONF={cluster.conf}"
            )
        elif args.action == "down":
            stopped = down(cluster)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        else:
            if not args.node:
                parser.error("kill-node needs the node's name")
            pids = kill_node(cluster, args.node)
            print(f"{args.node}: killed {len(pids)} process(es)")
    except ClusterError as err:
        print(f"local_cluster: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
