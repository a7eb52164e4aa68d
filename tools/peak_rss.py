"""Run a command and record the peak resident memory of every process it starts.

    python tools/peak_rss.py --out peaks.json -- seed train --model M --games G --out O

Every `--interval` seconds the command's process tree (Ray's workers and actors included:
`ray.init` starts its raylet as a child) is walked through /proc and each process's
high-water mark (`VmHWM`, the kernel's own peak resident set; sampling only has to catch a
process before it exits) is kept under its name: Ray's process title (`ray::VLLMEngine`,
`ray::EnvWorker`, ...) or the command line. The result, per process and summed per name, is
written as JSON and printed; the command's exit status is this tool's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _tree(root: int) -> list[int]:
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += _children(pid)
    return seen


def _sample(pid: int) -> tuple[str, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return None
    hwm = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:")), 0)
    return " ".join(cmd.split()[:3])[:120], hwm


def main(argv: list[str] | None = None) -> int:
    """Run the command after `--`, sample, write the peaks; return its exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the peaks")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    proc = subprocess.Popen(command)
    peaks: dict[int, tuple[str, int]] = {}
    start = time.time()
    while proc.poll() is None:
        for pid in _tree(proc.pid):
            got = _sample(pid)
            if got is not None and got[1] >= peaks.get(pid, ("", 0))[1]:
                peaks[pid] = got
        time.sleep(args.interval)
    by_name: dict[str, dict[str, float]] = {}
    for name, kib in peaks.values():
        entry = by_name.setdefault(name, {"processes": 0, "max_gib": 0.0, "sum_gib": 0.0})
        entry["processes"] += 1
        entry["max_gib"] = max(entry["max_gib"], kib / 2**20)
        entry["sum_gib"] += kib / 2**20
    result = {
        "command": command,
        "exit_status": proc.returncode,
        "seconds": round(time.time() - start, 1),
        "by_name": dict(sorted(by_name.items(), key=lambda kv: -kv[1]["max_gib"])),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, entry in list(result["by_name"].items())[:12]:
        print(f"{entry['max_gib']:7.2f} GiB  x{entry['processes']:<3d} {name}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
