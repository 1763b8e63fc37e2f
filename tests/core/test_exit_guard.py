"""The exit guard of a process whose communicator a failure broke (docs/errors.md): it waits
while its peers run, however slowly, and ends the process (status 75) only when a peer is gone or
stopped, ~5 s + 1 s after its script ended (tests/mpi/exit_guard.py runs the 2-rank jobs)."""

from __future__ import annotations

import re
import sys
import time

import pytest
from mpi_util import TESTS_DIR, mpirun_argv, run

SCRIPT = TESTS_DIR / "mpi" / "exit_guard.py"
GUARD_SECONDS = 5.0  # zcoll.core.communicator.FAILURE_EXIT_SECONDS
SETTLE_SECONDS = 1.0  # a peer must look stopped this long (csrc/comm/watchdog.h kExitSettleNs)


def _job(peer: str, *args: str) -> tuple:
    start = time.time()
    rc, out = run(mpirun_argv(2, sys.executable, SCRIPT, "--peer", peer, *args), timeout=150)
    return rc, out, start, time.time()


@pytest.mark.timeout(200)
def test_survivor_waits_for_a_slow_live_peer_and_exits_normally():
    """Rank 1 sleeps 8 s after the failure (> the guard's 5 s): rank 0, in MPI_Finalize, waits for
    it and the job exits 0; before, the guard killed rank 0 at 5 s with status 75."""
    rc, out, start, end = _job("slow", "--sleep", "8")
    assert len(re.findall(r"ZCOLL-RAISED rank=\d", out)) == 2, out
    assert "exiting with status" not in out, out
    assert rc == 0, out
    slept = float(re.search(r"ZCOLL-ENDING rank=1 t=([\d.]+)", out)[1])
    assert end >= slept, out


@pytest.mark.timeout(200)
def test_survivor_of_a_stopped_peer_ends_within_the_bound():
    """Rank 1 stops itself (SIGSTOP) after the failure: rank 0 ends with status 75 within 5 s +
    1 s settle + slack for a loaded machine, and the launcher ends the job."""
    rc, out, start, end = _job("stop")
    assert rc != 0, out
    ending = float(re.search(r"ZCOLL-ENDING rank=0 t=([\d.]+)", out)[1])
    assert "is stopped (MPI_Finalize may wait for it forever): exiting with status 75" in out, out
    assert end - ending < GUARD_SECONDS + SETTLE_SECONDS + 10, (end - ending, out)
    print(f"\nstopped peer: the job ended {end - ending:.2f} s after rank 0's script ended")
