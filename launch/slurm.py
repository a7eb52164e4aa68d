"""Multi-node Slurm job: a Ray cluster for the fleet, then the trainer under torchrun.

NeMo-Run's `SlurmExecutor` with the `Torchrun` launcher renders the sbatch script (torchrun
rendezvous on the head node, pyxis/enroot flags when `container_image` is set). Into its
setup section we put the Ray bring-up, in this order:

1. the Ray head on the first node (background `srun --overlap`, fleet GPUs only);
2. a health wait until the head answers;
3. one Ray worker on every other node;
4. a health wait until all nodes and all fleet GPUs are registered (or the job exits 1).

Then NeMo-Run's `srun ... torchrun ...` step starts the trainer ranks with `RAY_ADDRESS` set.
Each node's first `trainer_ranks_per_node` GPUs are the trainer's (local rank = device), the
next `fleet_gpus_per_node` the Ray worker's (`CUDA_VISIBLE_DEVICES` and `--num-gpus` on
`ray start`: the engines' placement groups take them); colocated, the Ray worker gets every
GPU of the node, which the trainer ranks use too. Ray token authentication uses a
random per-job token exported to every step. Every step also gets `job_env`: NCCL's network
(`NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`, from a cluster profile or flags), async error handling
and a collective timeout, the port of the trainer -> engines weight group, and the model,
games and output paths (`seed launch --model/--games/--out`; with `--ssh` too, since the
login node's environment is not the job's). The Ray steps and the torchrun step are separate
pyxis containers on each node; enroot gives containers no IPC namespace of their own, so
CUDA IPC between engines and trainer ranks of one node (colocated mode) crosses them, as it
does with Docker's `--ipc=host`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.plan import PROFILE_NODE_KEYS, JobCommand, LaunchPlan

JOB_NAME = "train"


@dataclass(frozen=True)
class SlurmOptions:
    """Cluster-side settings of a Slurm launch (nothing here changes the training)."""

    job_dir: str = "~/seed-jobs"  # on the cluster's shared filesystem
    account: str | None = None
    partition: str | None = None
    time: str = "04:00:00"
    container_image: str | None = None  # pyxis/enroot image; None: bare metal
    container_mounts: tuple[str, ...] = ()  # SRC:DST (SRC alone: the same path inside)
    container_bundle: str | None = None  # the image as an OCI bundle (Slurm's `--container`)
    env_setup: str | None = None  # bare metal: e.g. "source /shared/seed/.venv/bin/activate"
    ssh: str | None = None  # user@host of a login node; None: sbatch on this machine
    package_code: bool = False  # ship this git checkout (HEAD) instead of the installed package
    ray_port: int = 6379
    rdzv_port: int = 29500
    ray_timeout_s: int = 900
    extra_env: dict[str, str] = field(default_factory=dict)
    # the cluster's network (a cluster profile): NCCL's interface and InfiniBand adapters
    nccl_socket_ifname: str | None = None  # e.g. "ib0" or "^lo,docker"
    nccl_ib_hca: str | None = None  # e.g. "mlx5_0,mlx5_1"
    nccl_timeout_s: int = 1800  # a collective that waits longer fails the rank (not a hang)
    weight_sync_port: int = 29650  # trainer rank 0 <-> engines NCCL group (+1 per rebuild)


def job_env(opts: SlurmOptions) -> dict[str, str]:
    """The environment every step of the job gets (the sbatch script exports it): NCCL's
    network and failure settings, the weight-group port, in a container the folder where
    every process records where it ran (`megatron_seed.provenance`), then `extra_env`
    (paths)."""
    env = {
        # a failed or timed-out collective aborts its communicator and the rank exits,
        # instead of every rank waiting forever
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "SEED_NCCL_TIMEOUT_S": str(opts.nccl_timeout_s),
        "SEED_WEIGHT_SYNC_PORT": str(opts.weight_sync_port),
    }
    if opts.nccl_socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = opts.nccl_socket_ifname
        if not opts.nccl_socket_ifname.startswith("^"):  # gloo takes names, not exclusions
            env["GLOO_SOCKET_IFNAME"] = opts.nccl_socket_ifname.lstrip("=").split(",")[0]
    if opts.nccl_ib_hca:
        env["NCCL_IB_HCA"] = opts.nccl_ib_hca
    if opts.container_image or opts.container_bundle:
        env["SEED_PROVENANCE_DIR"] = f"{_job_dir(opts)}/provenance"
    return {**env, **opts.extra_env}


def read_profile(path: str) -> dict[str, Any]:
    """A cluster profile (JSON): defaults for `SlurmOptions` fields, e.g.
    {"partition": "gpu", "nccl_socket_ifname": "ib0", "nccl_ib_hca": "mlx5"}, and what its
    nodes are (`plan.PROFILE_NODE_KEYS`: {"node_type": "dgx-h200"}, {"host_memory_gib": 1024})."""
    import dataclasses
    import json

    known = {f.name for f in dataclasses.fields(SlurmOptions)} | set(PROFILE_NODE_KEYS)
    try:
        profile = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cluster profile {path}: {err}") from None
    if not isinstance(profile, dict):
        raise ValueError(f"cluster profile {path}: a JSON object expected, got {profile!r:.60}")
    if not set(profile) <= known:
        bad = sorted(set(profile) - known)
        raise ValueError(f"cluster profile {path}: unknown keys {bad}; known: {sorted(known)}")
    for key, value in profile.items():
        if (want := _profile_type(key)) and not _is(value, want):
            raise ValueError(f"cluster profile {path}: {key} must be {want}, got {value!r:.60}")
    return profile


# what a profile's value must be, by the type of its `SlurmOptions` field (and node keys)
_PROFILE_TYPES = {
    "str": "a string",
    "str | None": "a string",
    "int": "an integer",
    "bool": "true or false",
    "tuple[str, ...]": "a list of strings",
    "dict[str, str]": "an object of strings",
    "node_type": "a string",
    "host_memory_gib": "a number",
}


def _profile_type(key: str) -> str | None:
    """What a profile's ``key`` holds, in words (None: not checked)."""
    import dataclasses

    fields = {f.name: str(f.type) for f in dataclasses.fields(SlurmOptions)}
    return _PROFILE_TYPES.get(fields.get(key, key))


