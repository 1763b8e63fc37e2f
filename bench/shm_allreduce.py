"""The node-local allreduce from Python against mpi4py and against the machine's memory, on hot
and on cold buffers: what fraction of the single-copy bound each size reaches.

    mpirun -n 2 python bench/shm_allreduce.py                    # 4 KiB .. 64 MiB, float32 sum
    mpirun -n 2 python bench/shm_allreduce.py -s 256K,16M,64M -r 15 --csv shm.csv
    ZCOLL_SHM_SINGLE_COPY=0 mpirun -n 2 python bench/shm_allreduce.py    # the staged path

Ways, per size and condition, taking turns in one process (each block of back-to-back calls
starts after a barrier; its time is the slowest rank's):

  shm     comm.allreduce(x, algorithm="shm", out=y)
  auto    comm.allreduce(x, out=y)
  mpi4py  MPI.COMM_WORLD.Allreduce(x, y)
  copy    np.copyto(y, x) on every rank at once: a STREAM-style copy of the same bytes, the
          single-copy bound (an allreduce must at least move its result into `out`)

Conditions (bench/allreduce_timing.py): hot, every call on one (x, y) pair, which stays in
cache when it fits; cold, (x, y) pairs taken in turn, 64 MiB of them per rank (--cold-mib), so
each call finds its buffers evicted, as a gradient allreduced once per training step does.
Both run in the same rounds, the ways and conditions shuffled per round.

Columns: time per call (us) of each way, busbw of shm (GB/s, 2(p-1)/p S / t), shm / mpi4py
(speed-up), auto / shm, and bound = copy time / shm time (1.0: the allreduce costs one copy of
its buffer). The copy's GB/s is S / t per rank. Each cell is the median of --repeats blocks;
spread = the largest interquartile range / median among the ways. Progress goes to stderr.
Compare numbers of one run only: the machine may be shared.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

import zcoll
from allreduce_timing import (
    CONDITIONS,
    Buffers,
    block,
    mpich_collectives,
    parse_size,
    slowest,
    spread,
    way_call,
    wrong,
    write_csv,
)
from mpi4py import MPI

SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
WAYS = ["shm", "auto", "mpi4py", "copy"]


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--sizes", default=SIZES, help=f"bytes per rank, K/M suffixes (default {SIZES})")
    p.add_argument("-r", "--repeats", type=int, default=11, help="blocks per way and size; median (11)")
    p.add_argument("--min-ms", type=float, default=20.0, help="a block lasts at least this long (20)")
    p.add_argument(
        "--cold-mib", type=int, default=64, help="cold: MiB of buffers per rank taken in turn (64)"
    )
    p.add_argument("-c", "--conditions", default="hot,cold", help="hot, cold or both (default hot,cold)")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    o = p.parse_args()
    try:
        o.sizes = [parse_size(s) for s in o.sizes.split(",")]
    except (ValueError, KeyError) as e:
        p.error(f"--sizes: {e}")
    o.conditions = o.conditions.split(",")
    if o.repeats < 1 or o.min_ms <= 0 or o.cold_mib < 1 or not set(o.conditions) <= set(CONDITIONS):
        p.error("--repeats, --min-ms, --cold-mib must be positive; --conditions from hot,cold")
    return o


class Ways:
    """The four ways on one size's hot and cold buffers; time(way, cond, n) -> s per call."""

    def __init__(self, comm, world, count: int, conditions: list, cold_bytes: int):
        self.world = world
        self.f = {w: way_call("zcoll" if w == "shm" else w, comm, world, "shm") for w in WAYS}
        self.bufs = {c: Buffers(count, world.rank, c, cold_bytes) for c in conditions}

    def time(self, way: str, cond: str, n: int) -> float:
        self.world.Barrier()
        return slowest(self.world, block(self.f[way], self.bufs[cond], n))

    def wrong(self, way: str) -> int:
        """Elements off the exact sum after one call on each condition's first pair (0 for copy)."""
        p, copy = self.world.size, way == "copy"
        bad = sum(wrong(self.f[way], *b.pairs[0], p, copy) for b in self.bufs.values())
        return self.world.allreduce(bad, op=MPI.SUM)


