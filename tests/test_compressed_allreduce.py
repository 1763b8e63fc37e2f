"""Compressed allreduce on 1..4 ranks under mpirun (tests/mpi/compressed_allreduce.py) and the
`zcoll_allreduce_perf -z` benchmark."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import perf_table
import pytest
from mpi_util import BIN_DIR, case_names, mpirun, run, script_job

# Fewest checks each case must report, about 90% of what it makes today: a script that silently
# stops checking fails.
MIN_CHECKS = {"identical": 1700, "feedback": 17, "nonfinite": 110}


@pytest.mark.parametrize("case", case_names("mpi/compressed_allreduce.py"))
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_compressed_allreduce(nprocs, case):
    script_job("mpi/compressed_allreduce.py", nprocs, timeout=400).check(case, MIN_CHECKS[case])


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


SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "emulated_network.py"


def fake_tools(tmp_path, ip_fails: bool, tc_fails: bool):
    """`ip` and `tc` stand-ins that log their arguments and fail as asked."""
    log = tmp_path / "calls.log"
    for tool, fails in (("ip", ip_fails), ("tc", tc_fails)):
        script = tmp_path / tool
        if tool == "ip":  # `ip netns exec NS CMD...` runs CMD (here: the fake tc, or true)
            body = (
                f'echo "ip $*" >> {log}\n'
                f'if [ "$1 $2" = "netns add" ] && {str(fails).lower()}; then echo "mount: Operation not permitted" >&2; exit 1; fi\n'
                'if [ "$1 $2" = "netns exec" ]; then shift 3; [ "$1" = tc ] && exec "$@"; exit 0; fi\n'
            )
        else:
            body = f'echo "tc $*" >> {log}\n' + (
                'echo "RTNETLINK answers: Operation not permitted" >&2; exit 2\n' if fails else ""
            )
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
    return log


@pytest.mark.parametrize(
    "ip_fails,tc_fails,message",
    [
        (True, False, "cannot create a network namespace"),
        (False, True, "tc tbf) is not permitted"),
    ],
)
def test_emulated_network_refuses(tmp_path, ip_fails, tc_fails, message):
    log = fake_tools(tmp_path, ip_fails, tc_fails)
    path = f"{tmp_path}{os.pathsep}{BIN_DIR}{os.pathsep}{os.environ['PATH']}"
    rc, out = run([sys.executable, SCRIPT, "--out", tmp_path / "out"], env={"PATH": path}, timeout=60)
    assert rc == 3, out
    assert message in out
    calls = log.read_text()
    if not ip_fails:
        assert "ip netns del zcoll-net-" in calls, "the namespace is deleted after a failed set-up"


def test_emulated_network_help():
    rc, out = run([sys.executable, SCRIPT, "--help"], timeout=60)
    assert rc == 0 and "tbf rate 1gbit" in out and "--ranks" in out


def test_emulated_network_report(tmp_path):
    """The emulated-network table, from the CSV rows of a real (unthrottled) run."""
    path = tmp_path / "z.csv"
    rc, out = bench(2, "-a", "ring", "-z", "none,int8", "--csv", str(path))
    assert rc == 0, out
    import emulated_network  # bench/

    rows = emulated_network.report(perf_table.read_csv(path), throughput=1e8)
    assert {r["method"] for r in rows} == {"none (ring)", "int8", "mpi"} and len(rows) == 9
    assert all(r["vs_mpi"] == 1.0 for r in rows if r["method"] == "mpi")
    assert all(r["wrong"] == 0 and r["wire"] > 0 for r in rows)