def _is(value: Any, want: str) -> bool:
    """Whether ``value`` (read from JSON) is ``want`` (`_PROFILE_TYPES`' words)."""
    if want == "a string":
        return isinstance(value, str)
    if want == "an integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if want == "a number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if want == "true or false":
        return isinstance(value, bool)
    if want == "a list of strings":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def container_flags(opts: SlurmOptions) -> list[str]:
    """Container flags of the Ray steps: pyxis's (the torchrun step gets NeMo-Run's own), or
    Slurm's OCI `--container` with the job's bundle (the torchrun step too)."""
    if opts.container_image and opts.container_bundle:
        raise ValueError("--container-image (pyxis) and --container-bundle (OCI): choose one")
    if opts.container_bundle:
        return [f"--container={opts.container_bundle}"]
    if opts.container_image is None:
        return []
    flags = ["--container-image", opts.container_image]
    if opts.container_mounts:
        flags += ["--container-mounts", ",".join(opts.container_mounts)]
    return flags


def job_folders(opts: SlurmOptions) -> list[str]:
    """The folders a job's steps read and write: the job folder and the model, games and
    output folders."""
    keys = ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR")
    return [_job_dir(opts)] + [opts.extra_env[k] for k in keys if k in opts.extra_env]


def bundle_setup(opts: SlurmOptions) -> list[str]:
    """Setup lines of a job in Slurm's OCI containers: the steps inherit the batch script's
    environment, PATH included, so the image's PATH goes first (the image's, from its
    bundle where this machine can read it; the Dockerfile's venv otherwise)."""
    from launch.oci import image_env

    path = image_env(Path(opts.container_bundle or "")).get("PATH", "/opt/venv/bin")
    return [f'export PATH="{path}:$PATH"  # the image\'s programs inside the containers']


def check_bundle(opts: SlurmOptions) -> None:
    """Refuse, in one line, a bundle that is not the image or whose containers would not
    see the job's folders (`launch.oci.check_visible`)."""
    from launch.oci import check_bundle as check
    from launch.oci import check_visible

    check_visible(check(opts.container_bundle or ""), job_folders(opts))


