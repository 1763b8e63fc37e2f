"""The shm allreduce from 256 KiB, where it reads the other ranks' buffers in one copy
(process_vm_readv) and writes its results into theirs (process_vm_writev;
csrc/collectives/allreduce_shm.cc), against numpy, at any world size.

    PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/allreduce_shm.py [case ...]
    ZCOLL_SHM_SINGLE_COPY=0 ...     the same cases through the staged path

Inputs are exact in every order (integers wrap; floating sums of small integers times powers of
two; products of powers of two; min/max of distinct values), so results are compared bit for
bit with numpy's reduction; every rank must end with the same bits. Counts: the smallest prime
at or above 256 KiB of the dtype (odd: not divisible by 2 or 4 ranks) and one of about 4 MiB
(many pieces per rank's share), in place, into `out`, and into a new array (on 2 ranks the first
takes the peer's input through the shared window, the second reads it); calls from 8 MiB,
whose results are written with non-temporal stores, also into an `out` that is not 16-byte
aligned.
"""

from __future__ import annotations

from harness import WORLD, Checks, rng_for, run_cases

# isort: split
import os

import numpy as np
import zcoll
from numerics import (
    DTYPE_CODES,
    OP_CODES,
    describe_mismatch,
    equal_bits,
    from_values,
    reduce_all,
    storage_dtype,
)

comm = zcoll.Communicator()
P, RANK = WORLD.size, WORLD.rank
THRESHOLD = 256 * 1024  # the single copy's smallest call (SharedArena::single_copy_bytes)
STREAM = 8 * 1024 * 1024  # from here the results are stored non-temporally (kStreamBytes)
WINDOW_IN = 1024 * 1024  # 2 ranks, below this the peer's input comes through the window (window_in_bytes)
CASES = [
    ("float32", "sum"),
    ("float32", "avg"),
    ("float32", "max"),
    ("float64", "sum"),
    ("float16", "prod"),
    ("int8", "sum"),
    ("int32", "prod"),
    ("uint8", "min"),
]


def next_prime(n: int) -> int:
    while any(n % d == 0 for d in range(2, int(n**0.5) + 1)):
        n += 1
    return n


