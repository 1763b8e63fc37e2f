"""The zcoll_*_perf benchmark binaries (bench/harness.cc and one file per collective): small
checked runs under mpirun with 1..4 ranks, --help and bad flags; zcoll_allreduce_perf -z (every
compression's rows, wire bytes and errors); their output read through zcoll.tools.perf_table."""

from __future__ import annotations

import pytest
from mpi_util import BIN_DIR, mpirun, run
from zcoll.tools import perf_table

BENCHES = {  # binary: the algorithms it measures besides mpi
    "allreduce": ["ring", "tree", "recursive_doubling", "halving_doubling", "shm", "hierarchical", "auto"],
    "reduce_scatter": ["ring"],
    "allgather": ["ring"],
    "broadcast": ["tree"],
}
SMALL = ["-b", "4", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "-c", "1"]  # 5 sizes: 4 B .. 16 KiB
FLAGS = ["-b", "-e", "-f", "-n", "-w", "-c", "-d", "-o", "-a", "-r", "-i", "-t", "--off", "--csv", "-h", "--help"]


def binary(name: str) -> str:
    return str(BIN_DIR / f"zcoll_{name}_perf")


def run_bench(name: str, nprocs: int, *flags) -> list:
    """Runs a checked benchmark; asserts exit 0 and no wrong element in any row; returns rows."""
    rc, out = mpirun(nprocs, binary(name), *SMALL, *flags)
    assert rc == 0, f"zcoll_{name}_perf exited {rc}:\n{out}"
    table = perf_table.parse(out)
    assert (table.collective, table.ranks) == (name, nprocs), out
    assert table.rows, f"no result rows:\n{out}"
    wrong = [r for r in table.rows if r.wrong != 0]
    assert not wrong, f"rows with wrong elements: {wrong}\n{out}"
    assert table.out_of_bounds == 0, out
    return table.rows


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(BENCHES))
def test_checked_run(name, nprocs):
    rows = run_bench(name, nprocs)
    algorithms = {r.algorithm for r in rows}
    assert algorithms == set(BENCHES[name]) | {"mpi"}
    assert len(rows) == 5 * len(algorithms), "one row per size and algorithm"


@pytest.mark.parametrize(
    "name,flags",
    [
        ("allreduce", ["-d", "bfloat16", "-o", "avg", "-i"]),
        ("allreduce", ["-d", "int8", "-o", "prod", "-a", "ring,tree"]),
        ("allreduce", ["-d", "float16", "-o", "max", "-a", "halving_doubling"]),
        ("reduce_scatter", ["-d", "int32", "-o", "min", "-i"]),
        ("allgather", ["-d", "float64", "-i"]),
        ("broadcast", ["-d", "int64", "-r", "2"]),
    ],
)
def test_checked_run_options(name, flags):
    """Other dtypes, ops, roots, in-place and algorithm subsets, on 3 ranks."""
    rows = run_bench(name, 3, *flags)
    if "-d" in flags:
        assert {r.type for r in rows} == {flags[flags.index("-d") + 1]}
    if "-a" in flags:
        assert {r.algorithm for r in rows} == set(flags[flags.index("-a") + 1].split(",")) | {"mpi"}


def test_feature_off_twin_rows():
    """--off FEATURE: every row has a twin run with the feature off, interleaved, both checked."""
    rows = run_bench("allreduce", 2, "-a", "ring,shm,mpi", "--off", "deadlines", "--off", "telemetry",
                     "--off", "recorder")
    assert {r.algorithm for r in rows} == {
        "ring", "shm", "mpi", *(f"{a}/-{f}" for a in ("ring", "shm") for f in ("deadlines", "telemetry", "recorder"))
    }
    rc, out = run([binary("allreduce"), "--off", "coffee"])
    assert rc != 0 and "unknown feature 'coffee' for --off" in out, out


