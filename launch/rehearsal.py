"""Rehearse the multi-node path on this machine and measure it.

    python -m launch.rehearsal DIR [--skip-node-loss] [--world W --recipe NAME]
                                   [--container-bundle BUNDLE]

Brings up a two-node Slurm cluster in DIR (`launch.local_cluster`), takes a world (W/model,
an HF checkpoint, and W/games, its tasks; default: the test bed's tiny world written to
DIR/world), runs `seed launch RECIPE --executor slurm --nodes 2 --wait` (default recipe
tiny: one trainer rank and one engine per node), then the same with node n2 killed during update 2 and the rerun that resumes, and
stops the cluster. Prints what each component took to start, the seconds per phase of each
update, and the failure's detection time; writes them to DIR/rehearsal.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launch.local_cluster import LocalCluster, down, kill_node, up

SUBMITTED = re.compile(r"submitted job (\d+) \(experiment \S+; logs in (\S+)\)")
# lines the job writes (launch.ray_health, megatron_seed.pipeline.stage2, launch.follow)
STARTUP = {
    "ray_head_s": re.compile(r"ray_health: ready: 1 nodes, [\d.]+ GPUs after ([\d.]+) s"),
    "ray_cluster_s": re.compile(r"ray_health: ready: 2 nodes, [\d.]+ GPUs after ([\d.]+) s"),
    "trainer_build_s": re.compile(r"trainer rank 0/\d+ on node \S+: trainer built in ([\d.]+) s"),
    "fleet_and_env_workers_s": re.compile(r"fleet: .* \(up in ([\d.]+) s\)"),
}
# `seed launch --wait`'s state changes, seconds after submission
FOLLOW = {
    "running_after_s": re.compile(r"job \d+: RUNNING on \S+ \(\+(\d+) s\)"),
    "ended_after_s": re.compile(r"job \d+: (?:COMPLETED|COMPLETING|FAILED) \(\+(\d+) s\)"),
}


@dataclass
class Finished:
    """One `seed launch --wait` run: its exit code, output, Slurm job id and job log text."""

    code: int
    output: str
    job_id: str
    logs: str
    wall_s: float


def launch_two_nodes(
    cluster: LocalCluster,
    world: Path,
    job_dir: Path,
    out: Path,
    recipe: str = "tiny",
    bundle: Path | None = None,
) -> subprocess.Popen:
    """Start `seed launch RECIPE --executor slurm --nodes 2 --wait` on the cluster with the
    world's model and games; `bundle`: every step in that image (`--container-bundle`),
    else on this machine's Python."""
    bin_dir = Path(sys.executable).parent
    env = {
        **cluster.env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "SEED_MODEL_DIR": str(world / "model"),
        "SEED_GAMES_DIR": str(world / "games"),
        "SEED_OUT_DIR": str(out),
    }
    argv = [
        sys.executable, "-m", "megatron_seed.cli", "launch", recipe, "--executor", "slurm",
        "--nodes", "2", "--wait", "--job-dir", str(job_dir),
    ]  # fmt: skip
    if bundle is None:
        argv += ["--env-setup", f"export PATH={bin_dir}:$PATH"]
    else:
        argv += ["--container-bundle", str(bundle)]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen, timeout: float, started: float) -> Finished:
    """Wait for a launch; its job id and the job's log text."""
    output, _ = proc.communicate(timeout=timeout)
    wall = time.monotonic() - started
    found = SUBMITTED.search(output)
    if not found:
        raise RuntimeError(f"no job was submitted:\n{output[-3000:]}")
    job_id, folder = found.group(1), Path(found.group(2))
    # the ranks' log (torchrun's srun step) and the batch script's (Ray bring-up)
    paths = sorted(folder.rglob(f"log-*_{job_id}_*")) + sorted(
        folder.rglob(f"sbatch_*_{job_id}.out")
    )
    logs = "\n".join(p.read_text(errors="replace") for p in paths)
    return Finished(proc.returncode, output, job_id, logs, wall)


