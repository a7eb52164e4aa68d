"""`seed launch RECIPE --executor {local,slurm} --nodes N [--dryrun]`.

Validates the recipe, layout and memory before anything starts (one-line errors, exit 2).
`--dryrun` prints the generated job script and submits nothing. Without it, `slurm` submits
with sbatch (on this login node, or over `--ssh`) and prints the job id; with `--wait` it
follows the job and exits 0 only if it COMPLETED (Ctrl-C cancels the job). `local` runs
torchrun here, waits, and exits non-zero unless the job SUCCEEDED.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from launch.layout import (
    GIB,
    HOST_PHASES,
    colocated_memory_gib,
    node_host_memory_gib,
    object_store_gib,
    trainer_memory_gib,
)
from launch.plan import PROFILE_NODE_KEYS, JobCommand, LaunchPlan, PlanError, make_plan
from megatron_seed import recipes
from megatron_seed.errors import CommandError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `seed launch`."""
    parser.add_argument("recipe", help=f"one of: {', '.join(recipes.RECIPES)}")
    parser.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="torchrun here, or a Slurm job (sbatch)",
    )
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the job")
    parser.add_argument(
        "--dryrun", action="store_true", help="print the job script, submit nothing"
    )
    lay = parser.add_argument_group("layout overrides (default: the recipe's)")
    lay.add_argument("--tp", type=int, help="trainer tensor parallel size")
    lay.add_argument("--pp", type=int, help="trainer pipeline parallel size")
    lay.add_argument("--gpus-per-node", type=int, help="GPUs on each node")
    lay.add_argument("--fleet-gpus", type=int, help="fleet GPUs in total (split evenly over nodes)")
    lay.add_argument("--engine-tp", type=int, help="GPUs per vLLM engine")
    lay.add_argument(
        "--colocate",
        action="store_true",
        help="engines share every GPU with the trainer, sleeping while it trains "
        "(fleet.colocate, CUDA IPC weight transfer)",
    )
    lay.add_argument("--config-json", help="SeedConfig overrides as JSON, e.g. '{\"updates\": 50}'")
    lay.add_argument(
        "--job",
        help="run this under torchrun instead of `seed train`: 'MODULE args' or 'SCRIPT.py args' "
        "(a torchrun-aware program: it joins the ranks torchrun starts)",
    )
    paths = parser.add_argument_group("paths the job reads (on the cluster's filesystem)")
    paths.add_argument("--model", default=None, help="HF checkpoint (default: $SEED_MODEL_DIR)")
    paths.add_argument("--games", default=None, help="game folder (default: $SEED_GAMES_DIR)")
    paths.add_argument("--out", default=None, help="run folder (default: $SEED_OUT_DIR)")
    slurm = parser.add_argument_group("slurm")
    slurm.add_argument(
        "--job-dir", default="~/seed-jobs", help="job folder on the shared filesystem"
    )
    slurm.add_argument(
        "--cluster-profile",
        help="JSON file of slurm settings (partition, nccl_socket_ifname, nccl_ib_hca, ...) "
        "and of the nodes (node_type: dgx-h100 or dgx-h200; host_memory_gib)",
    )
    slurm.add_argument("--nccl-socket-ifname", help="NCCL_SOCKET_IFNAME, e.g. ib0")
    slurm.add_argument("--nccl-ib-hca", help="NCCL_IB_HCA, e.g. mlx5_0,mlx5_1")
    slurm.add_argument("--account", help="Slurm account (sbatch --account)")
    slurm.add_argument("--partition", help="Slurm partition (sbatch --partition)")
    slurm.add_argument("--time", default="04:00:00", help="Slurm time limit (HH:MM:SS)")
    slurm.add_argument("--container-image", help="pyxis/enroot image; omit for bare metal")
    slurm.add_argument(
        "--container-bundle",
        help="the image as an OCI bundle (tools/local_image.sh bundle): Slurm's srun --container",
    )
    slurm.add_argument("--mount", action="append", default=[], help="SRC:DST container mount")
    slurm.add_argument(
        "--env-setup", help="bare metal: shell line run first, e.g. 'source VENV/bin/activate'"
    )
    slurm.add_argument("--ssh", help="USER@HOST of a Slurm login node (default: sbatch here)")
    slurm.add_argument(
        "--package-code", action="store_true", help="ship this checkout's HEAD with the job"
    )
    slurm.add_argument(
        "--wait",
        action="store_true",
        help="follow the job to its end: exit 0 only if it COMPLETED; Ctrl-C cancels it",
    )


def run(args: argparse.Namespace) -> int:
    """Validate, then print (`--dryrun`), submit (slurm) or run and wait (local)."""
    plan = _plan(args)
    job = parse_job(args.job) if args.job else None
    if job is None:
        _check_paths(job_paths(args))
    if args.executor == "local":
        return _local(plan, job, args)
    return _slurm(plan, job, args)


