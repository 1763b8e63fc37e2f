"""A rank stopped (SIGSTOP), killed (SIGKILL) or gone (its process exits) in the middle of a
loop of 4 KiB allreduces on 4 ranks: every other rank raises zcoll.TimeoutError naming it, in
each algorithm and through DDP, within the timeout + 2 s, and no process is left behind
(tests/mpi/lose_rank.py runs the job; docs/errors.md says what the states mean)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time

import pytest
from mpi_util import OPEN_MPI, TESTS_DIR, mpirun_argv, run

RANKS = 4
VICTIM = RANKS - 1
TIMEOUT = 2.0  # the communicators' deadline, seconds
DUMP_DIR = tempfile.mkdtemp(prefix="zcoll-test-failures-")  # the failing ranks' flight recorders
_RAISED = re.compile(
    r"ZCOLL-RAISED rank=(\d+) type=(\S+) t=([\d.]+) missing=\[([\d, ]*)\] lost=\[([\d, ]*)\]"
)


def _ranks(text: str) -> list:
    return [int(r) for r in text.split(",") if r.strip()]


def lose_rank(*args: str, launcher: tuple = (), env: dict = None, timeout: float = 120) -> dict:
    """Runs lose_rank.py; returns what each rank said, the victim's time, the exit status."""
    argv = mpirun_argv(RANKS, *launcher, sys.executable, TESTS_DIR / "mpi" / "lose_rank.py", *args)
    reports = tempfile.mkdtemp(prefix="zcoll-test-reports-")
    env = {"ZCOLL_DUMP_DIR": DUMP_DIR, "ZCOLL_TEST_REPORTS": reports, **(env or {})}
    rc, out = run(argv, env=env, timeout=timeout)
    # what each rank raised, from its own file (the merged output can have one rank's line
    # inside another's); the output's lines for a rank without a file
    said = "".join(open(os.path.join(reports, f)).read() for f in sorted(os.listdir(reports)))
    shutil.rmtree(reports, ignore_errors=True)
    raised, messages = {}, {}
    for text in (out, said):
        raised.update(
            (int(m[1]), (m[2], float(m[3]), _ranks(m[4]), _ranks(m[5]))) for m in _RAISED.finditer(text)
        )
        messages.update((int(r), m) for r, m in re.findall(r"ZCOLL-MESSAGE rank=(\d+) (.*)", text))
    victim = re.search(r"ZCOLL-VICTIM rank=(\d+) signal=\S+ t=([\d.]+)", out)
    pids = [int(p) for p in re.findall(r"ZCOLL-PID rank=\d+ pid=(\d+)", out)]
    return {
        "rc": rc,
        "out": out,
        "raised": raised,
        "messages": messages,
        "pids": pids,
        "victim_t": float(victim[2]) if victim else None,
        "broken": {int(r) for r in re.findall(r"ZCOLL-BROKEN rank=(\d+) BrokenError", out)},
    }


def assert_nothing_left(job: dict) -> None:
    """Every process of the job is gone (the launcher tore the stopped one down)."""
    assert len(job["pids"]) == RANKS, job["out"]
    end = time.monotonic() + 5
    while True:
        alive = [p for p in job["pids"] if os.path.exists(f"/proc/{p}")]
        if not alive or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert not alive, f"processes left behind: {alive}\n{job['out']}"


def assert_survivors_named_victim(
    job: dict, kind: str, within: float, words: str, attributes: bool = True, victim: int = VICTIM
) -> None:
    """Every rank but the victim raised `kind` within `within` s of the fault, naming the victim
    (in the exception's attributes unless `attributes` is False, and in its message)."""
    out = job["out"]
    assert job["rc"] != 0, out
    assert job["victim_t"] is not None, out
    delays = {r: round(job["raised"][r][1] - job["victim_t"], 2) for r in job["raised"] if r != victim}
    print(
        f"\n{kind}: seconds from the fault to each survivor's exception: {delays}"
    )  # the closing note's figures
    for rank in range(RANKS):
        if rank == victim:
            continue
        assert rank in job["raised"], f"rank {rank} did not raise:\n{out}"
        name, t, missing, lost = job["raised"][rank]
        assert kind in name, f"rank {rank} raised {name}:\n{out}"
        assert not attributes or missing == [victim], f"rank {rank} named {missing} missing:\n{out}"
        assert t - job["victim_t"] <= within, (
            f"rank {rank} raised {t - job['victim_t']:.2f} s after the fault:\n{out}"
        )
        assert f"rank {victim}" in job["messages"][rank] and words in job["messages"][rank], job["messages"][
            rank
        ]
        if kind == "RankLostError":
            assert lost == [victim], out


