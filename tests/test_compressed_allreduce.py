"""Compressed allreduce on 1..4 ranks under mpirun (tests/mpi/compressed_allreduce.py) and the
`zcoll_allreduce_perf -z` benchmark."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_util import BIN_DIR, mpirun, run_script


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
@pytest.mark.parametrize("suite", ["identical", "feedback", "nonfinite"])
def test_compressed_allreduce(suite, nprocs):
    out = run_script("compressed_allreduce.py", nprocs, suite, timeout=180)
    assert f"[0] OK {suite}" in out, out[-5000:]


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


def rows(out):
    return [
        line[4:].split()
        for line in out.splitlines()
        if line.startswith("[0] ") and line[4:].strip() and not line[4:].lstrip().startswith("#")
    ]


@pytest.mark.parametrize(
    "nprocs,flags",
    [(2, []), (3, ["-d", "bfloat16", "-o", "avg", "-i"]), (4, ["-d", "float16", "-a", "ring"])],
)
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
    ratio = lambda name: float(by[(name, str(size))]["ratio"])
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
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert message in r.stderr
    calls = log.read_text()
    if not ip_fails:
        assert "ip netns del zcoll-net-" in calls, "the namespace is deleted after a failed set-up"


def test_emulated_network_help():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0 and "tbf rate 1gbit" in r.stdout and "--ranks" in r.stdout
