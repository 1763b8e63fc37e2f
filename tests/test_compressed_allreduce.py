"""Compressed allreduce on 1..4 ranks under mpirun (tests/mpi/compressed_allreduce.py) and the
`zcoll_allreduce_perf -z` benchmark."""
from __future__ import annotations

import csv

import pytest
from compress_util import BIN_DIR, mpirun, mpirun_script


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
@pytest.mark.parametrize("suite", ["identical", "feedback", "nonfinite"])
def test_compressed_allreduce(suite, nprocs):
    out = mpirun_script(nprocs, "compressed_allreduce.py", suite)
    assert f"[0] OK {suite}" in out, out[-5000:]


Z = "none,fp16,bf16,int8,int4,sign,int8s,topk:0.01,topk_exact:0.05,randomk:0.01,threshold:2"


def bench(nprocs, *flags, timeout=180):
    return mpirun(nprocs, BIN_DIR / "zcoll_allreduce_perf", "-b", "4K", "-e", "256K", "-f", "8", "-n", "2", "-w", "1",
                  *flags, timeout=timeout)


def rows(out):
    return [line[4:].split() for line in out.splitlines()
            if line.startswith("[0] ") and line[4:].strip() and not line[4:].lstrip().startswith("#")]


@pytest.mark.parametrize("nprocs,flags", [(2, []), (3, ["-d", "bfloat16", "-o", "avg", "-i"]),
                                          (4, ["-d", "float16", "-a", "ring"])])
def test_bench_z(nprocs, flags, tmp_path):
    path = tmp_path / "z.csv"
    rc, out = bench(nprocs, "-z", Z, "--csv", str(path), *flags)
    assert rc == 0, out
    assert "# Out of bounds values : 0 OK" in out
    table = rows(out)
    names = {r[4] for r in table}
    expected = set(Z.split(",")) - {"none"} | {"mpi", "ring" if "-a" in flags else "auto"}
    assert names == expected
    assert all(len(r) == 15 and r[8] == "0" for r in table), table  # 11 columns + wire ratio maxerr relerr
    with open(path) as f:
        records = list(csv.DictReader(f))
    assert len(records) == len(table) == 3 * len(expected)
    by = {(r["algorithm"], r["size"]): r for r in records}
    size = max(int(r["size"]) for r in records)
    es = 4 if "-d" not in flags else 2
    ratio = lambda name: float(by[(name, str(size))]["ratio"])  # noqa: E731
    assert ratio("int8") == pytest.approx(es * 256 / (256 + 4), rel=0.02)  # codes + a float per 256
    assert ratio("sign") == pytest.approx(es * 256 / (32 + 4), rel=0.02)
    assert ratio("topk:0.01") > 10
    assert float(by[("int8", str(size))]["max_abs_err"]) > 0


def test_bench_z_bad():
    rc, out = bench(2, "-z", "int3")
    assert rc != 0 and "unknown compression 'int3'" in out
    rc, out = bench(2, "-z", "int8", "-o", "max")
    assert rc != 0 and "sum and avg" in out
    rc, out = bench(2, "-z", "topk:2")
    assert rc != 0 and "(0, 1]" in out
    rc, out = mpirun(1, BIN_DIR / "zcoll_allreduce_perf", "--help")
    assert rc == 0 and "-z LIST" in out and "topk:RATIO" in out