def ray_setup_lines(plan: LaunchPlan, opts: SlurmOptions) -> str:
    """Bash for the sbatch setup section: Ray head, health wait, workers, health wait."""
    lay = plan.layout
    job_dir = _job_dir(opts)
    log_dir = f"{job_dir}/ray-logs"
    cflags = " ".join(shlex.quote(f) for f in container_flags(opts))
    # explicit task counts: inside the allocation srun would otherwise inherit SLURM_NTASKS
    # (all the job's tasks) and start one head or health check per task
    step = f"srun --overlap --ntasks-per-node=1 {cflags}".rstrip()
    ray_env, gpus = "", f" --num-gpus={lay.fleet_gpus_per_node}"  # a CPU job: logical GPUs
    if opts.container_bundle:
        # Slurm's OCI containers get no SLURMD_NODENAME: the raylet (and so its workers)
        # takes the node's name from its container (`megatron_seed.hosts`)
        ray_env = "python -m megatron_seed.hosts "
    ray_step = step
    if lay.on_gpu:
        first = lay.fleet_first_gpu
        devices = ",".join(str(i) for i in range(first, first + lay.fleet_gpus_per_node))
        ray_env = f"env CUDA_VISIBLE_DEVICES={devices} {ray_env}"
        # the Ray steps ask for the node's GPUs outright (shared with the trainer's step by
        # --overlap): a step's cgroup opens only its own GRES under ConstrainDevices, and
        # whether a step inherits the job's GPUs by default differs between Slurm releases
        ray_step = f"{step} --gpus-per-node={lay.gpus_per_node}"
    health = (
        f'{step} --nodes=1 --ntasks=1 -w "$head_node" python -m launch.ray_health '
        f'--address "$RAY_ADDRESS" --timeout {opts.ray_timeout_s}'
    )
    lines = [
        "",
        "# ---- megatron-seed: Ray cluster for the fleet and env workers ----",
        *([opts.env_setup] if opts.env_setup else []),
        *(bundle_setup(opts) if opts.container_bundle else []),
        f"mkdir -p {log_dir}",
        "# the head's first address (hostname --ip-address may print several); torchrun's too",
        'head_node_ip="${head_node_ip%% *}"',
        f'export RAY_ADDRESS="$head_node_ip:{opts.ray_port}"',
        "export RAY_AUTH_MODE=token",
        "# the job's own Ray folder on each node: a `ray start` in the default /tmp/ray leaves",
        "# /tmp/ray/ray_current_cluster behind, which a later plain ray.init() there tries to join",
        'ray_tmp="/tmp/ray-seed-$SLURM_JOB_ID"',
        "{ set +x; } 2>/dev/null  # keep the token out of the log",
        "export RAY_AUTH_TOKEN=\"$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')\"",
        "set -x",
        "# 1. Ray head on the first node",
        f'{ray_step} --nodes=1 --ntasks=1 -w "$head_node" --output={log_dir}/head-%j.out '
        f'{ray_env}ray start --head --block --temp-dir="$ray_tmp" --node-ip-address="$head_node_ip" '
        f"--port={opts.ray_port}{gpus} --disable-usage-stats &",
    ]
    if plan.nodes > 1:
        lines += [
            "# 2. health wait: the head answers before workers connect",
            f"{health} --nodes 1 || {{ echo 'Ray head did not come up'; exit 1; }}",
            f"# 3. Ray workers on the other {plan.nodes - 1} node(s)",
            f'{ray_step} --nodes={plan.nodes - 1} --ntasks={plan.nodes - 1} --exclude="$head_node" '
            f"--output={log_dir}/worker-%j-%t.out "
            f'{ray_env}ray start --block --temp-dir="$ray_tmp" --address="$RAY_ADDRESS"{gpus} '
            "--disable-usage-stats &",
        ]
    lines += [
        f"# 4. health wait: {plan.nodes} node(s), {plan.fleet_gpus} fleet GPU(s)",
        f"{health} --nodes {plan.nodes} --gpus {plan.fleet_gpus} "
        "|| { echo 'Ray cluster did not become healthy'; exit 1; }",
        "# ---- end of the Ray cluster; the trainer starts below ----",
    ]
    return "\n".join(lines)


