"""bench/guard_overhead.py keeps running: --help and a short run of each comparison."""

from __future__ import annotations

import sys

from mpi_util import ROOT, python_mpirun, run


def test_guard_overhead_bench_runs():
    """bench/guard_overhead.py in short: both models train in A B B A blocks and it prints the
    overhead and the guard's own time (the figures are measurements, not judged here); with
    --compare auto-none, plain zcoll against auto decided uncompressed."""
    bench = ROOT / "bench" / "guard_overhead.py"
    rc, out = run([sys.executable, str(bench), "--help"], timeout=60)
    assert rc == 0 and "A B B A" in out, out
    rc, out = python_mpirun(2, bench, "--blocks", "2", "--block", "3", "--model", "cnn", timeout=300)
    assert rc == 0, out
    assert (
        "cnn, sign, 2 ranks, 4 + 4 timed steps" in out and "overhead" in out and "the guard's own time" in out
    ), out
    rc, out = python_mpirun(
        2, bench, "--compare", "auto-none", "--blocks", "2", "--block", "3", "--model", "cnn", timeout=300
    )
    assert rc == 0, out
    assert (
        "cnn, 2 ranks, 4 + 4 timed steps" in out and "plain zcoll" in out and "auto (decided none)" in out
    ), out
    assert "auto decided at step 6" in out and "the guard's own time" not in out, out
