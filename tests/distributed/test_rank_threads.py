"""A rank's torch threads come from the CPUs its process may use (a Slurm cpuset, `taskset`),
split over the ranks, not from the node's count: two jobs pinned to their own cores of one
node do not oversubscribe each other."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import os, sys, torch
from megatron_seed.models.parallel import spawn
os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(",")})
print(spawn(torch.get_num_threads, int(sys.argv[1])))
"""


def _threads(world: int, cpus: list[int]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(world), ",".join(map(str, cpus))],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_rank_threads_follow_the_affinity_mask():
    cpus = sorted(os.sched_getaffinity(0))
    assert _threads(1, cpus[:1]) == "[1]"  # the node's count would give every CPU it has
    if len(cpus) >= 2:  # two ranks share two CPUs: one thread each
        assert _threads(2, cpus[:2]) == "[1, 1]"
