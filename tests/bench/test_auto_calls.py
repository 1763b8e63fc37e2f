"""bench/auto_calls.py keeps running: --help and a short run."""

from __future__ import annotations

import sys

from mpi_util import ROOT, python_mpirun, run


def test_auto_calls_bench_runs():
    """bench/auto_calls.py in short: a manual loop per configuration, auto decided within its
    warm-up, the table printed (the figures are measurements, not judged here)."""
    bench = ROOT / "bench" / "auto_calls.py"
    rc, out = run([sys.executable, str(bench), "--help"], timeout=60)
    assert rc == 0 and "Horovod-style" in out, out
    args = (
        "--model",
        "cnn",
        "--configs",
        "none,sign,auto",
        "--warmup",
        "50",
        "--rounds",
        "2",
        "--block",
        "3",
    )
    rc, out = python_mpirun(2, bench, *args, timeout=300)
    assert rc == 0, out
    assert "cnn, 2 ranks, 4 timed steps each" in out and "| auto |" in out and "| sign |" in out, out
    assert "auto decided at step 6" in out, out