@pytest.mark.parametrize(
    "algorithm", ["ring", "tree", "recursive_doubling", "halving_doubling", "shm", "mpi"]
)
def test_stopped_rank_is_named_by_every_other_rank(algorithm):
    env = None if algorithm == "shm" else {"ZCOLL_SHM": "0"}
    job = lose_rank("--signal", "STOP", "--algorithm", algorithm, "--timeout", str(TIMEOUT), env=env)
    assert_survivors_named_victim(job, "TimeoutError", TIMEOUT + 2, "stopped")
    # every survivor's next call raised BrokenError at once (Open MPI's prterun wakes a stopped
    # process with SIGCONT before it terminates it, so the victim may get as far as saying so too)
    assert job["broken"] - {VICTIM} == {0, 1, 2}, job["out"]
    assert_nothing_left(job)


def test_stopped_middle_rank_of_a_large_ring_is_named_without_a_crash():
    """256 KiB: the ring's messages to the stopped rank are rendezvous sends still in flight when
    the deadline passes. Cancelling them crashed rank 0 inside MPICH (SIGSEGV in UCX's
    ucp_request_cancel); sends are now only freed."""
    job = lose_rank(
        "--signal",
        "STOP",
        "--algorithm",
        "ring",
        "--count",
        "65536",
        "--victim",
        "1",
        "--timeout",
        str(TIMEOUT),
        env={"ZCOLL_SHM": "0"},
    )
    assert "Segmentation fault" not in job["out"] and "signal 11" not in job["out"], job["out"]
    assert_survivors_named_victim(job, "TimeoutError", TIMEOUT + 2, "stopped", victim=1)
    assert_nothing_left(job)


def test_stopped_rank_is_named_through_ddp():
    job = lose_rank("--ddp", "--signal", "STOP", "--timeout", str(TIMEOUT), timeout=240)
    # DDP re-raises the allreduce hook's zcoll.TimeoutError as a RuntimeError quoting it
    assert_survivors_named_victim(job, "zcoll.TimeoutError", TIMEOUT + 2, "stopped", attributes=False)
    for rank in range(VICTIM):
        assert (
            f"Never arrived (not heard from within 1 s of the failure): rank {VICTIM}"
            in job["messages"][rank]
        )
    assert_nothing_left(job)


def test_work_wait_timeout_names_the_stopped_rank():
    """Work.wait(timeout) on an async all_reduce: the group's own timeout is long, the wait's is
    short; the wait aborts the collective on every rank and raises zcoll.TimeoutError."""
    job = lose_rank("--work-wait", "--signal", "STOP", "--timeout", str(TIMEOUT), timeout=240)
    assert_survivors_named_victim(job, "TimeoutError", TIMEOUT + 2, "Work.wait")
    assert_nothing_left(job)


def test_killed_rank_ends_the_job_fast():
    """SIGKILL: the launcher (hydra, Open MPI's prterun) tears the job down itself; every other
    rank exits non-zero."""
    start = time.monotonic()
    job = lose_rank("--signal", "KILL", "--timeout", "600")
    assert job["rc"] != 0 and job["victim_t"] is not None, job["out"]
    assert time.monotonic() - start < 60
    assert_nothing_left(job)


# mpirun's option to keep a job running when one of its processes exits: hydra's, Open MPI's
NO_TEARDOWN = ("--enable-recovery",) if OPEN_MPI else ("-disable-auto-cleanup",)


def test_exited_rank_is_named_lost_without_waiting_for_the_deadline():
    """The victim's process ends without a signal and the launcher does not tear the job down
    (NO_TEARDOWN): zcoll's own detection ends the others, long before the deadline."""
    job = lose_rank("--signal", "EXIT", "--timeout", "600", launcher=NO_TEARDOWN)
    assert_survivors_named_victim(job, "RankLostError", 10, "has exited")
    assert_nothing_left(job)


def test_rank_with_an_uncaught_exception_is_named_lost_at_once():
    """An exception escapes one rank's script: at exit zcoll announces that the rank left, so the
    others raise RankLostError naming it (missing and lost) within about a second, not at their
    600 s deadline; its process waits in MPI_Finalize until theirs end (docs/errors.md)."""
    job = lose_rank("--signal", "RAISE", "--timeout", "600")
    words = "it left: its process is exiting with an uncaught RuntimeError"
    assert_survivors_named_victim(job, "RankLostError", 3, words)
    assert_nothing_left(job)


def test_rank_with_an_uncaught_exception_is_named_lost_through_ddp():
    """The same through DDP: the torch backend's exit handler announces it before it frees."""
    job = lose_rank("--ddp", "--signal", "RAISE", "--timeout", "600", timeout=240)
    words = "it left: its process is exiting with an uncaught RuntimeError"
    assert_survivors_named_victim(job, "zcoll.TimeoutError", 3, words, attributes=False)
    assert_nothing_left(job)
