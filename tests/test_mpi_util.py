"""The launcher itself: a hanging job is killed whole at its timeout, and an exception on one rank
ends the job instead of leaving the other ranks waiting."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
from mpi_util import mpirun


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
    assert "[1] " in out and "rank 1 failed on purpose" in out, out
    assert time.monotonic() - start < 30