def test_csv(tmp_path):
    path = tmp_path / "rows.csv"
    rows = run_bench("allreduce", 2, "-a", "ring", "--csv", str(path))
    records = perf_table.read_csv(path)
    assert len(records) == len(rows) == 10
    assert {r.algorithm for r in records} == {"ring", "mpi"}
    assert all(r.wrong == 0 and r.ranks == 2 for r in records)
    # the printed table and the CSV agree (the CSV has more digits)
    for printed, written in zip(rows, records):
        assert (printed.size, printed.algorithm) == (written.size, written.algorithm)
        assert printed.wrong == written.wrong


@pytest.mark.parametrize("name", list(BENCHES))
def test_help(name):
    rc, out = run([binary(name), "--help"])
    assert rc == 0, out
    missing = [f for f in FLAGS if f not in out.replace(",", " ").split()]
    assert not missing, f"--help does not document {missing}:\n{out}"
    for algorithm in BENCHES[name]:
        assert algorithm in out


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--bogus"], "unknown flag '--bogus'"),
        (["-d", "float8"], "unknown dtype 'float8'"),
        (["-o", "mean"], "unknown op 'mean'"),
        (["-a", "bruck"], "unknown algorithm 'bruck'"),
        (["-f", "1"], "-f must be > 1"),
        (["-b", "64K", "-e", "4K"], "-b must not exceed -e"),
        (["-b", "12Q"], "bad size '12Q'"),
        (["-n"], "flag -n needs a value"),
        (["-d", "int32", "-o", "avg"], "avg"),
    ],
)
def test_bad_flags(flags, message):
    rc, out = run([binary("allreduce"), *flags])
    assert rc != 0, out
    assert message in out


def test_bad_root():
    rc, out = mpirun(2, binary("broadcast"), "-r", "2", *SMALL)
    assert rc != 0
    assert "root 2 out of range for 2 ranks" in out


Z = "none,fp16,bf16,int8,int4,sign,int8s,topk:0.01,topk_exact:0.05,randomk:0.01,threshold:2"


def bench(nprocs, *flags, timeout=180):
    return mpirun(
        nprocs,
        BIN_DIR / "zcoll_allreduce_perf",
        "-b",
        "4K",
        "-e",
        "256K",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        *flags,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "nprocs,flags",
    [(2, []), (3, ["-d", "bfloat16", "-o", "avg", "-i"]), (4, ["-d", "float16", "-a", "ring"])],
)
def test_bench_z(nprocs, flags, tmp_path):
    path = tmp_path / "z.csv"
    rc, out = bench(nprocs, "-z", Z, "--csv", str(path), *flags)
    assert rc == 0, out
    table = perf_table.parse(out)
    assert table.out_of_bounds == 0, out
    expected = set(Z.split(",")) - {"none"} | {"mpi", "ring" if "-a" in flags else "auto"}
    assert table.algorithms == expected
    assert table.compression_columns, out  # wire ratio maxerr relerr on every row
    assert all(r.wrong == 0 for r in table.rows), out
    records = perf_table.read_csv(path)
    assert len(records) == len(table.rows) == 3 * len(expected)
    by = {(r.algorithm, r.size): r for r in records}
    size = max(r.size for r in records)
    es = 4 if "-d" not in flags else 2
    # codes + a float per block of 256
    assert by[("int8", size)].ratio == pytest.approx(es * 256 / (256 + 4), rel=0.02)
    assert by[("sign", size)].ratio == pytest.approx(es * 256 / (32 + 4), rel=0.02)
    assert by[("topk:0.01", size)].ratio > 10
    assert by[("int8", size)].max_abs_err > 0


def test_bench_z_bad():
    rc, out = bench(2, "-z", "int3")
    assert rc != 0 and "unknown compression 'int3'" in out
    rc, out = bench(2, "-z", "int8", "-o", "max")
    assert rc != 0 and "sum and avg" in out
    rc, out = bench(2, "-z", "topk:2")
    assert rc != 0 and "(0, 1]" in out
    rc, out = mpirun(1, BIN_DIR / "zcoll_allreduce_perf", "--help")
    assert rc == 0 and "-z LIST" in out and "topk:RATIO" in out
