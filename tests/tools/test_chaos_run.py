"""`zcoll run` under faults (tests/chaos_run.py, docs/chaos.md): the CI-sized run, two faults (a stop
in the middle of a checkpoint save, a kill in the middle of the recovery that follows; each launch's
start-up is most of the test's time), must finish with the fault-free run's exact parameters and no corrupt
checkpoint. The stopped saver is the case that hung when the ranks agreed on a checkpoint through
MPI's own gather (no deadline): the others now raise at the process group's timeout. The full
run (24 faults and more):

    python tests/chaos_run.py --faults 24

The in-place chaos run (tests/chaos_shrink.py, Open MPI + ULFM; skips without .venv-ompi) is
checked at its smallest: one job of 3 ranks, a SIGKILL and then a SIGSTOP; the survivor must finish
with the fault-free run's held-out loss within the script's tolerance and mpirun must exit 0.
"""

from __future__ import annotations

import json
import sys

import engines
import pytest
from mpi_util import TESTS_DIR, run

CHAOS = TESTS_DIR / "chaos_run.py"
CHAOS_SHRINK = TESTS_DIR / "chaos_shrink.py"
PLAN = "stop:checkpoint,kill:recovery"


def test_help():
    rc, out = run([sys.executable, CHAOS, "--help"], timeout=60)
    assert rc == 0, out
    for word in ("--faults", "--plan", "checkpoint", "recovery", "bit-identical"):
        assert word in out, word


def test_plan_refuses_a_recovery_first():
    rc, out = run([sys.executable, CHAOS, "--plan", "kill:recovery,kill:random"], timeout=60)
    assert rc != 0 and "nothing to recover from" in out, out


def test_two_faults_finish_bit_identically(tmp_path):
    rc, out = run(
        [sys.executable, CHAOS, "--plan", PLAN, "--steps", "150", "--checkpoint-every", "10", "--timeout", "1.5",
         "--spread", "0.5", "--out", tmp_path],
        timeout=240,
    )  # fmt: skip
    print(out[-3000:])
    results = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0 and not results["problems"], out[-6000:]
    assert results["faults"] == 2 and results["restarts"] == 2, results
    assert results["identical"] and results["digest"] == results["reference_digest"], results
    assert results["corrupt"] == 0 and results["scans"] >= 3, results
    faults = results["fault_list"]
    assert [(f["signal"], f["when"]) for f in faults] == [tuple(p.split(":")) for p in PLAN.split(",")]
    assert faults[0]["phase"] == "checkpoint", faults[0]  # the stop landed inside a save
    assert faults[1]["phase"] in ("start", "load", "replay"), faults[1]  # the kill inside its recovery
    # the second recovery got back to the step; the first was cut short by the second fault
    assert faults[1]["back"] and (faults[0]["back"] or faults[0]["cut"]), faults


@pytest.mark.skipif(engines.openmpi() is None, reason=engines.openmpi_missing())
def test_in_place_a_kill_then_a_stop(tmp_path):
    rc, out = run(
        [sys.executable, CHAOS_SHRINK, "--faults", "2", "--per-job", "2", "--ranks", "3", "--steps", "80",
         "--stop-last", "--out", tmp_path],
        timeout=400,
    )  # fmt: skip
    print(out[-3000:])
    results = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0 and not results["problems"], out[-6000:]
    (job,) = results["jobs"]
    assert sorted(job["how"]) == ["excluded", "failed"] and job["rc"] == 0, job
    assert [(f["signal"], f["back"] is not None) for f in results["faults"]] == [
        ("kill", True),
        ("stop", True),
    ]