def parse_job(text: str) -> JobCommand:
    """'MODULE args...' or 'SCRIPT.py args...' as a `JobCommand`."""
    words = shlex.split(text)
    if not words:
        raise CommandError("--job is empty")
    target, *rest = words
    return JobCommand(target, tuple(rest), is_module=not target.endswith(".py"))


def memory_summary(plan: LaunchPlan) -> str:
    """One line: the trainer's estimated GiB per GPU and the layout behind it."""
    p = plan.config.parallel
    ep = f"EP={p.ep} " if p.ep > 1 else ""
    head = (
        f"{plan.recipe.name}: {plan.nodes} node(s); trainer TP={p.tp} PP={p.pp} DP={plan.dp} "
        f"{ep}({plan.trainer_world} ranks); fleet {plan.fleet_gpus} GPU(s), engine TP="
        f"{plan.config.fleet.engine_tp} ({plan.config.fleet.engines} engines)"
    )
    if not plan.layout.on_gpu:
        return head + "; CPU job"
    reference = plan.config.algo.beta_kl > 0
    mem = trainer_memory_gib(plan.recipe.model, p, plan.dp, plan.layout, reference)
    parts = ", ".join(f"{k} {v:.1f}" for k, v in mem.items() if k != "total")
    line = f"{head}; trainer ~{mem['total']:.0f} GiB/GPU ({parts})"
    if plan.layout.colocated:
        util = plan.config.fleet.gpu_memory_utilization
        fleet = plan.config.fleet
        phases = colocated_memory_gib(
            plan.recipe.model, p, plan.dp, plan.layout, util, fleet.engine_tp,
            fleet.sync_bucket_bytes, reference,
        )  # fmt: skip
        line += (
            f"; colocated: ~{phases['train']:.0f} GiB/GPU training (engines asleep), "
            f"~{phases['sync']:.0f} syncing, "
            f"~{phases['generate']:.0f} generating (engines at {util:g})"
        )
    return line


def host_memory_table(plan: LaunchPlan) -> list[str]:
    """The busiest node's host GiB in each phase, by term (`node_host_memory_gib`): a title
    line and one line per phase; none for a CPU job."""
    if not plan.layout.on_gpu:
        return []
    lay = plan.layout
    phases = node_host_memory_gib(plan.recipe.model, plan.config, lay, plan.nodes)
    budget = lay.host_memory_gib * lay.host_memory_headroom
    lines = [
        f"host memory per node, GiB (the node of trainer rank 0; {lay.host_memory_gib:.0f} "
        f"GiB of RAM, budget {budget:.0f}):"
    ]
    for phase in HOST_PHASES:
        terms = phases[phase]
        parts = ", ".join(
            f"{k} {v:.0f}" if v >= 10 else f"{k} {v:.1f}"
            for k, v in terms.items()
            if k != "total" and v > 0
        )
        lines.append(f"  {phase:<8} {'~' + format(terms['total'], '.0f'):<6} {parts}")
    copy, store = 2 * plan.recipe.model.params / GIB, object_store_gib(lay)
    if plan.config.fleet.replay == "memory" and 2 * copy > store:
        lines.append(
            f"  the replay copy ({copy:.0f} GiB; {2 * copy:.0f} while a sync commits) outgrows "
            f"Ray's object store ({store:.0f} GiB): Ray spills the rest to the node's disk "
            '(fleet.replay "disk" keeps it all there)'
        )
    return lines


def _print_memory(plan: LaunchPlan) -> None:
    """The plan's GPU and host memory, as comments on stderr."""
    for line in [memory_summary(plan), *host_memory_table(plan)]:
        print(f"# {line}", file=sys.stderr)


def _plan(args: argparse.Namespace) -> LaunchPlan:
    if args.executor == "local" and args.nodes != 1:
        raise CommandError(f"--executor local runs on one node, got --nodes {args.nodes}")
    containers = args.container_image or args.container_bundle
    if args.executor == "local" and (containers or args.mount or args.ssh):
        raise CommandError(
            "--container-image, --container-bundle, --mount and --ssh apply to --executor slurm only"
        )
    if args.container_image and args.container_bundle:
        raise CommandError("--container-image (pyxis) and --container-bundle (OCI): choose one")
    try:
        return make_plan(
            args.recipe,
            args.nodes,
            tp=args.tp,
            pp=args.pp,
            gpus_per_node=args.gpus_per_node,
            fleet_gpus=args.fleet_gpus,
            engine_tp=args.engine_tp,
            config_json=args.config_json,
            colocate=args.colocate,
            **_profile_nodes(args.cluster_profile),
        )
    except PlanError as err:
        raise CommandError(str(err)) from None


def _profile_nodes(path: str | None) -> dict[str, Any]:
    """What a cluster profile says about its nodes (`plan.PROFILE_NODE_KEYS`), for the plan."""
    if not path:
        return {}
    from launch import slurm

    try:
        profile = slurm.read_profile(path)
    except ValueError as err:
        raise CommandError(str(err)) from None
    return {k: profile[k] for k in PROFILE_NODE_KEYS if k in profile}


