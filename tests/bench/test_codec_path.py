"""bench/codec_path.py: --help, and a short run whose rows are complete, checked (#wrong 0) and
whose CSV has every row; its refusal of a size that is not whole float32s."""

from __future__ import annotations

import csv
import re
import sys

from mpi_util import ROOT, run

BENCH = ROOT / "bench" / "codec_path.py"
OPS = ["int8 compress", "int8 decompress", "int8 compress + error feedback", "top-1% compress",
       "top-1% compress, seed per call",
       "top-1% compress, segments", "top-1% decompress"]  # fmt: skip


def test_codec_path_benchmark(tmp_path):
    rc, out = run([sys.executable, BENCH, "--help"], timeout=60)
    assert rc == 0 and "public/kernel" in out and "--csv" in out
    csv_file = tmp_path / "codec.csv"
    rc, out = run(
        [sys.executable, BENCH, "-s", "64K,256K", "-r", "2", "--min-ms", "1", "--ef", "--csv", csv_file],
        timeout=120,
    )
    assert rc == 0, out
    rows = list(csv.DictReader(csv_file.open()))
    # the per-segment row is named with its count of segments: "top-1% compress, 8 segments"
    assert [re.sub(r", \d+ segments", ", segments", r["op"]) for r in rows] == 2 * OPS, out
    for r in rows:
        assert r["#wrong"] == "0" and float(r["kernel GB/s"]) > 0 and float(r["public GB/s"]) > 0, r
    rc, out = run([sys.executable, BENCH, "-s", "6"], timeout=60)
    assert rc != 0 and "multiple of 4" in out
