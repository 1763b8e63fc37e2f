"""bench/accuracy.py: --help, and compressed training that keeps its accuracy on digits, 2 ranks
(top-1% and sign within 1.0 point of uncompressed zcoll, int4 within 0.5, with the defaults
zcoll.torch.apply_gradient_compression documents)."""

import csv
import sys

from mpi_util import ROOT, run

BENCH = ROOT / "bench" / "accuracy.py"


def test_accuracy_bench_help():
    rc, out = run([sys.executable, BENCH, "--help"], timeout=60)
    assert rc == 0 and "usage:" in out and "--warmup" in out, out


def test_topk_and_sign_keep_accuracy(tmp_path):
    """Digits, the small model, 15 epochs, Adam lr 1e-3, warm-up 10% of the steps, two seeds:
    top-1% and sign within 1.0 point of uncompressed zcoll (mean over the seeds), int4 within 0.5,
    and the uncompressed run learned."""
    table = tmp_path / "runs.csv"
    argv = ["--ranks", "2", "--seeds", "0,1", "--epochs", "15", "--models", "small", "--methods",
            "zcoll,top1%,sign,int4", "--optim", "adam", "--lr", "1e-3", "--warmup", "0.1", "--batch", "32",
            "--csv", table]  # fmt: skip
    rc, out = run([sys.executable, BENCH, *argv], timeout=600)
    assert rc == 0, out
    runs: dict = {}
    with table.open() as f:
        for r in csv.DictReader(f):
            assert (r["ranks"], r["model"]) == ("2", "small"), r
            runs.setdefault(r["method"], {})[r["seed"]] = float(r["acc"])
    methods = ("zcoll", "top1%", "sign", "int4")
    assert {m: sorted(s) for m, s in runs.items()} == {m: ["0", "1"] for m in methods}, runs
    mean = {m: 100 * sum(a.values()) / len(a) for m, a in runs.items()}
    for method, bound in (("top1%", 1.0), ("sign", 1.0), ("int4", 0.5)):
        assert mean[method] >= mean["zcoll"] - bound, f"{method} within {bound} point: {mean}"
    assert mean["zcoll"] > 94.0, f"the uncompressed run learned: {mean}"
