"""bench/tta.py, the time-to-accuracy benchmark: its quick mode end to end (what CI runs as a smoke
test), a target the budget cannot reach, and a diverging run stopped with the step and method."""

from __future__ import annotations

import json
import sys

from mpi_util import ROOT, run

BENCH = ROOT / "bench" / "tta.py"


def test_help():
    rc, out = run([sys.executable, str(BENCH), "--help"], timeout=60)
    assert rc == 0 and "--quick" in out and "time to" in out.lower(), out


def test_quick_mode(tmp_path):
    """One small workload on 2 ranks: every method trained the same budget, the table, the plot.
    The quick set-up, workload and methods at 40 steps instead of the workload's 200: what is
    checked here (each method's steps, two evaluations with forward clocks, auto's decision at
    step 6, the table's rows, the plot) needs no more, and 200 steps of four methods cost ~60 s."""
    argv = [sys.executable, str(BENCH), "--quick", "--steps", "40", "--out", str(tmp_path)]
    rc, out = run(argv, timeout=600)
    assert rc == 0, out
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("*-seed*.json")]
    assert doc["setup"] == "shm2" and doc["workload"] == "cnn" and doc["ranks"] == 2
    for name, r in doc["methods"].items():
        assert r["failure"] is None and r["steps"] == doc["steps"], (name, r)
        clocks = [e[1] for e in r["evals"]]
        assert len(clocks) == 2 and clocks == sorted(clocks) and clocks[0] > 0, (name, clocks)  # runs forward
    assert doc["methods"]["zcoll-auto"]["auto"]["decided_at_step"] == 6  # 5 trial steps from step 1
    table = (tmp_path / "tta.md").read_text()
    assert "| shm2 | cnn | zcoll-auto |" in table and "| shm2 | cnn | gloo |" in table, table
    assert (tmp_path / "tta-shm2.png").stat().st_size > 10_000


def test_a_target_beyond_the_budget_is_reported(tmp_path):
    argv = [sys.executable, str(BENCH), "--setups", "shm2", "--workloads", "mlp", "--methods", "gloo,zcoll",
            "--seeds", "0", "--steps", "20", "--target", "100", "--out", str(tmp_path)]  # fmt: skip
    rc, out = run(argv, timeout=300)
    assert rc == 0, out
    assert "no method reached the target (test accuracy % 100.0) within the budget of 20 steps" in out, out


def test_a_diverging_run_stops_naming_the_step_and_method(tmp_path):
    argv = [sys.executable, str(BENCH), "--setups", "shm2", "--workloads", "mlp", "--methods", "zcoll",
            "--seeds", "0", "--steps", "20", "--lr", "1e30", "--out", str(tmp_path)]  # fmt: skip
    rc, out = run(argv, timeout=300)
    assert rc == 0, out
    assert "non-finite training loss nan at step 1 with method zcoll" in out, out


def test_a_method_in_its_own_job_is_reported_even_when_it_aborts(tmp_path):
    """torch's PowerSGD hook on gloo runs in a job of its own (it aborted whole jobs, from gloo's
    thread, on the two-bucket models here): the other methods' results survive, and the hook's
    outcome (a result, or its job's abort quoted) is in the table, never dropped."""
    argv = [sys.executable, str(BENCH), "--setups", "shm2", "--workloads", "mlp", "--methods", "zcoll,gloo-powersgd",
            "--seeds", "0", "--steps", "20", "--out", str(tmp_path)]  # fmt: skip
    rc, out = run(argv, timeout=300)
    assert rc == 0, out
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("*-seed*.json")]
    assert set(doc["methods"]) == {"zcoll", "gloo-powersgd"}, doc["methods"].keys()
    assert doc["methods"]["zcoll"]["steps"] == 20 and doc["methods"]["zcoll"]["failure"] is None
    hook = doc["methods"]["gloo-powersgd"]
    assert hook["steps"] == 20 or "its job aborted" in hook["failure"], hook
    row = next(line for line in (tmp_path / "tta.md").read_text().splitlines() if "| gloo-powersgd |" in line)
    assert hook["steps"] == 20 or "failed:" in row, row
