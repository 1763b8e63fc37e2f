"""What a zcoll call from Python costs beyond the C++ collective it runs, next to mpi4py.

    python bench/python_overhead.py                 # one rank
    mpirun -n 2 python bench/python_overhead.py     # two ranks

For each size (4 B to 4 KiB by powers of 4, and 256 KiB; float32; ``out`` given, not in
place) four ways to allreduce take turns in blocks of ``--iters`` calls, in one process:

  zcoll-numpy   ``comm.allreduce(x, algorithm=A, out=out)`` on numpy arrays
  zcoll-torch   the same on CPU torch tensors (skipped when torch is not installed)
  mpi4py        ``MPI.COMM_WORLD.Allreduce(x, out)`` on the numpy arrays
  C++           ``zcoll._C.time_allreduce``: the C++ allreduce in a C++ loop, no Python

1. Every rank enters an MPI barrier before each block; a block starts with one untimed call.
2. A block's time per call is its wall time / iters (the Python for-loop's own ~20 ns included;
   the C++ loop reads the clock around each call).
3. Per way: the median over ``--repeats`` blocks, then the slowest rank's.
4. After timing, one call per way is checked against the exact sum (#wrong: elements off).

Every call runs on one hot buffer, back to back: this is the cost of the call itself. What a
training step sees at 256 KiB and above (buffers evicted between calls) is
bench/shm_allreduce.py's cold rows; its hot rows time the same thing as this file.

Columns: size, time per call (us) of each way, overhead = zcoll-from-Python - C++, and the
ratio zcoll-from-Python / mpi4py. The machine may be shared: repeat, and compare numbers of
one run only. Progress goes to stderr; ``--csv FILE`` writes the rows too.
"""

import argparse
import statistics
import sys
import time

import numpy as np
import zcoll
from allreduce_timing import mpich_collectives, slowest, way_call, wrong, write_csv
from mpi4py import MPI
from zcoll import _C

try:
    import torch
except ImportError:  # the torch column is then empty
    torch = None

SIZES = [4, 16, 64, 256, 1024, 4096, 256 * 1024]
WAYS = ["zcoll-numpy", "zcoll-torch", "mpi4py", "C++"]


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--iters", type=int, default=2000, help="calls per block (default 2000)")
    p.add_argument("-r", "--repeats", type=int, default=15, help="blocks per way and size (default 15)")
    p.add_argument("-a", "--algorithm", default="auto", help="zcoll algorithm (default auto; e.g. mpi, ring)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes per rank, comma-separated")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    o = p.parse_args()
    if o.iters < 1 or o.repeats < 1:
        p.error("--iters and --repeats must be positive")
    o.sizes = [int(s) for s in o.sizes.split(",")]
    if any(s <= 0 or s % 4 for s in o.sizes):
        p.error("--sizes: positive multiples of 4 bytes (float32)")
    return o


class Way:
    """One way to allreduce `count` floats: timed blocks, and one checked call."""

    def __init__(self, name, comm, world, count, algorithm):
        self.name, self.comm, self.world, self.count, self.algorithm = name, comm, world, count, algorithm
        self.x = np.full(count, world.rank + 1, np.float32)
        self.out = np.zeros(count, np.float32)
        if name == "zcoll-torch":
            self.x, self.out = torch.from_numpy(self.x.copy()), torch.zeros(count)

    def block(self, n: int) -> float:
        """Seconds per call over n calls (the loops are written out: no extra call per call)."""
        if self.name == "C++":
            return sum(_C.time_allreduce(self.comm, self.count, "float32", self.algorithm, n)) / n
        x, out, comm, world, algorithm = self.x, self.out, self.comm, self.world, self.algorithm
        t0 = time.perf_counter()
        if self.name == "mpi4py":
            for _ in range(n):
                world.Allreduce(x, out)
        else:
            for _ in range(n):
                comm.allreduce(x, algorithm=algorithm, out=out)
        return (time.perf_counter() - t0) / n

    def wrong(self, p: int) -> int:
        """Elements off the exact sum after one call (C++: the same allreduce from Python)."""
        way = "mpi4py" if self.name == "mpi4py" else "zcoll"
        return wrong(way_call(way, self.comm, self.world, self.algorithm), self.x, self.out, p)


def main() -> int:
    o = options()
    world = MPI.COMM_WORLD
    rank, p = world.rank, world.size
    comm = zcoll.Communicator()
    ways = [w for w in WAYS if w != "zcoll-torch" or torch is not None]
    if torch is not None:
        torch.set_num_threads(1)
    rows = []
    if rank == 0:
        print(
            f"# zcoll {zcoll.__version__}, {p} rank(s), algorithm={o.algorithm}, float32, out given; "
            f"median of {o.repeats} blocks of {o.iters} calls on one hot buffer, slowest rank; "
            f"MPIR_CVAR_DEVICE_COLLECTIVES {mpich_collectives()}"
        )
        head = [
            "size",
            *[f"{w} us" for w in WAYS],
            "overhead np us",
            "overhead torch us",
            "np/mpi4py",
            "torch/mpi4py",
        ]
        print("".join(f"{h:>18}" for h in head))
    wrong_total = 0
    for size in o.sizes:
        count = size // 4
        objs = {w: Way(w, comm, world, count, o.algorithm) for w in ways}
        times = {w: [] for w in ways}
        for r in range(o.repeats):
            if rank == 0:
                print(f"  {size} B: block {r + 1}/{o.repeats}", file=sys.stderr, flush=True)
            for w in ways:  # round robin: drift of a shared machine hits every way alike
                world.Barrier()
                objs[w].block(1)
                times[w].append(objs[w].block(o.iters))
        med = {w: slowest(world, statistics.median(times[w])) * 1e6 for w in ways}
        bad = sum(world.allreduce(objs[w].wrong(p), op=MPI.SUM) for w in ways)
        wrong_total += bad
        cpp, mpi = med["C++"], med["mpi4py"]
        npy, tch = med["zcoll-numpy"], med.get("zcoll-torch")
        row = {
            "size": size,
            **{f"{w} us": med.get(w) for w in WAYS},
            "overhead np us": npy - cpp,
            "overhead torch us": None if tch is None else tch - cpp,
            "np/mpi4py": npy / mpi,
            "torch/mpi4py": None if tch is None else tch / mpi,
            "#wrong": bad,
        }
        rows.append(row)
        if rank == 0:
            cells = [f"{size:>18}"] + [
                f"{'-' if v is None else format(v, '.3f'):>18}"
                for k, v in row.items()
                if k not in ("size", "#wrong")
            ]
            print("".join(cells) + (f"   #wrong {bad}" if bad else ""), flush=True)
    if rank == 0 and o.csv:
        write_csv(o.csv, rows)
    comm.free()
    if wrong_total and rank == 0:
        print(f"error: {wrong_total} wrong elements", file=sys.stderr)
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
