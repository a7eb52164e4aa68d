"""Follow a submitted Slurm job to its end (`seed launch --executor slurm --wait`).

`follow` polls `scontrol show job` (falling back to `sacct` once the controller has
forgotten a finished job), prints every state change, and returns the final `JobEnd`. Only
COMPLETED is success. A job that ended any other way is reported with its state, its reason,
the nodes of its allocation that are down now (a lost node), and the last lines of its logs.
Ctrl-C during `follow` cancels the job (`scancel`) before returning. NeMo-Run submits with
`--requeue`, so after a node failure Slurm puts the job back in the queue: `follow` reports
that attempt as failed (REQUEUED, with the lost node) and cancels the retry, so that nothing
runs behind the user's back; running the same launch again resumes from the last checkpoint.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

# Slurm's terminal job states (squeue/scontrol names)
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


def local_runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
    """Run a Slurm client command here."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


def ssh_runner(target: str) -> Runner:
    """Run Slurm client commands on a login node over SSH."""

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", target, *argv], capture_output=True, text=True, timeout=60)

    return run


@dataclass
class JobEnd:
    """How a Slurm job ended."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: str = ""
    nodes: str = ""
    lost_nodes: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """True only for COMPLETED."""
        return self.state == "COMPLETED"

    def summary(self) -> str:
        """One line: state, reason, exit code and lost nodes."""
        parts = [f"job {self.job_id} {self.state}"]
        if self.reason and self.reason != "None":
            parts.append(f"reason {self.reason}")
        if self.exit_code:
            parts.append(f"exit code {self.exit_code}")
        if self.nodes:
            parts.append(f"nodes {self.nodes}")
        if self.lost_nodes:
            parts.append(f"lost node(s): {', '.join(self.lost_nodes)}")
        return "; ".join(parts)


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output as a dict (values may contain '=' but no spaces)."""
    fields = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    return fields


def job_info(job_id: str, run: Runner = local_runner) -> dict[str, str] | None:
    """The job's scontrol record; from sacct when scontrol no longer knows it; None if unknown."""
    done = run(["scontrol", "show", "job", "-o", job_id])
    if done.returncode == 0 and "JobState=" in done.stdout:
        return parse_scontrol(done.stdout)
    done = run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobState,ExitCode,NodeList"])
    if done.returncode == 0 and done.stdout.strip():
        state, code, nodes = [*done.stdout.strip().splitlines()[0].split("|"), "", ""][:3]
        return {"JobState": state.split()[0], "ExitCode": code, "NodeList": nodes}
    return None


def down_nodes(nodes: str, run: Runner = local_runner) -> list[str]:
    """The nodes of a Slurm node list that are down, drained or not responding now."""
    if not nodes or nodes == "(null)":
        return []
    done = run(["sinfo", "-h", "-N", "-n", nodes, "-o", "%N %T"])
    lost = []
    for line in done.stdout.splitlines():
        name, _, state = line.partition(" ")
        if any(s in state for s in ("down", "drain", "fail")) or state.endswith("*"):
            lost.append(name)
    return sorted(set(lost))


def follow(
    job_id: str,
    run: Runner = local_runner,
    poll_s: float = 3.0,
    out: TextIO = sys.stderr,
    sleep: Callable[[float], None] = time.sleep,
    unknown_limit: int = 10,
) -> JobEnd:
    """Poll until the job ends; Ctrl-C cancels it. The final state, with lost nodes."""
    last, unknown, nodes, ran, restarts = "", 0, "", False, None
    start = time.monotonic()
    try:
        while True:
            info = job_info(job_id, run)
            if info is None:
                unknown += 1
                if unknown >= unknown_limit:
                    return JobEnd(job_id, "UNKNOWN", reason="Slurm no longer knows the job")
                sleep(poll_s)
                continue
            unknown = 0
            state = info.get("JobState", "UNKNOWN")
            if state == "RUNNING" or not nodes:  # the allocation it ran on, kept after requeue
                listed = info.get("NodeList", "")
                nodes = listed if listed and listed != "(null)" else nodes
            if state != last:
                where = f" on {nodes}" if nodes and state == "RUNNING" else ""
                took = time.monotonic() - start
                print(f"job {job_id}: {state}{where} (+{took:.0f} s)", file=out, flush=True)
                last = state
            ran = ran or state == "RUNNING"
            count = info.get("Restarts", "0")
            restarts = count if restarts is None else restarts
            if state.startswith("REQUEUE") or count != restarts or (ran and state == "PENDING"):
                # Slurm requeued it (NeMo-Run submits with --requeue), typically after a node
                # failure. This attempt has failed; the queued retry is cancelled, so the one
                # resumption is the user's rerun (which continues from the last checkpoint).
                run(["scancel", job_id])
                print(f"job {job_id}: requeued by Slurm; cancelled the retry", file=out, flush=True)
                reason = info.get("Reason", "")
                end = JobEnd(job_id, "REQUEUED", reason, info.get("ExitCode", ""), nodes)
                end.lost_nodes = down_nodes(nodes, run)
                return end
            if state in ENDED:
                end = JobEnd(job_id, state, info.get("Reason", ""), info.get("ExitCode", ""), nodes)
                if not end.succeeded:
                    end.lost_nodes = down_nodes(nodes, run)
                return end
            sleep(poll_s)
    except KeyboardInterrupt:
        run(["scancel", job_id])
        print(f"job {job_id}: cancelled (Ctrl-C)", file=out, flush=True)
        return JobEnd(job_id, "CANCELLED", reason="Ctrl-C", nodes=nodes)


def log_tails(folder: Path, job_id: str, lines: int = 20) -> list[tuple[Path, list[str]]]:
    """The last lines of every log under `folder` whose name holds the job id."""
    tails = []
    for path in sorted(folder.rglob(f"*{job_id}*")):
        if path.is_file():
            text = path.read_text(errors="replace").splitlines()
            tails.append((path, text[-lines:]))
    return tails
