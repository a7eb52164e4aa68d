"""`seed launch --wait`: following a Slurm job through scripted scontrol/sinfo answers."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Sequence

import pytest

from launch.follow import follow, parse_scontrol


class FakeSlurm:
    """Answers scontrol with the next scripted job record; records every command."""

    def __init__(self, records: list[str | None], down: str = "") -> None:
        self.records, self.down, self.calls = list(records), down, []

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "scontrol":
            record = self.records.pop(0) if len(self.records) > 1 else self.records[0]
            if record is None:
                return subprocess.CompletedProcess(argv, 1, "", "Invalid job id specified")
            if record == "INTERRUPT":
                raise KeyboardInterrupt
            return subprocess.CompletedProcess(argv, 0, record, "")
        if argv[0] == "sinfo":
            return subprocess.CompletedProcess(argv, 0, self.down, "")
        return subprocess.CompletedProcess(argv, 1 if argv[0] == "sacct" else 0, "", "")


def _job(state: str, nodes: str = "n[1-2]", restarts: int = 0, reason: str = "None") -> str:
    return (
        f"JobId=7 JobName=seed-tiny-train JobState={state} Reason={reason} "
        f"Restarts={restarts} ExitCode=0:0 NodeList={nodes} Command=/x/a=b.sh"
    )


def _follow(slurm: FakeSlurm):
    out = io.StringIO()
    end = follow("7", slurm, poll_s=0, out=out, sleep=lambda s: None)
    return end, out.getvalue()


def test_parse_keeps_values_with_equals_signs() -> None:
    fields = parse_scontrol(_job("RUNNING"))
    assert fields["JobState"] == "RUNNING" and fields["Command"] == "/x/a=b.sh"


def test_completed_is_success_and_each_state_change_is_printed_once() -> None:
    slurm = FakeSlurm([_job("PENDING", "(null)"), _job("RUNNING"), _job("RUNNING"),
                       _job("COMPLETED")])  # fmt: skip
    end, log = _follow(slurm)
    assert end.succeeded and end.lost_nodes == []
    assert [line.split(" (+")[0] for line in log.splitlines()] == [
        "job 7: PENDING", "job 7: RUNNING on n[1-2]", "job 7: COMPLETED",
    ]  # fmt: skip
    assert not any(c[0] == "scancel" for c in slurm.calls)


@pytest.mark.parametrize("state", ["FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED"])
def test_any_other_end_fails_and_names_down_nodes(state: str) -> None:
    slurm = FakeSlurm(
        [_job("RUNNING"), _job(state, reason="NodeDown")], down="n1 allocated\nn2 down*\n"
    )
    end, _ = _follow(slurm)
    assert not end.succeeded and end.state == state
    assert end.lost_nodes == ["n2"]
    assert "lost node(s): n2" in end.summary() and "reason NodeDown" in end.summary()


def test_a_requeue_after_node_failure_is_a_failure_and_the_retry_is_cancelled() -> None:
    # after requeue the record shows the job pending again, on part of its nodes
    slurm = FakeSlurm([_job("RUNNING"), _job("PENDING", "n1", restarts=1)], down="n2 down*\n")
    end, log = _follow(slurm)
    assert end.state == "REQUEUED" and not end.succeeded
    assert end.nodes == "n[1-2]" and end.lost_nodes == ["n2"]
    assert ["scancel", "7"] in slurm.calls and "cancelled the retry" in log


def test_ctrl_c_cancels_the_job() -> None:
    slurm = FakeSlurm([_job("RUNNING"), "INTERRUPT"])
    end, _ = _follow(slurm)
    assert end.state == "CANCELLED" and end.reason == "Ctrl-C"
    assert slurm.calls[-1] == ["scancel", "7"]


def test_a_job_slurm_forgot_ends_unknown_not_in_a_hang() -> None:
    end, _ = _follow(FakeSlurm([None]))
    assert end.state == "UNKNOWN" and not end.succeeded
