"""examples/train_digits.py keeps running: --help, a short run under mpirun whose configurations
learn alike, and guarded sign escalating."""

import sys

from mpi_util import ROOT, python_mpirun, run, split_ranks


def test_help():
    rc, out = run([sys.executable, ROOT / "examples/train_digits.py", "--help"], timeout=60)
    assert rc == 0 and "usage:" in out, out


def test_train_digits_short_run(tmp_path):
    png = tmp_path / "loss.png"
    rc, out = python_mpirun(
        2,
        ROOT / "examples/train_digits.py",
        "--configs",
        "gloo,zcoll,accum4",
        "--epochs",
        "2",
        "--png",
        png,
        timeout=180,
    )
    assert rc == 0, out[-4000:]
    rank0 = split_ranks(out)[0]
    rows = {line.split()[0]: line.split() for line in rank0.splitlines() if line[:1].isalpha()}
    assert {"gloo", "zcoll", "accum4"} <= rows.keys(), out
    acc = {k: float(rows[k][1].rstrip("%")) for k in ("gloo", "zcoll", "accum4")}
    assert abs(acc["zcoll"] - acc["gloo"]) <= 1.0 and abs(acc["accum4"] - acc["zcoll"]) <= 1.0, out
    assert png.stat().st_size > 1000


def test_train_digits_guarded_sign_escalates(tmp_path):
    """guarded-sign: sign under the guard with the calibrated residual bound; error feedback owes
    more than a gradient within a few checks, so buckets run at int4 too, and the log says so."""
    rc, out = python_mpirun(
        2,
        ROOT / "examples/train_digits.py",
        "--configs",
        "guarded-sign",
        "--epochs",
        "3",
        "--png",
        tmp_path / "loss.png",
        "--guard-log",
        tmp_path / "guard",
        timeout=180,
    )
    assert rc == 0, out[-4000:]
    rank0 = split_ranks(out)[0]
    line = next(x for x in rank0.splitlines() if x.startswith("guarded-sign: bucket calls by method:"))
    assert " int4 " in line and " sign " in line and "the guard's own time" in line, line
    log = (tmp_path / "guard" / "guarded-sign.jsonl").read_text()
    assert '"event": "escalate"' in log and '"guard_cost"' in log, log[-2000:]
