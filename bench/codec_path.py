"""The public codec path against its kernels: GradientQuantizer(bits=8) and TopK(ratio=0.01)
from Python next to the C++ kernels they run, per size, in one process.

    python bench/codec_path.py                          # 1, 4, 16, 64 MiB of float32
    python bench/codec_path.py -s 256K,64M -r 21 --csv codec.csv

Rows (every rate in GB/s of float32 input, GB = 1e9 B; x memcpy = the same size's memcpy):

  int8 compress     kernel: _C.quantize into preallocated codes and scales;
                    public: q.compress(x, out=p) (payload reused) and q.compress(x) (new payload)
  int8 decompress   kernel: _C.dequantize into a preallocated float32 array;
                    public: q.decompress(p, out=y) and q.decompress(p) (new array)
  top-1% compress   kernel: _C.topk (sampled) of the whole tensor, k = 1% (the global top-k);
                    public: t.compress(x, out=p) and t.compress(x): the blockwise top-k of
                    TopK.segments(n), each segment's own sampled selection
  top-1% compress,  the same with the kernel drawing a new sample (seed) every call, as the
    seed per call  public path does; one fixed seed lets every call find the same positions
                    in the caches and the branch predictor trained
  top-1% compress,  kernel: _C.topk (sampled) of each of TopK.segments(n) in turn, each sampling
    S segments     _C.topk_sample_share(n, len) positions: the work the public path runs, so
                    public/kernel is its call path's cost alone
  top-1% decompress kernel: zero-fill + _C.scatter_add of the pairs;
                    public: t.decompress(p, out=y) and t.decompress(p)
  + error feedback  (--ef) int8 with a key: _C.quantize_ef against q.compress(x, key=..., out=p)

Method: 1. per size, N(0,1) data with per-256-block magnitudes from 1e-3 to 1e3 (as
zcoll_kernels_perf); 2. check: the public payload and output against the kernels' (#wrong: bytes
that differ; top-k: the pairs against a kernel selection of each segment); 3. timing: R rounds,
each runs every way once in a shuffled order (so a noisy neighbour slows all of them alike), a
way's sample = wall time of enough back-to-back calls to last --min-ms; a row reports the median
round and the spread (interquartile range / median, the larger of kernel and public).
public/kernel is the ratio of the medians; the top-1% compress row also gives public/segments,
its public rate against the kernel over the same segments (the next row's kernel), so both ratios
stand side by side. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
import statistics
import sys
import time

import numpy as np
import zcoll
from zcoll import _C

F32 = 0  # the kernels' dtype code of float32
SIZES = "1M,4M,16M,64M"


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    n = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    if n < 4 or n % 4:
        raise argparse.ArgumentTypeError(f"size {text!r}: a positive multiple of 4 bytes (float32)")
    return n


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "-s", "--sizes", default=SIZES, help=f"bytes of float32 input, K/M suffixes (default {SIZES})"
    )
    p.add_argument("-r", "--repeats", type=int, default=11, help="timing rounds; the median is reported (11)")
    p.add_argument(
        "--min-ms", type=float, default=5.0, help="each sample repeats calls to last this long (5)"
    )
    p.add_argument("--ef", action="store_true", help="also int8 with error feedback (a key: quantize_ef)")
    p.add_argument("--seed", type=int, default=1, help="data seed (1)")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    o = p.parse_args()
    try:
        o.sizes = [parse_size(s) for s in o.sizes.split(",")]
    except (ValueError, KeyError, argparse.ArgumentTypeError) as e:
        p.error(f"--sizes: {e}")
    if o.repeats < 1 or o.min_ms <= 0:
        p.error("--repeats and --min-ms must be positive")
    return o


def data(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    blocks = -(-n // 256)
    mag = (10.0 ** rng.uniform(-3, 3, blocks)).astype(np.float32)
    x *= np.repeat(mag, 256)[:n]
    return x


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


class Row:
    """One operation at one size: a kernel way and public ways (name -> call), their samples."""

    def __init__(self, name: str, kernel, public: dict):
        self.name, self.ways = name, {"kernel": kernel, **public}
        self.samples = {w: [] for w in self.ways}
        self.wrong = 0
        self.segments = None  # top-1% compress: the row of the kernel over the same segments

    def calls_per_sample(self, min_s: float) -> int:
        t0 = time.perf_counter()
        self.ways["kernel"]()
        return max(1, int(min_s / max(time.perf_counter() - t0, 1e-7)))


def int8_rows(x: np.ndarray, ef: bool) -> list:
    n = x.size
    q = zcoll.GradientQuantizer(bits=8)
    blocks = _C.num_blocks(n, 256)
    codes, scales = np.empty(n, np.uint8), np.empty(blocks, np.float32)
    y_kernel, y = np.empty(n, np.float32), np.empty(n, np.float32)
    _C.quantize(addr(x), F32, n, addr(codes), addr(scales))
    _C.dequantize(addr(codes), addr(scales), n, addr(y_kernel))
    payload = q.compress(x)
    compress = Row(
        "int8 compress",
        lambda: _C.quantize(addr(x), F32, n, addr(codes), addr(scales)),
        reused({"public": lambda: q.compress(x, out=payload), "public new": lambda: q.compress(x)}),
    )
    compress.wrong = mismatch(payload.arrays["codes"], codes) + mismatch(payload.arrays["scales"], scales)
    decompress = Row(
        "int8 decompress",
        lambda: _C.dequantize(addr(codes), addr(scales), n, addr(y_kernel)),
        {"public": lambda: q.decompress(payload, out=y), "public new": lambda: q.decompress(payload)},
    )
    q.decompress(payload, out=y)
    decompress.wrong = mismatch(y, y_kernel)
    rows = [compress, decompress]
    if ef:
        e_kernel, e_public = np.zeros(n, np.float32), np.zeros(n, np.float32)
        qe = zcoll.GradientQuantizer(bits=8)
        qe.set_residual("g", e_public)
        ef_payload = qe.compress(x, key="g")
        _C.quantize_ef(addr(x), F32, addr(e_kernel), n, addr(codes), addr(scales))
        wrong = mismatch(ef_payload.arrays["codes"], codes) + mismatch(qe.residual("g"), e_kernel)
        row = Row(
            "int8 compress + error feedback",
            lambda: _C.quantize_ef(addr(x), F32, addr(e_kernel), n, addr(codes), addr(scales)),
            reused({"public": lambda: qe.compress(x, key="g", out=ef_payload)}),
        )
        row.wrong = wrong
        rows.append(row)
    return rows


def topk_rows(x: np.ndarray, seed: int) -> list:
    n = x.size
    t = zcoll.TopK(ratio=0.01)
    k = _C.sparse_k(n, 0.01)
    idx, val = np.empty(k, np.uint32), np.empty(k, np.float32)
    y_kernel, y = np.empty(n, np.float32), np.empty(n, np.float32)
    payload = t.compress(x)
    pi, pv = payload.arrays["indices"], payload.arrays["values"]

    def kernel_decompress():
        y_kernel.fill(0.0)
        _C.scatter_add(addr(y_kernel), n, addr(pi), addr(pv), pi.size)

    segments = t.segments(n)
    seg_idx, seg_val = np.empty(pi.size, np.uint32), np.empty(pv.size, np.float32)

    # Each segment samples its share of the whole tensor's sample, as the public path does.
    shares = [_C.topk_sample_share(n, e - b) for b, e, _ in segments]

    def kernel_segments():  # the selections the public path runs: the same kernel, segment by segment
        at = 0
        for (b, e, kj), share in zip(segments, shares):
            _C.topk(
                addr(x) + 4 * b,
                e - b,
                kj,
                addr(seg_idx) + 4 * at,
                addr(seg_val) + 4 * at,
                "sampled",
                seed,
                sample=share,
            )
            at += kj

    public = {"public": lambda: t.compress(x, out=payload), "public new": lambda: t.compress(x)}
    compress = Row("top-1% compress", lambda: _C.topk(addr(x), n, k, addr(idx), addr(val), "sampled", seed),
                   reused(dict(public)))  # fmt: skip
    compress.wrong = topk_mismatch(t, x, pi, pv)
    seeds = itertools.count(seed + 1)  # the public path draws a new sample every call
    fresh = Row("top-1% compress, seed per call",
                lambda: _C.topk(addr(x), n, k, addr(idx), addr(val), "sampled", next(seeds)), reused(dict(public)))  # fmt: skip
    fresh.wrong = compress.wrong
    per_segment = Row(f"top-1% compress, {len(segments)} segments", kernel_segments, reused(dict(public)))
    per_segment.wrong = compress.wrong
    compress.segments = per_segment
    decompress = Row(
        "top-1% decompress",
        kernel_decompress,
        {"public": lambda: t.decompress(payload, out=y), "public new": lambda: t.decompress(payload)},
    )
    kernel_decompress()
    t.decompress(payload, out=y)
    decompress.wrong = mismatch(y, y_kernel)
    return [compress, fresh, per_segment, decompress]


def reused(ways: dict) -> dict:
    """The ways without "public" where compress() takes no out= (an older zcoll, for before /
    after comparisons)."""
    try:
        ways["public"]()
    except TypeError:
        return {k: v for k, v in ways.items() if k != "public"}
    return ways


def mismatch(a: np.ndarray, b: np.ndarray) -> int:
    """Bytes that differ between two arrays of one size."""
    return int(np.count_nonzero(np.asarray(a).view(np.uint8) != np.asarray(b).view(np.uint8)))


def topk_mismatch(t, x: np.ndarray, pi: np.ndarray, pv: np.ndarray) -> int:
    """Bytes of the public pairs that differ from an exact kernel selection of each segment."""
    wrong, at = 0, 0
    for b, e, kj in t.segments(x.size):
        i, v = np.empty(kj, np.uint32), np.empty(kj, np.float32)
        seg = np.ascontiguousarray(x[b:e])
        _C.topk(addr(seg), e - b, kj, addr(i), addr(v), "exact", 0)
        wrong += mismatch(pi[at : at + kj], i + np.uint32(b)) + mismatch(pv[at : at + kj], v)
        at += kj
    return wrong + (pi.size - at) * 8


def measure(rows: list, memcpy, repeats: int, min_s: float, label: str) -> list:
    """Fills each row's samples (seconds per call); returns memcpy's."""
    copies: list = []
    ways = [(r.ways[w], r.samples[w]) for r in rows for w in r.ways] + [(memcpy, copies)]
    reps = []
    for fn, _ in ways:
        t0 = time.perf_counter()
        fn()
        reps.append(max(1, int(min_s / max(time.perf_counter() - t0, 1e-7))))
    order = list(range(len(ways)))
    for i in range(repeats):
        print(f"  {label}: round {i + 1}/{repeats}", file=sys.stderr, flush=True)
        random.shuffle(order)
        for j in order:
            fn, samples = ways[j]
            fn()  # one untimed call: caches and page tables as the timed ones find them
            t0 = time.perf_counter()
            for _ in range(reps[j]):
                fn()
            samples.append((time.perf_counter() - t0) / reps[j])
    return copies


def spread(samples: list) -> float:
    """Interquartile range / median."""
    if len(samples) < 4:
        return (max(samples) - min(samples)) / statistics.median(samples)
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / q[1]


def summarise(size: int, row: Row, copy_s: float) -> dict:
    rate = {w: size / statistics.median(v) / 1e9 for w, v in row.samples.items()}
    out = {
        "size": size,
        "op": row.name,
        "memcpy GB/s": size / copy_s / 1e9,
        "kernel GB/s": rate["kernel"],
        "kernel x memcpy": rate["kernel"] * copy_s * 1e9 / size,
        "public GB/s": rate.get("public"),
        "public/kernel": rate["public"] / rate["kernel"] if "public" in rate else None,
        "public new GB/s": rate.get("public new"),
        "new/kernel": rate["public new"] / rate["kernel"] if "public new" in rate else None,
        "public/segments": None,
        "spread %": 100 * max(spread(v) for v in row.samples.values()),
        "#wrong": row.wrong,
    }
    if row.segments is not None and "public" in rate:  # both targets of top-1% compress side by side
        out["public/segments"] = statistics.median(row.segments.samples["kernel"]) / statistics.median(
            row.samples["public"]
        )
    return out


COLUMNS = [
    ("size", 9),
    ("op", 31),
    ("memcpy GB/s", 12),
    ("kernel GB/s", 12),
    ("kernel x memcpy", 16),
    ("public GB/s", 12),
    ("public/kernel", 14),
    ("public new GB/s", 16),
    ("new/kernel", 11),
    ("public/segments", 16),
    ("spread %", 9),
    ("#wrong", 7),
]


def cell(v, width: int) -> str:
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, float):
        return f"{v:>{width}.2f}"
    return f"{v:>{width}}"


def size_name(n: int) -> str:
    for unit, b in (("M", 1 << 20), ("K", 1 << 10)):
        if n % b == 0:
            return f"{n // b}{unit}"
    return str(n)


def main() -> int:
    o = options()
    random.seed(o.seed)
    print(
        f"# zcoll {zcoll.__version__}, SIMD {_C.simd_level()}; "
        f"GB/s of float32 input; median of {o.repeats} rounds, each >= {o.min_ms} ms per way"
    )
    print("".join(f"{h:>{w}}" for h, w in COLUMNS))
    rows, wrong = [], 0
    for size in o.sizes:
        x = data(size // 4, o.seed)
        dst = np.empty_like(x)
        ops = int8_rows(x, o.ef) + topk_rows(x, o.seed)
        copies = measure(ops, lambda d=dst, s=x: np.copyto(d, s), o.repeats, o.min_ms / 1e3, size_name(size))
        copy_s = statistics.median(copies)
        for r in ops:
            row = summarise(size, r, copy_s)
            row["size"] = size_name(size)
            rows.append(row)
            wrong += r.wrong
            print("".join(cell(row[h], w) for h, w in COLUMNS), flush=True)
    if o.csv:
        with open(o.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if wrong:
        print(f"error: {wrong} bytes differ between the public path and the kernels", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
