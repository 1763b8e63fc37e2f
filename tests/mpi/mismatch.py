"""Cross-rank mismatches in check mode: every rank raises zcoll.MismatchError.

    ZCOLL_CHECK=1 PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/mismatch.py --mode=env [case ...]
    PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/mismatch.py --mode=arg [case ...]  # check=True

Each case has ranks pass different counts, dtypes, ops, roots, algorithms or collectives. Every rank must
raise MismatchError (a ValueError) whose message names the field that differs; the outcomes are
gathered so that a rank that did not raise is named; after each case the communicator must
still give right results. Matching calls in check mode must work as usual.
"""

from __future__ import annotations

from harness import WORLD, Checks, option, run_cases

# isort: split
import numpy as np
import zcoll


def f32(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def cases(p: int):
    """(name, field named in the message, call(comm)). The odd one out is rank 0, the last rank,
    or every rank but 0. Without check mode each of them would hang or corrupt memory."""
    last = p - 1
    return [
        ("allreduce count (last rank)", "count", lambda c: c.allreduce(f32(8 + (c.rank == last)))),
        ("allreduce count (ring)", "count", lambda c: c.allreduce(f32(100 + c.rank), algorithm="ring")),
        ("allreduce count (mpi)", "count", lambda c: c.allreduce(f32(4 + c.rank), algorithm="mpi")),
        ("allreduce dtype", "dtype", lambda c: c.allreduce(np.ones(8, np.float32 if c.rank else np.float64))),
        ("allreduce op", "op", lambda c: c.allreduce(f32(8), op="sum" if c.rank else "max")),
        (
            "allreduce algorithm",
            "algorithm",
            lambda c: c.allreduce(f32(1000), algorithm="ring" if c.rank else "tree"),
        ),
        (
            "allreduce op avg (last rank)",
            "op",
            lambda c: c.allreduce(f32(8), op="avg" if c.rank == last else "sum"),
        ),
        ("reduce_scatter count", "count", lambda c: c.reduce_scatter(f32(12 + c.rank))),
        (
            "reduce_scatter op",
            "op",
            lambda c: c.reduce_scatter(f32(12), op="min" if c.rank == last else "max"),
        ),
        ("allgather count", "count", lambda c: c.allgather(f32(3 + (c.rank == 0)))),
        (
            "allgather dtype",
            "dtype",
            lambda c: c.allgather(np.ones(3, np.int32 if c.rank == last else np.float32)),
        ),
        ("broadcast root", "root", lambda c: c.broadcast(f32(5), root=0 if c.rank == 0 else last)),
        ("broadcast count", "count", lambda c: c.broadcast(f32(5 + c.rank), root=0)),
        ("reduce root", "root", lambda c: c.reduce(f32(5), root=last if c.rank == last else 0)),
        ("reduce op", "op", lambda c: c.reduce(f32(5), op="prod" if c.rank == 0 else "sum")),
        ("reduce dtype", "dtype", lambda c: c.reduce(np.ones(5, np.int64 if c.rank == 0 else np.float64))),
        (
            "allreduce on rank 0, broadcast elsewhere",
            "collective",
            lambda c: c.allreduce(f32(5)) if c.rank == 0 else c.broadcast(f32(5)),
        ),
    ]


def still_works(comm, ck: Checks, after: str) -> None:
    res = comm.allreduce(np.array([comm.rank], dtype=np.int64))
    ck.check(res.tolist() == [comm.size * (comm.size - 1) // 2], f"allreduce after '{after}'", f"got {res}")


MODE = option("mode")
assert MODE in ("env", "arg"), f"--mode=env (with ZCOLL_CHECK=1) or --mode=arg, not {MODE!r}"
COMM = zcoll.Communicator(check=True) if MODE == "arg" else zcoll.Communicator()
assert COMM.size >= 2, "mismatches need at least 2 ranks"


def case_mismatches_raise_on_every_rank(ck: Checks) -> None:
    comm, p = COMM, COMM.size
    ck.check(issubclass(zcoll.MismatchError, ValueError), "MismatchError", "is not a ValueError")
    all_cases = cases(p)
    raised = np.zeros(len(all_cases), dtype=np.int64)
    for i, (name, field, call) in enumerate(all_cases):
        try:
            call(comm)
            ck.fail(name, "no MismatchError")
        except zcoll.MismatchError as e:
            raised[i] = 1
            ck.check(
                f"the {field} of this collective" in str(e), name, f"message does not name the {field}: {e}"
            )
        still_works(comm, ck, name)

    every = np.empty((p, len(all_cases)), dtype=np.int64)
    WORLD.Allgather(raised, every)
    for i, (name, _, _) in enumerate(all_cases):
        silent = [r for r in range(p) if not every[r, i]]
        ck.check(not silent, name, f"ranks {silent} did not raise MismatchError")


def case_matching_calls_work_in_check_mode(ck: Checks) -> None:
    comm, p = COMM, COMM.size
    res = comm.allreduce(np.full(10, comm.rank + 1, np.int32), algorithm="tree")
    ck.check(res.tolist() == [p * (p + 1) // 2] * 10, "matching allreduce in check mode", f"got {res}")
    res = comm.broadcast(np.full(3, float(comm.rank)), root=p - 1)
    ck.check(res.tolist() == [p - 1.0] * 3, "matching broadcast in check mode", f"got {res}")


if __name__ == "__main__":
    run_cases(globals(), teardown=COMM.free)
