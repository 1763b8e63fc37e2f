"""bench/python_overhead.py: --help, a short run on 2 ranks whose rows and CSV are complete and
without a wrong result, and its refusal of sizes that are not multiples of 4."""

from __future__ import annotations

import sys

from mpi_util import ROOT, mpirun
from zcoll.tools.perf_table import split_ranks

BENCH = ROOT / "bench" / "python_overhead.py"


def test_overhead_benchmark(tmp_path):
    rc, out = mpirun(1, sys.executable, BENCH, "--help")
    assert rc == 0 and "mpi4py" in out and "--csv" in out
    csv_file = tmp_path / "overhead.csv"
    rc, out = mpirun(
        2, sys.executable, BENCH, "-n", "3", "-r", "2", "--sizes", "4,4096", "--csv", csv_file, timeout=180
    )
    assert rc == 0, out
    rows = [line.split() for line in split_ranks(out).get(0, "").splitlines()]  # either launcher's rank tags
    rows = [r for r in rows if len(r) == 9 and r[0] in ("4", "4096")]  # size, 4 times, 2 overheads, 2 ratios
    assert len(rows) == 2 and "#wrong" not in out, out
    header, *lines = csv_file.read_text().splitlines()
    assert "zcoll-numpy us" in header and "#wrong" in header and len(lines) == 2
    rc, out = mpirun(1, sys.executable, BENCH, "--sizes", "3")
    assert rc != 0 and "multiples of 4" in out
