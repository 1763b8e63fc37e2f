"""bench/shm_allreduce.py: --help, and a short run on 2 ranks across the single-copy threshold
whose rows are complete, without a wrong result, and whose CSV has every row."""

from __future__ import annotations

import csv
import sys

from mpi_util import ROOT, mpirun

BENCH = ROOT / "bench" / "shm_allreduce.py"


def test_shm_allreduce_benchmark(tmp_path):
    rc, out = mpirun(1, sys.executable, BENCH, "--help")
    assert rc == 0 and "single-copy bound" in out and "--csv" in out
    csv_file = tmp_path / "shm.csv"
    rc, out = mpirun(
        2, sys.executable, BENCH, "-s", "4K,512K", "-r", "2", "--min-ms", "2", "--csv", csv_file, timeout=120
    )
    assert rc == 0 and "#wrong" not in out, out
    rows = list(csv.DictReader(csv_file.open()))
    assert [r["size"] for r in rows] == ["4096", "524288"], out
    for r in rows:
        assert r["#wrong"] == "0" and float(r["bound"]) > 0 and float(r["shm/mpi4py"]) > 0, r
