"""Wait until a Ray cluster has the expected nodes and GPUs (run inside the job, on the head).

    python -m launch.ray_health --address HOST:PORT --nodes N --gpus G --timeout 900

Exit 0 when at least N alive nodes with at least G GPUs in total are registered; exit 1 with
one line on stderr when the timeout passes first. The Slurm script runs it after the head
starts (N=1) and again after the workers start, before training.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

NodesFn = Callable[[], list[dict[str, Any]]]


def cluster_size(nodes: list[dict[str, Any]]) -> tuple[int, float]:
    """(alive nodes, GPUs on them) from `ray.nodes()` records."""
    alive = [n for n in nodes if n.get("Alive")]
    return len(alive), sum(float(n.get("Resources", {}).get("GPU", 0)) for n in alive)


def wait_for_cluster(
    list_nodes: NodesFn,
    want_nodes: int,
    want_gpus: int,
    timeout_s: float,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, float]:
    """Poll `list_nodes` until the cluster is big enough; `TimeoutError` otherwise."""
    deadline = clock() + timeout_s
    while True:
        have_nodes, have_gpus = cluster_size(list_nodes())
        if have_nodes >= want_nodes and have_gpus >= want_gpus:
            return have_nodes, have_gpus
        if clock() >= deadline:
            raise TimeoutError(
                f"Ray cluster has {have_nodes}/{want_nodes} nodes and "
                f"{have_gpus:g}/{want_gpus} GPUs after {timeout_s:g} s"
            )
        sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    """Connect to the cluster at `--address` and wait; the exit code is the verdict."""
    parser = argparse.ArgumentParser(prog="python -m launch.ray_health", description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)

    import ray  # only inside the job

    from megatron_seed import provenance

    provenance.record("ray-health")  # a containerised job: where this step ran

    start = time.monotonic()
    deadline = start + args.timeout
    while True:  # the head may not accept connections yet
        try:
            ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
            break
        except Exception as err:  # ConnectionError and friends, depending on the Ray version
            if time.monotonic() >= deadline:
                print(f"ray_health: cannot connect to {args.address}: {err}", file=sys.stderr)
                return 1
            time.sleep(2.0)  # a connection attempt is cheap; the job waits on this
    try:
        nodes, gpus = wait_for_cluster(
            ray.nodes, args.nodes, args.gpus, max(deadline - time.monotonic(), 0.0)
        )
    except TimeoutError as err:
        print(f"ray_health: {err}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    took = time.monotonic() - start
    print(f"ray_health: ready: {nodes} nodes, {gpus:g} GPUs after {took:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
