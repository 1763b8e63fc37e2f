"""The launcher and the result protocol themselves: a hanging job is killed whole at its timeout,
an exception on one rank ends the job instead of leaving the other ranks waiting, and every way a
case can fail is reported as a failure of that case (tests/mpi/protocol_cases.py)."""

from __future__ import annotations

import re
import sys
import time
import uuid
from pathlib import Path

import pytest
from mpi_util import case_names, mpirun, script_job


def processes_with(marker: str) -> list:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


def test_timeout_kills_every_rank():
    marker = f"zcoll-hang-{uuid.uuid4().hex}"
    code = f"import time  # {marker}\ntime.sleep(600)"
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="timed out after 3 s"):
        mpirun(3, sys.executable, "-c", code, timeout=3)
    assert time.monotonic() - start < 30
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_with(marker), "ranks survived the timeout"


def test_exception_on_one_rank_aborts_the_job():
    code = (
        "from mpi4py import MPI\n"
        "if MPI.COMM_WORLD.rank == 1: raise RuntimeError('rank 1 failed on purpose')\n"
        "MPI.COMM_WORLD.Barrier()  # rank 0 would wait here forever without the abort\n"
    )
    start = time.monotonic()
    rc, out = mpirun(2, sys.executable, "-m", "mpi4py", "-c", code, timeout=60)
    assert rc != 0
    # rank 1's tag: hydra's -prepend-rank "[1] ", Open MPI's --output tag "[1,1]<stderr>:"
    assert re.search(r"^\[(\d+,)?1\]", out, re.MULTILINE) and "rank 1 failed on purpose" in out, out
    assert time.monotonic() - start < 30


# case: the words its failure message must contain (None: the case passes)
PROTOCOL = {
    "passes": None,
    "fails_one_check_of_three": [
        "case fails_one_check_of_three failed",
        "[1] ZCOLL-FAIL",
        "rank 1 fails this check",
    ],
    "checks_nothing_on_rank_1": ["ranks 1 made no check"],
    "differs_between_ranks": ["result bits differ between rank 0 and ranks 1"],
    "raises_the_wrong_exception": ["expected ValueError, got IndexError"],
    "raises_on_rank_1": ["raised RuntimeError on rank 1", "rank 1 raised on purpose", "Traceback"],
    "never_reached": ["was not reached", "without its summary line"],
}


def test_protocol_cases_cover_the_script():
    assert list(PROTOCOL) == case_names("mpi/protocol_cases.py")


@pytest.mark.parametrize("case", list(PROTOCOL))
def test_protocol_reports_each_case(case):
    job = script_job("mpi/protocol_cases.py", 2, timeout=60)
    if PROTOCOL[case] is None:
        job.check(case, min_checks=5)
        with pytest.raises(pytest.fail.Exception, match="made 5 checks, expected at least 6"):
            job.check(case, min_checks=6)
        return
    with pytest.raises(pytest.fail.Exception) as failure:
        job.check(case)
    missing = [w for w in PROTOCOL[case] if w not in str(failure.value)]
    assert not missing, f"{missing} not in:\n{failure.value}"


def test_protocol_reports_a_job_that_fails_after_its_cases():
    job = script_job("mpi/protocol_cases.py", 2, "--fail-after", "passes", timeout=60)
    with pytest.raises(pytest.fail.Exception, match="case passes passed, but then the job exited"):
        job.check("passes")
