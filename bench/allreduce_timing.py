"""What bench/shm_allreduce.py and bench/python_overhead.py share: the ways to allreduce from
Python, the buffers they run on (hot or cold), the timed block, the exactness check, the CSV.

Buffers, per size and condition (every way of one condition runs on the same buffers):

  hot    one (x, out) pair, every call on it: the buffer stays in cache between calls when it
         fits (what a loop of back-to-back calls on one array measures);
  cold   enough (x, out) pairs that one cycle through them moves at least `cold_bytes` (64 MiB
         per rank by default, 8x this machine's shared L3), taken in turn: each call finds its
         buffers evicted by the calls before it, as a gradient allreduced once per training step
         finds them evicted by the step's compute.

x = rank + 1 everywhere, so the exact sum is p (p + 1) / 2 whatever the order of the additions.
Only bench/ imports this module.
"""

from __future__ import annotations

import csv
import itertools
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

CONDITIONS = ("hot", "cold")
COLD_BYTES = 64 << 20


def parse_size(text: str) -> int:
    """'256K' -> 262144; a positive multiple of 4 bytes (float32)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    n = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    if n < 4 or n % 4:
        raise ValueError(f"size {text!r}: a positive multiple of 4 bytes (float32)")
    return n


def mpich_collectives() -> str:
    """MPICH's MPIR_CVAR_DEVICE_COLLECTIVES as this process sees it (mpi4py's Allreduce uses it)."""
    return os.environ.get("MPIR_CVAR_DEVICE_COLLECTIVES", "unset (MPICH's default)")


def way_call(way: str, comm, world, algorithm: str = "shm"):
    """f(x, out) for one way: "zcoll" (comm.allreduce with `algorithm`), "auto", "mpi4py", "copy"."""
    if way == "zcoll":
        return lambda x, y: comm.allreduce(x, algorithm=algorithm, out=y)
    if way == "auto":
        return lambda x, y: comm.allreduce(x, out=y)
    if way == "mpi4py":
        return world.Allreduce
    if way == "copy":
        return lambda x, y: np.copyto(y, x)
    raise ValueError(f"unknown way {way!r}")


class Buffers:
    """The (x, out) pairs of one size and condition, handed out in turn across blocks."""

    def __init__(self, count: int, rank: int, condition: str, cold_bytes: int = COLD_BYTES, convert=None):
        pairs = 1 if condition == "hot" else max(1, -(-cold_bytes // (8 * count)))
        convert = convert or (lambda a: a)
        # out filled too: its pages are touched before the first timed call
        self.pairs = [
            (convert(np.full(count, rank + 1, np.float32)), convert(np.full(count, -1, np.float32)))
            for _ in range(pairs)
        ]
        self._turn = itertools.cycle(self.pairs)

    def take(self, n: int):
        return itertools.islice(self._turn, n)


def block(f, bufs: Buffers, n: int) -> float:
    """Seconds per call over n back-to-back calls of f on bufs (this rank's clock)."""
    work = list(bufs.take(n))  # the pairs chosen before the clock starts
    t0 = time.perf_counter()
    for x, y in work:
        f(x, y)
    return (time.perf_counter() - t0) / n


def wrong(f, x, y, p: int, copy: bool = False) -> int:
    """Elements of y off the exact result after one call f(x, y) (the copy: off x)."""
    y[:] = -1
    f(x, y)
    got = np.asarray(y, dtype=np.float64)
    want = np.asarray(x, dtype=np.float64) if copy else p * (p + 1) / 2
    return int(np.count_nonzero(got != want))


def slowest(world, seconds: float) -> float:
    return world.allreduce(seconds, op=MPI.MAX)


def spread(samples: list) -> float:
    """Interquartile range / median (range / median below 4 samples)."""
    if len(samples) < 4:
        return (max(samples) - min(samples)) / statistics.median(samples)
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / q[1]


def write_csv(path, rows: list) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
