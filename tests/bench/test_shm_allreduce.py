"""bench/shm_allreduce.py: --help, and a short run on 2 ranks across the single-copy threshold
whose rows (one hot, one cold per size) are complete, without a wrong result, and whose CSV has
every row; a cold run made small enough to be one buffer pair still runs."""

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
        2, sys.executable, BENCH, "-s", "4K,2M", "-r", "2", "--min-ms", "2", "--cold-mib", "8", "--csv", csv_file,
        timeout=180,
    )  # fmt: skip
    assert rc == 0 and "#wrong" not in out, out
    rows = list(csv.DictReader(csv_file.open()))
    assert [(r["size"], r["buffers"]) for r in rows] == [
        ("4096", "hot"), ("4096", "cold"), ("2097152", "hot"), ("2097152", "cold")
    ], out  # fmt: skip
    for r in rows:
        assert r["#wrong"] == "0" and float(r["bound"]) > 0 and float(r["shm/mpi4py"]) > 0, r
    rc, out = mpirun(
        2, sys.executable, BENCH, "-s", "64K", "-r", "1", "--min-ms", "1", "-c", "cold", "--cold-mib", "1"
    )
    assert rc == 0 and "cold" in out and "hot " not in out and "#wrong" not in out, out
    rc, out = mpirun(1, sys.executable, BENCH, "-c", "warm")
    assert rc != 0 and "--conditions" in out, out
