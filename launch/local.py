"""Local run: torchrun on this node through NeMo-Run's `LocalExecutor`, waited for.

NeMo-Run's `Experiment.run` returns normally when the job failed, so `run_local` reads the
job's final state and reports it; `seed launch` turns anything but SUCCEEDED into a non-zero
exit. No Ray cluster is started here: a local job starts its own (`ray.init()`), on the GPUs
after the trainer's (see `launch.plan`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launch.plan import JobCommand, LaunchPlan
from launch.slurm import JOB_NAME


@dataclass(frozen=True)
class LocalOutcome:
    """How a local job ended."""

    state: str  # NeMo-Run / TorchX AppState name: SUCCEEDED, FAILED, CANCELLED, UNKNOWN, ...
    job_dir: Path  # NeMo-Run's folder of the job (logs under it)
    experiment_id: str

    @property
    def succeeded(self) -> bool:
        """True only for a job that ran to completion with exit code 0 on every rank."""
        return self.state == "SUCCEEDED"

    def logs(self) -> list[Path]:
        """The per-rank logs torchrun wrote (combined stdout/stderr)."""
        return sorted(self.job_dir.rglob("combined.log"))


def _json_to_file(job: JobCommand, tmp: Path) -> JobCommand:
    """The job with a `--config-json TEXT` argument moved into a file (`seed train` reads
    either). NeMo-Run shell-quotes torchrun's arguments for the sbatch script, and the local
    scheduler passes them on without a shell, so quoted JSON would arrive with its quotes."""
    args = list(job.args)
    for i, arg in enumerate(args[:-1]):
        if arg == "--config-json" and args[i + 1].lstrip().startswith("{"):
            path = tmp / "config-overrides.json"
            path.write_text(args[i + 1])
            args[i + 1] = str(path)
    return dataclasses.replace(job, args=tuple(args))


# Paths a `seed train` job reads from its environment (see `seed train --help`).
FORWARDED_ENV = ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR")


def run_local(
    plan: LaunchPlan,
    job: JobCommand | None = None,
    nemorun_home: str | None = None,
    env: dict[str, str] | None = None,
) -> LocalOutcome:
    """Run `job` (default: `seed train` of the plan) under torchrun here and wait for it.

    The job gets `env` and this process's SEED_MODEL_DIR /
    SEED_GAMES_DIR / SEED_OUT_DIR."""
    import nemo_run as run

    # torchrun is looked up on PATH: put this interpreter's environment first.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    executor = run.LocalExecutor(
        ntasks_per_node=plan.layout.trainer_ranks_per_node,
        launcher="torchrun",
        env_vars={
            "PATH": path,
            **{k: os.environ[k] for k in FORWARDED_ENV if k in os.environ},
            **(env or {}),
        },
    )
    exp = run.Experiment(
        f"seed-{plan.recipe.name}",
        executor=executor,
        log_level="WARN",
        base_dir=nemorun_home or os.environ.get("NEMORUN_HOME") or None,
        enable_goodbye_message=False,
    )
    with tempfile.TemporaryDirectory(prefix="seed-local-") as tmp, exp:
        exp.add(_json_to_file(job or plan.job(), Path(tmp)).to_nemo_script(), name=JOB_NAME)
        exp.run(detach=False, tail_logs=False)
    handle = exp.jobs[0]
    state = getattr(handle.state, "name", str(handle.state))
    return LocalOutcome(state=state, job_dir=Path(handle.executor.job_dir), experiment_id=exp._id)
