"""bench/emulated_network.py as a script: its refusals where namespaces or traffic control are
refused (stand-in `ip` and `tc`), --help, and its table from a saved CSV (--from-csv) of a real,
unthrottled zcoll_allreduce_perf run."""

from __future__ import annotations

import os
import sys

import pytest
from mpi_util import BIN_DIR, ROOT, mpirun, run

SCRIPT = ROOT / "bench" / "emulated_network.py"


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
    flags = ["-b", "4K", "-e", "256K", "-f", "8", "-n", "2", "-w", "1", "-a", "ring", "-z", "none,int8"]
    rc, out = mpirun(2, BIN_DIR / "zcoll_allreduce_perf", *flags, "--csv", str(path), timeout=180)
    assert rc == 0, out
    argv = [sys.executable, SCRIPT, "--from-csv", path, "--throughput", "1e8", "--out", tmp_path]
    rc, out = run(argv, timeout=120)
    assert rc == 0, out
    # | size | method | time ms | vs MPI | wire/rank B | link ms | time/link | rel err | #wrong |
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines()]
    rows = [r for r in rows if len(r) == 9 and r[0][:1].isdigit()]
    assert {r[1] for r in rows} == {"none (ring)", "int8", "mpi"} and len(rows) == 9, out
    assert all(float(r[3].rstrip("x")) == 1.0 for r in rows if r[1] == "mpi"), out
    assert all(int(r[8]) == 0 and float(r[4]) > 0 for r in rows), out
    assert (tmp_path / "emulated_network.png").stat().st_size > 0
