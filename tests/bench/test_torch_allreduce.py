"""bench/torch_allreduce.py keeps running: --help, and a short run under mpirun with no wrong
element."""

import sys

from mpi_util import ROOT, python_mpirun, run, split_ranks


def test_help():
    rc, out = run([sys.executable, ROOT / "bench/torch_allreduce.py", "--help"], timeout=60)
    assert rc == 0 and "usage:" in out, out


def test_bench_short_run():
    rc, out = python_mpirun(
        2, ROOT / "bench/torch_allreduce.py", "-b", "4K", "-e", "64K", "-n", "3", "-w", "1", timeout=180
    )
    assert rc == 0, out[-4000:]
    rank0 = split_ranks(out)[0]
    # size count | gloo us algbw busbw #wrong | zcoll us algbw busbw #wrong | ratio
    rows = [line.split() for line in rank0.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 3 and all(r[6] == "0" and r[11] == "0" for r in rows), out  # no wrong elements
