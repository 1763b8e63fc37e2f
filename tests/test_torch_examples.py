"""The example and the benchmark keep running: short versions under mpirun, and --help."""

import sys
from pathlib import Path

import pytest
from torch_util import mpirun_exe, run

ROOT = Path(__file__).resolve().parent.parent
ENV = {"MPIR_CVAR_DEVICE_COLLECTIVES": "none", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("script", ["examples/train_digits.py", "bench/torch_allreduce.py"])
def test_help(script):
    res = run([sys.executable, str(ROOT / script), "--help"], timeout=60)
    assert res.returncode == 0 and "usage:" in res.stdout, res.stdout


def test_train_digits_short_run(tmp_path):
    png = tmp_path / "loss.png"
    cmd = [
        mpirun_exe(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "mpi4py",
        str(ROOT / "examples/train_digits.py"),
        "--configs",
        "gloo,zcoll,accum4",
        "--epochs",
        "2",
        "--png",
        str(png),
    ]
    res = run(cmd, timeout=180, env=ENV)
    assert res.returncode == 0, res.stdout[-4000:]
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines() if line[:1].isalpha()}
    assert {"gloo", "zcoll", "accum4"} <= rows.keys(), res.stdout
    acc = {k: float(rows[k][1].rstrip("%")) for k in ("gloo", "zcoll", "accum4")}
    assert abs(acc["zcoll"] - acc["gloo"]) <= 1.0 and abs(acc["accum4"] - acc["zcoll"]) <= 1.0, res.stdout
    assert png.stat().st_size > 1000


def test_bench_short_run():
    cmd = [
        mpirun_exe(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "mpi4py",
        str(ROOT / "bench/torch_allreduce.py"),
        "-b",
        "4K",
        "-e",
        "64K",
        "-n",
        "3",
        "-w",
        "1",
    ]
    res = run(cmd, timeout=180, env=ENV)
    assert res.returncode == 0, res.stdout[-4000:]
    rows = [line.split() for line in res.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 3 and all(r[6] == "0" and r[11] == "0" for r in rows), res.stdout  # no wrong elements