def job_paths(args: argparse.Namespace) -> dict[str, str]:
    """SEED_MODEL_DIR / SEED_GAMES_DIR / SEED_OUT_DIR for the job: the flags, else this
    shell's variables (a `seed train` job reads its paths from them)."""
    import os

    given = {"SEED_MODEL_DIR": args.model, "SEED_GAMES_DIR": args.games, "SEED_OUT_DIR": args.out}
    return {k: v or os.environ[k] for k, v in given.items() if v or os.environ.get(k)}


PATH_FLAGS = {"SEED_MODEL_DIR": "--model", "SEED_GAMES_DIR": "--games", "SEED_OUT_DIR": "--out"}


def _check_paths(paths: dict[str, str]) -> None:
    """A `seed train` job needs its model, games and output folder: refuse before anything
    is rendered or queued when one is missing."""
    missing = [k for k in PATH_FLAGS if k not in paths]
    if missing:
        flags = ", ".join(f"{PATH_FLAGS[k]} (or ${k})" for k in missing)
        raise CommandError(f"the job would start without its paths: pass {flags}")


def _slurm(plan: LaunchPlan, job: JobCommand | None, args: argparse.Namespace) -> int:
    from launch import slurm

    profile: dict[str, Any] = {}
    if args.cluster_profile:
        try:
            profile = slurm.read_profile(args.cluster_profile)
        except ValueError as err:
            raise CommandError(str(err)) from None
    flags = {
        "job_dir": args.job_dir if args.job_dir != "~/seed-jobs" else None,
        "account": args.account,
        "partition": args.partition,
        "time": args.time if args.time != "04:00:00" else None,
        "container_image": args.container_image,
        "container_bundle": args.container_bundle,
        "container_mounts": tuple(args.mount) or None,
        "env_setup": args.env_setup,
        "ssh": args.ssh,
        "nccl_socket_ifname": args.nccl_socket_ifname,
        "nccl_ib_hca": args.nccl_ib_hca,
    }
    profile = {k: v for k, v in profile.items() if k not in PROFILE_NODE_KEYS}  # the plan's
    settings = {**profile, **{k: v for k, v in flags.items() if v is not None}}
    if "container_mounts" in settings:
        settings["container_mounts"] = tuple(settings["container_mounts"])
    settings["package_code"] = args.package_code or bool(settings.get("package_code"))
    settings["extra_env"] = {**settings.get("extra_env", {}), **job_paths(args)}
    opts = slurm.SlurmOptions(**settings)
    args.job_dir, args.ssh = opts.job_dir, opts.ssh
    if args.ssh and not args.job_dir.startswith("/"):
        raise CommandError(
            f"--ssh needs an absolute --job-dir on the cluster, got {args.job_dir!r}"
        )
    _print_memory(plan)
    if args.dryrun:
        with contextlib.redirect_stdout(sys.stderr):  # NeMo-Run's console chatter
            script = slurm.render(plan, opts, job)
        print(script)
        return 0
    if not args.ssh and shutil.which("sbatch") is None:
        raise CommandError(
            "sbatch not found: run on a Slurm login node, pass --ssh, or use --dryrun"
        )
    with contextlib.redirect_stdout(sys.stderr):
        sub = slurm.submit(plan, opts, job)
    print(f"submitted job {sub.job_id} (experiment {sub.experiment_id}; logs in {sub.folder})")
    if not args.wait:
        return 0
    return _wait(sub, args.ssh)


def _wait(sub: Any, ssh: str | None) -> int:
    """Follow the job; on anything but COMPLETED print why and the logs' last lines."""
    from launch.follow import follow, local_runner, log_tails, ssh_runner

    end = follow(sub.job_id, ssh_runner(ssh) if ssh else local_runner)
    print(end.summary())
    if end.succeeded:
        return 0
    if not ssh:  # the logs are on this machine's view of the shared filesystem
        for path, lines in log_tails(Path(sub.folder), sub.job_id):
            print(f"--- {path}", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)
    return 130 if end.reason == "Ctrl-C" else 1


def _local(plan: LaunchPlan, job: JobCommand | None, args: argparse.Namespace) -> int:
    from launch.local import run_local

    _print_memory(plan)
    job = job or plan.job()
    if args.dryrun:
        nproc = plan.layout.trainer_ranks_per_node
        print(shlex.join(["torchrun", "--standalone", "--nproc-per-node", str(nproc), *job.argv()]))
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        outcome = run_local(plan, job, env=job_paths(args))
    print(f"job {outcome.state}: logs under {outcome.job_dir}")
    if not outcome.succeeded:
        for log in outcome.logs():
            print(f"--- {log}", file=sys.stderr)
            print("\n".join(log.read_text(errors="replace").splitlines()[-20:]), file=sys.stderr)
        return 1
    return 0