def counts(dtype: str) -> list:
    size = storage_dtype(dtype).itemsize
    return [next_prime(THRESHOLD // size), next_prime(4_000_000 // size)]


def exact_input(dtype: str, op: str, count: int, rank: int) -> np.ndarray:
    """Rank `rank`'s input: every reduction order gives the same bits."""
    i = np.arange(count)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        rng = rng_for(rank, count, DTYPE_CODES[dtype], OP_CODES[op])
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    if op in ("sum", "avg"):
        v = (((i * 13 + rank * 7 + 3) % 17) - 8) * np.exp2((i % 11) - 5)
    elif op == "prod":
        v = np.where((i + rank) % 3 == 0, -1.0, 1.0) * np.exp2(((i * 5 + rank * 3) % 5) - 2)
    else:
        v = (i % 1009) * 4.0 + rank + 0.5 * (i % 2)
    return from_values(v, dtype)


def check_call(ck: Checks, dtype: str, op: str, count: int, placement: str, algorithm: str) -> None:
    x = exact_input(dtype, op, count, RANK)
    want = reduce_all([exact_input(dtype, op, count, r) for r in range(P)], dtype, op)
    what = f"{algorithm} {dtype} {op} count={count} {placement}"
    if placement == "in-place":
        got = comm.allreduce(x, op=op, algorithm=algorithm, out=x)
    elif placement == "out":
        out = np.full(x.nbytes, 0x5A, np.uint8).view(x.dtype)
        got = comm.allreduce(x, op=op, algorithm=algorithm, out=out)
        ck.check(got is out, what, "the result is not the given out")
    else:
        got = comm.allreduce(x, op=op, algorithm=algorithm)
    ok = equal_bits(got, want, dtype)
    ck.check(ok.all(), what, describe_mismatch(got, want, dtype, ok))
    ck.same_on_all_ranks(what, got.tobytes())


def case_exact_against_numpy(ck: Checks):
    placements = ["in-place", "out", "new"]
    for n, (dtype, op) in enumerate(CASES):
        for k, count in enumerate(counts(dtype)):
            check_call(ck, dtype, op, count, placements[(n + k) % 3], "shm")
    check_call(ck, "float32", "sum", counts("float32")[0], "out", "auto")


def single_copy_expected() -> bool:
    """What the transport should find: cross-memory reads allowed between one user's processes
    unless switched off or Yama restricts ptrace to descendants (ptrace_scope >= 1)."""
    if os.environ.get("ZCOLL_SHM_SINGLE_COPY", "1") == "0":
        return False
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read()) == 0
    except OSError:
        return True  # no Yama


def case_streamed_results(ck: Checks):
    """Calls from 8 MiB: odd counts (a ragged tail), and `out` 4 bytes off a 16-byte boundary
    (the non-temporal stores need an aligned head copied first)."""
    for n, (dtype, op) in enumerate(
        [("float32", "sum"), ("float32", "avg"), ("float64", "sum"), ("int8", "sum")]
    ):
        count = next_prime(STREAM // storage_dtype(dtype).itemsize + 3)
        check_call(ck, dtype, op, count, ["in-place", "out", "new"][n % 3], "shm")
    x = exact_input("float32", "sum", STREAM // 4 + 5, RANK)
    want = reduce_all([exact_input("float32", "sum", x.size, r) for r in range(P)], "float32", "sum")
    raw = np.full(x.nbytes + 16, 0x5A, np.uint8)
    start = 4 + (-raw.ctypes.data) % 16
    out = raw[start : start + x.nbytes].view(np.float32)
    got = comm.allreduce(x, algorithm="shm", out=out)
    ok = equal_bits(got, want, "float32")
    ck.check(
        got is out and ok.all(), "float32 sum, unaligned out", describe_mismatch(got, want, "float32", ok)
    )
    ck.check(
        raw[:start].tolist() == [0x5A] * start and (raw[start + x.nbytes :] == 0x5A).all(), "out's neighbours"
    )


def case_single_copy_ran(ck: Checks):
    """The bytes moved between ranks' memories: (p-1) x my share read for the reduction (none on
    2 ranks below WINDOW_IN, where the peer's input comes through the window); then either the
    same written into the others' `out` (where the kernel allows process_vm_writev) or the others'
    shares read for the gather; nothing through the staged path (below 256 KiB)."""
    count = counts("float32")[0]
    mine = count * (RANK + 1) // P - count * RANK // P
    for n in (1000, count):
        before = comm.stats()
        comm.allreduce(np.ones(n, np.float32), algorithm="shm")
        after = comm.stats()
        got = [after[k] - before[k] for k in ("bytes_read_from_peers", "bytes_written_to_peers")]
        single = single_copy_expected() and P > 1 and n == count
        writes = single and got[1] > 0
        window_in = writes and P == 2 and 4 * n < WINDOW_IN
        want = [
            4 * ((0 if window_in else (P - 1) * mine) + (0 if writes else count - mine)) if single else 0,
            4 * (P - 1) * mine if writes else 0,
        ]
        ck.check(got == want, f"bytes read from / written to peers, count={n}", f"{got}, expected {want}")
        if single:  # the kernel checks writes as it checks reads (ptrace access): both or neither
            ck.check(writes, "single copy writes into the others' out", f"bytes written {got[1]}")


def case_sizes_around_the_threshold(ck: Checks):
    """Both sides of 256 KiB, then of WINDOW_IN, one after the other: the staged and single-copy
    calls (2 ranks: with the input through the window, then without) share the arena's flags,
    sequence and staging buffers."""
    for count in (THRESHOLD // 4 - 1, THRESHOLD // 4, 1000, THRESHOLD // 4 + 7, 3 * THRESHOLD // 4 + 1):
        check_call(ck, "float32", "avg", count, "out", "shm")
    for count in (WINDOW_IN // 4 - 1, WINDOW_IN // 4, THRESHOLD // 4 + 1, WINDOW_IN // 4 + 3):
        check_call(ck, "float32", "sum", count, "in-place", "shm")


if __name__ == "__main__":
    run_cases(globals(), teardown=comm.free)
