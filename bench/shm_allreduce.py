"""The node-local allreduce from Python against mpi4py and against the machine's memory: what
fraction of the single-copy bound each size reaches.

    mpirun -n 2 python bench/shm_allreduce.py                    # 4 KiB .. 64 MiB, float32 sum
    mpirun -n 2 python bench/shm_allreduce.py -s 256K,16M,64M -r 15 --csv shm.csv
    ZCOLL_SHM_SINGLE_COPY=0 mpirun -n 2 python bench/shm_allreduce.py    # the staged path

Ways, per size, taking turns in one process (each block starts after a barrier; its time is
the slowest rank's):

  shm     comm.allreduce(x, algorithm="shm", out=y)
  auto    comm.allreduce(x, out=y)
  mpi4py  MPI.COMM_WORLD.Allreduce(x, y)
  copy    np.copyto(y, x) on every rank at once: a STREAM-style copy of the same bytes, the
          single-copy bound (an allreduce must at least move its result into `out`)

Columns: time per call (us) of each way, busbw of shm (GB/s, 2(p-1)/p S / t), shm / mpi4py
(speed-up), auto / shm, and bound = copy time / shm time (1.0: the allreduce costs one copy of
its buffer). The copy's GB/s is S / t per rank. Each cell is the median of --repeats blocks;
spread = the largest interquartile range / median among the ways. Progress goes to stderr.
Compare numbers of one run only: the machine may be shared.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time

import numpy as np
import zcoll
from mpi4py import MPI

SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
WAYS = ["shm", "auto", "mpi4py", "copy"]


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    n = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    if n < 4 or n % 4:
        raise ValueError(f"size {text!r}: a positive multiple of 4 bytes (float32)")
    return n


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--sizes", default=SIZES, help=f"bytes per rank, K/M suffixes (default {SIZES})")
    p.add_argument("-r", "--repeats", type=int, default=11, help="blocks per way and size; median (11)")
    p.add_argument("--min-ms", type=float, default=20.0, help="a block lasts at least this long (20)")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    o = p.parse_args()
    try:
        o.sizes = [parse_size(s) for s in o.sizes.split(",")]
    except (ValueError, KeyError) as e:
        p.error(f"--sizes: {e}")
    if o.repeats < 1 or o.min_ms <= 0:
        p.error("--repeats and --min-ms must be positive")
    return o


class Ways:
    """The four ways on one size's buffers; block(way, n) -> seconds per call (slowest rank)."""

    def __init__(self, comm, world, count: int):
        self.comm, self.world = comm, world
        self.x = np.full(count, world.rank + 1, np.float32)
        self.y = np.zeros(count, np.float32)

    def call(self, way: str) -> None:
        if way == "shm":
            self.comm.allreduce(self.x, algorithm="shm", out=self.y)
        elif way == "auto":
            self.comm.allreduce(self.x, out=self.y)
        elif way == "mpi4py":
            self.world.Allreduce(self.x, self.y)
        else:
            np.copyto(self.y, self.x)

    def block(self, way: str, n: int) -> float:
        self.world.Barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            self.call(way)
        return self.world.allreduce((time.perf_counter() - t0) / n, op=MPI.MAX)

    def wrong(self, way: str) -> int:
        """Elements off the exact sum after one call (0 for the copy)."""
        self.y[:] = -1
        self.call(way)
        p = self.world.size
        want = self.x if way == "copy" else np.float32(p * (p + 1) / 2)
        return self.world.allreduce(int(np.count_nonzero(self.y != want)), op=MPI.SUM)


def spread(samples: list) -> float:
    if len(samples) < 4:
        return (max(samples) - min(samples)) / statistics.median(samples)
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / q[1]


def measure(w: Ways, repeats: int, min_s: float, label: str, rank: int) -> dict:
    reps = {}
    for way in WAYS:
        w.call(way)  # untimed: buffers faulted in, the arena made
        reps[way] = max(1, int(min_s / max(w.block(way, 1), 1e-7)))
        reps[way] = w.world.bcast(reps[way])
    samples = {way: [] for way in WAYS}
    order = list(WAYS)
    shuffle = random.Random(7)  # the same order on every rank
    for i in range(repeats):
        if rank == 0:
            print(f"  {label}: round {i + 1}/{repeats}", file=sys.stderr, flush=True)
        shuffle.shuffle(order)
        for way in order:
            samples[way].append(w.block(way, reps[way]))
    return samples


def row(size: int, p: int, samples: dict, wrong: int) -> dict:
    t = {w: statistics.median(v) for w, v in samples.items()}
    return {
        "size": size,
        **{f"{w} us": t[w] * 1e6 for w in WAYS},
        "shm busbw GB/s": 2 * (p - 1) / p * size / t["shm"] / 1e9,
        "copy GB/s": size / t["copy"] / 1e9,
        "shm/mpi4py": t["mpi4py"] / t["shm"],
        "auto/shm": t["shm"] / t["auto"],
        "bound": t["copy"] / t["shm"],
        "spread %": 100 * max(spread(v) for v in samples.values()),
        "#wrong": wrong,
    }


def main() -> int:
    o = options()
    world = MPI.COMM_WORLD
    rank, p = world.rank, world.size
    comm = zcoll.Communicator()
    rows, wrong_total = [], 0
    if rank == 0:
        print(
            f"# zcoll {zcoll.__version__}, {p} rank(s), float32 sum, out given; median of {o.repeats} "
            f"blocks of >= {o.min_ms} ms, slowest rank; speed-ups: >1 = shm faster"
        )
        head = ["size", *[f"{w} us" for w in WAYS], "busbw", "copy GB/s", "shm/mpi4py", "auto/shm", "bound"]
        print("".join(f"{h:>12}" for h in head) + f"{'spread %':>10}")
    for size in o.sizes:
        w = Ways(comm, world, size // 4)
        samples = measure(w, o.repeats, o.min_ms / 1e3, f"{size} B", rank)
        wrong = sum(w.wrong(way) for way in WAYS)
        wrong_total += wrong
        r = row(size, p, samples, wrong)
        rows.append(r)
        if rank == 0:
            cells = [f"{size:>12}"] + [
                f"{v:>12.2f}" for k, v in r.items() if k not in ("size", "spread %", "#wrong")
            ]
            print(
                "".join(cells) + f"{r['spread %']:>10.1f}" + (f"   #wrong {wrong}" if wrong else ""),
                flush=True,
            )
    if rank == 0 and o.csv:
        with open(o.csv, "w", newline="") as f:
            cw = csv.DictWriter(f, fieldnames=list(rows[0]))
            cw.writeheader()
            cw.writerows(rows)
    comm.free()
    if wrong_total and rank == 0:
        print(f"error: {wrong_total} wrong elements", file=sys.stderr)
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
