"""bench/report.py: a zcoll_*_perf --csv file as one markdown row per size."""

from __future__ import annotations

import sys

from mpi_util import ROOT, run
from test_perf_binaries import run_bench


def test_report_reads_the_csv(tmp_path):
    """bench/report.py turns a --csv file into one markdown row per size."""
    path = tmp_path / "rows.csv"
    run_bench("allreduce", 2, "-a", "ring,tree", "--csv", str(path))
    rc, out = run([sys.executable, ROOT / "bench" / "report.py", path])
    assert rc == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert len(rows) == 5 and all(row.count("|") == 7 for row in rows), out  # size ring tree mpi best auto
