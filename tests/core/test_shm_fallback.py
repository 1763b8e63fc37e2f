"""No shared arena where MPI cannot make one (tests/mpi/shm_fallback.py): ZCOLL_NODE_ID puts two
ranks on one zcoll node that MPI holds in separate shared-memory domains; collectives run without
the arena and comm.shm_unavailable says why. A control run where MPI agrees keeps the arena."""

from __future__ import annotations

import re
import sys

import pytest
from mpi_util import OPEN_MPI, TESTS_DIR, mpirun_argv, run

SCRIPT = TESTS_DIR / "mpi" / "shm_fallback.py"
_LINE = re.compile(
    r"ZCOLL-SHM rank=(\d) domain=(\d+) node_count=(\d+) reason=(.*?) ok=(\w+) shm_algorithm=(ran|raised \w+)"
)
# What makes MPI hold ranks of one machine in separate shared-memory domains: MPICH's no-local
# mode (over its TCP netmod, since shared memory is off for them).
NOLOCAL = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def _lines(env: dict) -> dict:
    rc, out = run(mpirun_argv(2, sys.executable, SCRIPT), env={"ZCOLL_NODE_ID": "a", **env}, timeout=150)
    found = {int(m[1]): m.groups()[1:] for m in _LINE.finditer(out)}
    assert rc == 0 and sorted(found) == [0, 1], out
    return found


@pytest.mark.timeout(200)
@pytest.mark.skipif(
    OPEN_MPI, reason="Open MPI has no switch that holds ranks of one machine apart (MPICH's NOLOCAL)"
)
def test_ranks_mpi_holds_apart_get_no_arena_and_still_reduce():
    for rank, (domain, nodes, reason, ok, shm) in _lines(NOLOCAL).items():
        assert (domain, nodes, ok) == ("1", "1", "True"), rank
        assert "more than one shared-memory domain" in reason, reason
        assert shm.startswith("raised"), shm


@pytest.mark.timeout(200)
def test_ranks_mpi_shares_keep_the_arena():
    for rank, (domain, nodes, reason, ok, shm) in _lines({}).items():
        assert (domain, nodes, reason, ok, shm) == ("2", "1", "", "True", "ran"), rank
