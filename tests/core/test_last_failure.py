"""Communicator._last_failure: the watchdog's record of the failure that broke a communicator
(None before), the same ranks as the exception's attributes plus the missing ranks this rank saw
alive on this machine; 3 real MPI ranks (tests/mpi/last_failure.py), on the engine of the run."""

from __future__ import annotations

import json
import re
import sys

import pytest
from mpi_util import OPEN_MPI, TESTS_DIR, mpirun_argv, run

SCRIPT = TESTS_DIR / "mpi" / "last_failure.py"
# mpirun's option to keep a job running when one of its processes exits: Open MPI's, hydra's
NO_TEARDOWN = ("--enable-recovery",) if OPEN_MPI else ("-disable-auto-cleanup",)
# Each record is flat JSON (lists, no nested objects), matched brace to brace: mpirun's merged
# output may put another rank's text right after it on the same line.
_JSON = r"(null|\{[^{}]*\})"
_LAST = re.compile(rf"ZCOLL-LAST rank=(\d+) before={_JSON} after={_JSON} raised={_JSON}")


def _records(victim: str, sync_dir, *launcher: str) -> dict:
    argv = mpirun_argv(3, *launcher, sys.executable, SCRIPT, "--victim", victim, "--timeout", "2",
                       "--sync-dir", str(sync_dir))  # fmt: skip
    out = run(argv, timeout=150).output
    found = {int(m[1]): (json.loads(m[2]), json.loads(m[3]), json.loads(m[4])) for m in _LAST.finditer(out)}
    assert sorted(found) == [0, 1], out
    return found


@pytest.mark.timeout(200)
def test_last_failure_names_a_hung_rank_missing_and_alive(tmp_path):
    for rank, (before, after, raised) in _records("hang", tmp_path).items():
        assert before is None, rank
        assert raised["type"] == "TimeoutError" and raised["missing"] == [2] and raised["lost"] == []
        assert after == {"missing": [2], "lost": [], "alive": [2], "seq": 2, "collective": "allreduce"}, rank
        assert after["seq"] == raised["seq"]


@pytest.mark.timeout(200)
def test_last_failure_names_an_exited_rank_missing_and_lost(tmp_path):
    for rank, (before, after, raised) in _records("exit", tmp_path, *NO_TEARDOWN).items():
        assert before is None, rank
        assert raised["type"] == "RankLostError" and raised["lost"] == [2], raised
        assert after == {"missing": [2], "lost": [2], "alive": [], "seq": 2, "collective": "allreduce"}, rank
