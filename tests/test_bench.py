"""The zcoll_*_perf benchmark binaries: small checked runs under mpirun with 1..4 ranks, --help,
and bad flags."""

from __future__ import annotations

import csv

import pytest
from mpi_util import BIN_DIR, mpirun, run

BENCHES = {  # binary: the algorithms it measures besides mpi
    "allreduce": ["ring", "tree", "recursive_doubling", "halving_doubling", "shm", "auto"],
    "reduce_scatter": ["ring"],
    "allgather": ["ring"],
    "broadcast": ["tree"],
}
SMALL = ["-b", "4", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "-c", "1"]  # 5 sizes: 4 B .. 16 KiB
FLAGS = ["-b", "-e", "-f", "-n", "-w", "-c", "-d", "-o", "-a", "-r", "-i", "-t", "--csv", "-h", "--help"]
WRONG_COLUMN = 8  # size count type redop algorithm time algbw busbw #wrong iters vs_mpi


def binary(name: str) -> str:
    return str(BIN_DIR / f"zcoll_{name}_perf")


def table_rows(out: str) -> list:
    """The result rows rank 0 printed, split into columns."""
    rows = []
    for line in out.splitlines():
        if not line.startswith("[0] "):
            continue
        cols = line[4:].split()
        if cols and not line[4:].lstrip().startswith("#"):
            rows.append(cols)
    return rows


def run_bench(name: str, nprocs: int, *flags) -> list:
    """Runs a checked benchmark; asserts exit 0 and no wrong element in any row; returns rows."""
    rc, out = mpirun(nprocs, binary(name), *SMALL, *flags)
    assert rc == 0, f"zcoll_{name}_perf exited {rc}:\n{out}"
    rows = table_rows(out)
    assert rows, f"no result rows:\n{out}"
    wrong = [r for r in rows if r[WRONG_COLUMN] != "0"]
    assert not wrong, f"rows with wrong elements: {wrong}\n{out}"
    assert "# Out of bounds values : 0 OK" in out
    return rows


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(BENCHES))
def test_checked_run(name, nprocs):
    rows = run_bench(name, nprocs)
    algorithms = {r[4] for r in rows}
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
        assert {r[2] for r in rows} == {flags[flags.index("-d") + 1]}
    if "-a" in flags:
        assert {r[4] for r in rows} == set(flags[flags.index("-a") + 1].split(",")) | {"mpi"}


def test_csv(tmp_path):
    path = tmp_path / "rows.csv"
    rows = run_bench("allreduce", 2, "-a", "ring", "--csv", str(path))
    with open(path) as f:
        records = list(csv.DictReader(f))
    assert len(records) == len(rows) == 10
    assert {r["algorithm"] for r in records} == {"ring", "mpi"}
    assert all(r["wrong"] == "0" and r["ranks"] == "2" for r in records)


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