def measure(w: Ways, o: argparse.Namespace, label: str, rank: int) -> dict:
    """Samples per (way, condition): --repeats blocks each, in a shuffled order per round."""
    keys = [(way, c) for way in WAYS for c in o.conditions]
    reps = {}
    for key in keys:
        w.time(*key, 2)  # untimed: pages faulted in, the arena made
        t = max(w.time(*key, 3), 1e-7)  # three calls: one slow wake-up does not set the block length
        reps[key] = w.world.bcast(max(1, int(o.min_ms / 1e3 / t)))
    samples = {key: [] for key in keys}
    shuffle = random.Random(7)  # the same order on every rank
    for i in range(o.repeats):
        if rank == 0:
            print(f"  {label}: round {i + 1}/{o.repeats}", file=sys.stderr, flush=True)
        shuffle.shuffle(keys)
        for key in keys:
            samples[key].append(w.time(*key, reps[key]))
    return samples


def row(size: int, cond: str, p: int, samples: dict, wrong_count: int) -> dict:
    t = {w: statistics.median(samples[(w, cond)]) for w in WAYS}
    return {
        "size": size,
        "buffers": cond,
        **{f"{w} us": t[w] * 1e6 for w in WAYS},
        "shm busbw GB/s": 2 * (p - 1) / p * size / t["shm"] / 1e9,
        "copy GB/s": size / t["copy"] / 1e9,
        "shm/mpi4py": t["mpi4py"] / t["shm"],
        "auto/shm": t["shm"] / t["auto"],
        "bound": t["copy"] / t["shm"],
        "spread %": 100 * max(spread(samples[(w, cond)]) for w in WAYS),
        "#wrong": wrong_count,
    }


def print_row(r: dict) -> None:
    cells = [f"{r['size']:>10}{r['buffers']:>6}"]
    cells += [f"{v:>12.2f}" for k, v in r.items() if k not in ("size", "buffers", "spread %", "#wrong")]
    tail = f"   #wrong {r['#wrong']}" if r["#wrong"] else ""
    print("".join(cells) + f"{r['spread %']:>10.1f}" + tail, flush=True)


def main() -> int:
    o = options()
    world = MPI.COMM_WORLD
    rank, p = world.rank, world.size
    comm = zcoll.Communicator()
    rows = []
    if rank == 0:
        print(
            f"# zcoll {zcoll.__version__}, {p} rank(s), float32 sum, out given; median of {o.repeats} "
            f"blocks of >= {o.min_ms} ms, slowest rank; cold = {o.cold_mib} MiB of buffers per rank "
            f"in turn; MPIR_CVAR_DEVICE_COLLECTIVES {mpich_collectives()}; speed-ups: >1 = shm faster"
        )
        head = [*[f"{w} us" for w in WAYS], "busbw", "copy GB/s", "shm/mpi4py", "auto/shm", "bound"]
        print(f"{'size':>10}{'bufs':>6}" + "".join(f"{h:>12}" for h in head) + f"{'spread %':>10}")
    for size in o.sizes:
        w = Ways(comm, world, size // 4, o.conditions, o.cold_mib << 20)
        samples = measure(w, o, f"{size} B", rank)
        bad = {way: w.wrong(way) for way in WAYS}
        for cond in o.conditions:
            rows.append(row(size, cond, p, samples, sum(bad.values())))
            if rank == 0:
                print_row(rows[-1])
        del w  # this size's buffers go before the next size's are made
    if rank == 0 and o.csv:
        write_csv(o.csv, rows)
    comm.free()
    wrong_total = sum(r["#wrong"] for r in rows) // max(1, len(o.conditions))
    if wrong_total and rank == 0:
        print(f"error: {wrong_total} wrong elements", file=sys.stderr)
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
