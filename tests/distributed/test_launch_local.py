"""Local launch through NeMo-Run's LocalExecutor: a real 2-rank torchrun job (gloo), its
success, and a failed job reported as failed (NeMo-Run's `run` returns normally on failure).
~5 s per job."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from launch.local import run_local
from launch.plan import JobCommand, make_plan
from megatron_seed import cli

os.environ.setdefault("NEMORUN_HOME", tempfile.mkdtemp(prefix="nemorun-test-"))


pytestmark = pytest.mark.usefixtures("job_paths")  # as a user's shell exports them


JOB = """
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
out = sys.argv[1]
with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
    f.write(f"{world} {total.item():g} {os.environ.get('SEED_OUT_DIR', '-')}")
dist.destroy_process_group()
sys.exit(int(sys.argv[2]) if rank == world - 1 else 0)
"""


@pytest.fixture
def job_script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def _two_rank_tiny_plan():
    plan = make_plan("tiny")
    return dataclasses.replace(
        plan, layout=dataclasses.replace(plan.layout, trainer_ranks_per_node=2)
    )


def _run_job(job_script: Path, tmp_path: Path, exit_code: str) -> tuple[Any, Path]:
    """(the outcome, the job's output folder) of the two-rank job whose last rank exits
    `exit_code`; the job gets SEED_OUT_DIR as `seed launch --out` passes it to `seed train`."""
    out = tmp_path / "out"
    out.mkdir()
    outcome = run_local(
        _two_rank_tiny_plan(),
        JobCommand(str(job_script), (str(out), exit_code), is_module=False),
        nemorun_home=str(tmp_path / "nemorun"),
        env={"SEED_OUT_DIR": str(out)},
    )
    return outcome, out


def test_local_launch_runs_a_two_rank_job(job_script: Path, tmp_path: Path) -> None:
    outcome, out = _run_job(job_script, tmp_path, "0")
    assert outcome.state == "SUCCEEDED" and outcome.succeeded
    for rank in (0, 1):  # world size, the all-reduced sum, the job's output folder
        assert (out / f"rank{rank}.txt").read_text() == f"2 3 {out}"
    assert outcome.logs(), "torchrun's per-rank logs are under the job dir"


def test_local_launch_reports_a_failed_job(job_script: Path, tmp_path: Path) -> None:
    outcome, out = _run_job(job_script, tmp_path, "3")
    assert outcome.state == "FAILED" and not outcome.succeeded
    assert (out / "rank0.txt").exists()  # it did run; rank 1 exited 3


@pytest.mark.parametrize(("code", "expected"), [("0", 0), ("5", 1)])
def test_seed_launch_local_exit_code_follows_the_job(
    job_script: Path, tmp_path: Path, capsys, code: str, expected: int
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = ["launch", "tiny", "--executor", "local", "--job", f"{job_script} {out} {code}"]
    assert cli.main(argv) == expected
    stdout = capsys.readouterr().out
    assert ("job SUCCEEDED" if expected == 0 else "job FAILED") in stdout


def test_seed_launch_local_dryrun_prints_the_command(capsys) -> None:
    assert cli.main(["launch", "tiny", "--dryrun"]) == 0
    out = capsys.readouterr().out.splitlines()
    # one engine on the node's fleet GPU slot, reserved through the config
    assert out[-1] == (
        "torchrun --standalone --nproc-per-node 1 -m megatron_seed.cli train --recipe tiny "
        """--config-json '{"fleet":{"engines":1,"gpus_per_engine":1.0}}'"""
    )
