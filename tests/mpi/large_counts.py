"""Counts above 2^31 elements (MPI's int counts; 2 GiB of int8 per rank):
`PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/mpi/large_counts.py [case ...]`
(any P; 2 keeps memory at ~2 GiB a rank).

Each case runs one collective on COUNT = 2^31 + 5 int8 elements in place (one buffer per rank),
or on enough elements that the gathered result passes 2^31, and checks every element, those past
2^31 included, against the pattern: x_r[i] = (7 i + 3 r) mod 61, whose sum over up to 2 ranks
stays within int8 (more ranks wrap, which the reference does too). Launch one case per job
(tests/core/test_large_counts.py does) so that a job holds one such buffer at a time.
"""

import time


from harness import Checks, run_cases

# isort: split
import numpy as np
import zcoll

COUNT = 2**31 + 5
PERIOD = 61
ROWS = 1 << 20  # rows of PERIOD elements compared at a time (61 MiB)


def period(rank: int, start: int = 0) -> np.ndarray:
    """The pattern of `rank` from element `start` on, one period of it."""
    i = np.arange(start, start + PERIOD)
    return ((7 * i + 3 * rank) % PERIOD).astype(np.int8)


def fill(x: np.ndarray, rank: int, start: int = 0) -> None:
    """x[i] = pattern of rank at element start + i, written a period at a time (no temporaries)."""
    whole = x.size // PERIOD * PERIOD
    x[:whole].reshape(-1, PERIOD)[:] = period(rank, start)
    x[whole:] = period(rank, start)[: x.size - whole]


def summed(ranks, start: int = 0) -> np.ndarray:
    acc = np.zeros(PERIOD, np.int64)
    for r in ranks:
        acc += period(r, start)
    return acc.astype(np.int8)  # wraps like the kernel


def first_wrong(x: np.ndarray, want: np.ndarray) -> int:
    """-1 when x repeats the period `want` throughout, else the index of the first wrong element."""
    whole = x.size // PERIOD * PERIOD
    rows = x[:whole].reshape(-1, PERIOD)
    for r0 in range(0, rows.shape[0], ROWS):
        bad = rows[r0 : r0 + ROWS] != want
        bad_rows = bad.any(axis=1)
        if bad_rows.any():
            row = int(np.argmax(bad_rows))
            return (r0 + row) * PERIOD + int(np.argmax(bad[row]))
    tail = np.flatnonzero(x[whole:] != want[: x.size - whole])
    return whole + int(tail[0]) if tail.size else -1


def check(ck: Checks, what: str, x: np.ndarray, want: np.ndarray, seconds: float) -> None:
    bad = first_wrong(x, want)
    message = (
        "" if bad < 0 else f"element {bad} is {x[bad]}, expected {want[bad % PERIOD]} ({x.size} elements)"
    )
    ck.check(bad < 0, what, message)
    ck.check(x.size == 0 or x[-1] == want[(x.size - 1) % PERIOD], what, "last element")
    if COMM.rank == 0:
        print(f"{what}: {x.size} elements in {seconds:.1f} s", flush=True)


def timed(fn):
    t = time.monotonic()
    result = fn()
    return result, time.monotonic() - t


def allreduce_in_place(ck: Checks, algorithm: str) -> None:
    x = np.empty(COUNT, np.int8)
    fill(x, COMM.rank)
    _, s = timed(lambda: COMM.allreduce(x, algorithm=algorithm, out=x))
    check(ck, f"allreduce {algorithm}", x, summed(range(COMM.size)), s)


def case_allreduce_auto(ck: Checks):
    allreduce_in_place(ck, "auto")


def case_allreduce_ring(ck: Checks):
    allreduce_in_place(ck, "ring")


def case_allreduce_tree(ck: Checks):
    allreduce_in_place(ck, "tree")


def case_allreduce_recursive_doubling(ck: Checks):
    allreduce_in_place(ck, "recursive_doubling")


def case_allreduce_halving_doubling(ck: Checks):
    allreduce_in_place(ck, "halving_doubling")


def case_allreduce_shm(ck: Checks):
    allreduce_in_place(ck, "shm")


def case_allreduce_mpi(ck: Checks):
    allreduce_in_place(ck, "mpi")


def case_allreduce_mpi_out_of_place(ck: Checks):
    """Past one MPI_Allreduce chunk (2^30 elements) with separate buffers: 1 GiB each."""
    n = 2**30 + 5
    x, out = np.empty(n, np.int8), np.empty(n, np.int8)
    fill(x, COMM.rank)
    _, s = timed(lambda: COMM.allreduce(x, algorithm="mpi", out=out))
    check(ck, "allreduce mpi out of place", out, summed(range(COMM.size)), s)
    check(ck, "allreduce mpi input kept", x, period(COMM.rank), 0.0)


def case_reduce_scatter(ck: Checks):
    x = np.empty(COUNT, np.int8)
    fill(x, COMM.rank)
    r = zcoll.block_range(COUNT, COMM.size, COMM.rank)
    y, s = timed(lambda: COMM.reduce_scatter(x, out=x[r.start : r.stop]))
    check(ck, "reduce_scatter", y, summed(range(COMM.size), r.start), s)


def case_allgather(ck: Checks):
    """Per rank below 2^31, gathered above it."""
    n = COUNT // COMM.size + 1
    out = np.empty(n * COMM.size, np.int8)
    mine = out[COMM.rank * n : (COMM.rank + 1) * n]
    fill(mine, COMM.rank)
    _, s = timed(lambda: COMM.allgather(mine, out=out))
    for r in range(COMM.size):
        check(ck, f"allgather block {r}", out[r * n : (r + 1) * n], period(r), s)


def case_broadcast(ck: Checks):
    root = COMM.size - 1
    x = np.empty(COUNT, np.int8)
    fill(x, COMM.rank)
    _, s = timed(lambda: COMM.broadcast(x, root=root))
    check(ck, "broadcast", x, period(root), s)


def case_reduce(ck: Checks):
    x = np.empty(COUNT, np.int8)
    fill(x, COMM.rank)
    y, s = timed(lambda: COMM.reduce(x, root=0, out=x if COMM.rank == 0 else None))
    if COMM.rank == 0:
        check(ck, "reduce", y, summed(range(COMM.size)), s)
    else:
        ck.check(y is None and first_wrong(x, period(COMM.rank)) < 0, "reduce off the root", "x changed")


if __name__ == "__main__":
    COMM = zcoll.Communicator()
    run_cases(globals(), teardown=COMM.free)
