"""The boundary rules on every rank of a real job (any world size):

    PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/boundary.py

1. In-place forms: allgather with x = out[rank], reduce_scatter with out = this rank's block of
   x, allreduce / reduce / compressed allreduce with out = x (another object over the same
   memory): right results, numpy and torch.
2. Partial overlaps of x and out raise ValueError on every rank before any traffic (the
   counters do not move), and the communicator works afterwards.
3. Enums in place of names, on every rank.
"""

from __future__ import annotations

from harness import Checks, run_cases

# isort: split
import numpy as np
import torch
import zcoll
from zcoll import _C

N = 5  # elements per rank block


def values(rank: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64) + 100 * rank


def case_in_place(ck: Checks) -> None:
    comm = COMM
    p, rank = comm.size, comm.rank
    for kind in ("numpy", "torch"):

        def make(v, kind=kind):
            a = np.asarray(v, np.float32)
            return torch.from_numpy(a.copy()) if kind == "torch" else a.copy()

        def read(a):
            return np.asarray(a, np.float64)

        buf = make(np.zeros(N * p))
        block = buf[rank * N : (rank + 1) * N]
        block[:] = make(values(rank, N))
        res = comm.allgather(block, out=buf)
        expected = np.concatenate([values(r, N) for r in range(p)])
        ck.check(
            res is buf and read(buf).tolist() == expected.tolist(),
            f"{kind} allgather x = out[rank]",
            f"got {read(buf).tolist()}",
        )

        count = N * p + 2  # uneven blocks
        x = make(np.stack([values(r, count) for r in [rank]])[0])
        blocks = zcoll.block_range(count, p, rank)
        mine = x[blocks.start : blocks.stop]
        res = comm.reduce_scatter(x, out=mine)
        total = sum(values(r, count) for r in range(p))[blocks.start : blocks.stop]
        ck.check(
            res is mine and read(mine).tolist() == total.tolist(),
            f"{kind} reduce_scatter out = block of x",
            f"got {read(mine).tolist()}, expected {total.tolist()}",
        )

        x = make(values(rank, N))
        comm.allreduce(x, out=x[:])
        ck.check(
            read(x).tolist() == sum(values(r, N) for r in range(p)).tolist(),
            f"{kind} allreduce out=x[:]",
            f"got {read(x).tolist()}",
        )

        x = make(values(rank, N))
        res = comm.reduce(x, root=p - 1, op="max", out=x[:])
        if rank == p - 1:
            ck.check(
                read(x).tolist() == values(p - 1, N).tolist(), f"{kind} reduce out=x[:]", f"got {read(x)}"
            )
        else:
            ck.check(res is None, f"{kind} reduce out=x[:] off the root", f"returned {res!r}")

        x = make(values(rank, 300))
        y = comm.allreduce(make(values(rank, 300)), compression=zcoll.HalfPrecision())
        comm.allreduce(x, out=x[:], compression=zcoll.HalfPrecision())
        ck.check(read(x).tolist() == read(y).tolist(), f"{kind} compressed allreduce out=x[:]", "differs")


def case_partial_overlaps(ck: Checks) -> None:
    comm = COMM
    p = comm.size
    b = np.zeros(64 * p, np.float32)
    t = torch.zeros(64 * p)
    calls = [
        ("allreduce", lambda: comm.allreduce(b[: 16 * p], out=b[4 : 4 + 16 * p])),
        ("allreduce torch", lambda: comm.allreduce(t[4 : 4 + 16 * p], out=t[: 16 * p])),
        ("reduce", lambda: comm.reduce(b[:16], root=p - 1, out=b[1:17])),
        ("allgather", lambda: comm.allgather(b[:8], out=b[1 : 1 + 8 * p])),
        (
            "allgather at another rank's block",
            lambda: comm.allgather(
                b[8 * ((comm.rank + 1) % p) : 8 * ((comm.rank + 1) % p) + 8], out=b[: 8 * p]
            ),
        ),
        ("reduce_scatter", lambda: comm.reduce_scatter(b[: 8 * p], out=b[8 * p - 9 : 8 * p - 1])),
        (
            "compressed allreduce",
            lambda: comm.allreduce(b[:32], out=b[16:48], compression=zcoll.HalfPrecision()),
        ),
    ]
    for name, call in calls:
        before = comm.stats()
        ck.raises(ValueError, call, "share memory", "in-place", what=f"{name} partial overlap")
        ck.check(comm.stats() == before, name, f"traffic counters moved: {before} -> {comm.stats()}")
    res = comm.allreduce(np.ones(3, np.float32))
    ck.check(res.tolist() == [p] * 3, "allreduce after the errors", f"got {res.tolist()}")


def case_enums(ck: Checks) -> None:
    comm = COMM
    p = comm.size
    x = np.full(7, comm.rank + 1.0, np.float32)
    comm.set_topology(np.full((p, p), 1e9))  # ordered_ring needs one
    for algorithm in _C.Algorithm.__members__.values():
        res = comm.allreduce(x, op=_C.ReduceOp.sum, algorithm=algorithm)
        ck.check(
            res.tolist() == [p * (p + 1) / 2] * 7, f"allreduce algorithm={algorithm}", f"got {res.tolist()}"
        )
    comm.set_topology(None)


if __name__ == "__main__":
    COMM = zcoll.Communicator()
    run_cases(globals(), teardown=COMM.free)