def steps(out: Path) -> list[int]:
    """The update numbers in OUT/metrics.jsonl, in order."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def wait_for_update(out: Path, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    """Block until OUT/metrics.jsonl has a row (update 1 done: update 2 is running)."""
    deadline = time.monotonic() + timeout
    while not steps(out):
        if proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"the launch ended before update 1 finished:\n{output[-4000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"update 1 did not finish within {timeout:g} s")
        time.sleep(0.5)


def measure(run: Finished, out: Path) -> dict[str, object]:
    """Start-up seconds of each component and per-phase seconds of each update."""
    found: dict[str, object] = {"wall_s": round(run.wall_s, 1), "exit": run.code}
    for key, pattern in STARTUP.items():
        hit = pattern.search(run.logs)
        if hit:
            found[key] = float(hit.group(1))
    for key, pattern in FOLLOW.items():
        hit = pattern.search(run.output)
        if hit:
            found[key] = float(hit.group(1))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    found["updates"] = {
        r["step"]: {k.removeprefix("time/"): round(v, 2) for k, v in r.items()
                    if k.startswith("time/")}
        for r in rows
    }  # fmt: skip
    return found


def rehearse(
    root: Path,
    node_loss: bool = True,
    world: Path | None = None,
    recipe: str = "tiny",
    bundle: Path | None = None,
) -> dict[str, object]:
    """The whole rehearsal of ``recipe`` on ``world`` (W/model, W/games; default the test
    bed's tiny world under ROOT/world), in the image of ``bundle`` if given; returns (and
    writes) the measurements."""
    if world is None:
        from megatron_seed.testbed.tiny_world import make_tiny_world  # the default world only

        world = make_tiny_world(root / "world")
    if not (world / "model").is_dir() or not (world / "games").is_dir():
        raise FileNotFoundError(f"a world needs {world}/model and {world}/games")
    cluster = LocalCluster(root / "cluster")
    t = time.monotonic()
    up(cluster)
    result: dict[str, object] = {"cluster_up_s": round(time.monotonic() - t, 1)}
    try:
        out = root / "out-clean"
        t = time.monotonic()
        run = finish(launch_two_nodes(cluster, world, root / "jobs", out, recipe, bundle), 900, t)
        result["clean"] = measure(run, out)
        print(f"clean run: exit {run.code} in {run.wall_s:.0f} s", flush=True)
        if node_loss:
            out = root / "out-node-loss"
            t = time.monotonic()
            proc = launch_two_nodes(cluster, world, root / "jobs", out, recipe, bundle)
            wait_for_update(out, proc)
            lost = time.monotonic()
            kill_node(cluster, "n2")
            run = finish(proc, 600, t)
            result["node_loss"] = {
                "exit": run.code,
                "detected_s": round(time.monotonic() - lost, 1),
                "summary": next(
                    (ln for ln in run.output.splitlines() if ln.startswith(f"job {run.job_id} ")),
                    "",
                ),
            }
            t = time.monotonic()
            up(cluster)
            result["node_back_s"] = round(time.monotonic() - t, 1)
            t = time.monotonic()
            run = finish(
                launch_two_nodes(cluster, world, root / "jobs", out, recipe, bundle), 900, t
            )
            result["resumed"] = {**measure(run, out), "steps": steps(out)}
            print(f"resumed run: exit {run.code} in {run.wall_s:.0f} s", flush=True)
    finally:
        down(cluster)
    (root / "rehearsal.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the rehearsal in DIR and print its measurements."""
    parser = argparse.ArgumentParser(prog="python -m launch.rehearsal", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("dir")
    parser.add_argument("--skip-node-loss", action="store_true")
    parser.add_argument("--world", default=None, help="W/model + W/games (default: tiny)")
    parser.add_argument("--recipe", default="tiny", help="the recipe `seed launch` runs")
    parser.add_argument(
        "--container-bundle", default=None, help="run every step in this image (OCI bundle)"
    )
    args = parser.parse_args(argv)
    world = Path(args.world).resolve() if args.world else None
    root = Path(args.dir).resolve()
    bundle = Path(args.container_bundle).resolve() if args.container_bundle else None
    result = rehearse(root, not args.skip_node_loss, world, args.recipe, bundle)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