def make_executor(plan: LaunchPlan, opts: SlurmOptions) -> Any:
    """The NeMo-Run `SlurmExecutor` of a plan (torchrun launcher, Ray in the setup lines)."""
    import nemo_run as run

    if opts.ssh:
        user, _, host = opts.ssh.rpartition("@")
        tunnel: Any = run.SSHTunnel(
            host=host, user=user or os.environ.get("USER", ""), job_dir=opts.job_dir
        )
    else:
        # Same folder as the Experiment's (`submit` uses job_dir as its base_dir), so the
        # sbatch script, the logs and the code dir all live on the shared filesystem.
        tunnel = run.LocalTunnel(job_dir=os.path.join(_job_dir(opts), "experiments"))
    lay = plan.layout
    env = job_env(opts)
    rdzv_id = zlib.crc32(f"{plan.recipe.name}/{plan.nodes}".encode()) % 100_000 + 1
    return run.SlurmExecutor(
        account=opts.account,
        partition=opts.partition,
        job_name_prefix=f"seed-{plan.recipe.name}-",
        time=opts.time,
        nodes=plan.nodes,
        ntasks_per_node=lay.trainer_ranks_per_node,
        gpus_per_node=lay.gpus_per_node or None,  # GRES; a CPU job's are placement slots
        exclusive=True,
        container_image=opts.container_image,
        container_mounts=list(opts.container_mounts) if opts.container_image else [],
        srun_args=container_flags(opts) if opts.container_bundle else None,
        env_vars=env,
        setup_lines=ray_setup_lines(plan, opts),
        tunnel=tunnel,
        packager=run.GitArchivePackager() if opts.package_code else run.Packager(),
        launcher=run.Torchrun(rdzv_port=opts.rdzv_port, rdzv_id=rdzv_id),
    )


def render(plan: LaunchPlan, opts: SlurmOptions, job: JobCommand | None = None) -> str:
    """The sbatch script NeMo-Run would submit (dry run: no cluster, nothing left behind)."""
    import nemo_run as run

    base = tempfile.mkdtemp(prefix="seed-dryrun-")
    try:
        exp = run.Experiment(
            f"seed-{plan.recipe.name}",
            executor=make_executor(plan, opts),
            log_level="ERROR",
            base_dir=base,
            enable_goodbye_message=False,
        )
        with exp, _stdin_from_devnull():
            exp.add((job or plan.job()).to_nemo_script(), name=JOB_NAME)
            exp.dryrun(log=False, delete_exp_dir=False)
            sbatch = Path(exp.jobs[0].executor.experiment_dir) / f"{JOB_NAME}_sbatch.sh"
            return sbatch.read_text()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass(frozen=True)
class Submitted:
    """A submitted job: NeMo-Run's experiment id, Slurm's job id, the experiment folder."""

    experiment_id: str
    job_id: str
    folder: str  # logs and the sbatch script (on the cluster's filesystem)


def submit(plan: LaunchPlan, opts: SlurmOptions, job: JobCommand | None = None) -> Submitted:
    """Submit with sbatch (here or over SSH); returns at once."""
    import nemo_run as run

    exp = run.Experiment(
        f"seed-{plan.recipe.name}",
        executor=make_executor(plan, opts),
        log_level="WARN",
        base_dir=None if opts.ssh else _job_dir(opts),
        enable_goodbye_message=False,
    )
    if opts.container_bundle:
        check_bundle(opts)
    with exp, _stdin_from_devnull():
        exp.add((job or plan.job()).to_nemo_script(), name=JOB_NAME)
        exp.run(detach=True)
        handle = exp.jobs[0]
        # the app handle is "slurm_tunnel://nemo_run/<slurm job id>"
        job_id = str(handle.handle).rstrip("/").rsplit("/", 1)[-1]
        # NeMo-Run has no public accessor for the id; `nemo experiment status ID` uses it
        return Submitted(exp._id, job_id, str(handle.executor.experiment_dir))


@contextlib.contextmanager
def _stdin_from_devnull() -> Iterator[None]:
    """NeMo-Run shells out (mkdir, sbatch) through `invoke`, which mirrors our stdin into
    the child; none of it needs input, and under pytest or CI stdin may not be readable."""
    saved = sys.stdin
    with open(os.devnull) as devnull:
        sys.stdin = devnull
        try:
            yield
        finally:
            sys.stdin = saved


def _job_dir(opts: SlurmOptions) -> str:
    return opts.job_dir if opts.ssh else os.path.expanduser(opts.job_dir)
