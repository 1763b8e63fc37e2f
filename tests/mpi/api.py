"""The Python API on every kind of array object, and its errors, at any world size.

    PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/api.py [case ...]

1. Objects: numpy arrays (1-D and 2-D), CPU torch tensors (float32, float16, bfloat16), an
   object with DLPack only, and buffer-protocol objects (array.array, bytearray) through every
   collective: the values are right, `out` / in-place results are the very object passed
   (for torch, the same storage: zero-copy), new results are of the same kind (numpy for
   plain buffers) and shape.
2. Errors: every call in error_cases.BAD_CALLS raises on every rank, with the traffic counters
   unchanged (nothing was sent), and the communicator still gives right results afterwards.
3. A Communicator over a sub-communicator (mpi4py Split) and free()/context-manager rules.
"""

from __future__ import annotations

from harness import WORLD, Checks, run_cases

# isort: split
import array
import functools

import numpy as np
import torch
import zcoll
from error_cases import BAD_CALLS, DLPackOnly, read_only


class Kind:
    """How to build one kind of object from numbers and read it back."""

    def __init__(self, name, make, read, new_type, torch_dtype=None):
        self.name, self.make, self.read, self.new_type, self.torch_dtype = (
            name,
            make,
            read,
            new_type,
            torch_dtype,
        )

    def check_new(self, ck: Checks, what: str, res, shape: tuple) -> bool:
        """A result the collective allocated: same kind as the input (numpy for plain buffers)."""
        if not isinstance(res, self.new_type):
            return ck.check(False, what, f"returned {type(res).__name__}, expected {self.new_type.__name__}")
        if self.torch_dtype is not None and res.dtype != self.torch_dtype:
            return ck.check(False, what, f"returned a {res.dtype} tensor, expected {self.torch_dtype}")
        return ck.check(tuple(res.shape) == shape, what, f"result shape {tuple(res.shape)}, expected {shape}")


def torch_kind(dtype) -> Kind:
    return Kind(
        f"torch {dtype}",
        lambda v: torch.tensor(v, dtype=dtype),
        lambda t: t.to(torch.float64).numpy(),
        torch.Tensor,
        dtype,
    )


def numpy_read(obj) -> np.ndarray:
    if isinstance(obj, DLPackOnly):
        obj = np.from_dlpack(obj)
    return np.asarray(obj).astype(np.float64)


KINDS = [
    Kind("numpy float32", lambda v: np.asarray(v, np.float32), numpy_read, np.ndarray),
    Kind("numpy int64 2-D", lambda v: np.asarray(v, np.int64).reshape(2, -1), numpy_read, np.ndarray),
    torch_kind(torch.float32),
    torch_kind(torch.float16),
    torch_kind(torch.bfloat16),
    Kind("DLPack-only float64", lambda v: DLPackOnly(np.asarray(v, np.float64)), numpy_read, np.ndarray),
    Kind("array.array('f')", lambda v: array.array("f", v), numpy_read, np.ndarray),
    Kind("bytearray", lambda v: bytearray(np.asarray(v, np.uint8).tobytes()), numpy_read, np.ndarray),
]
N = 6  # elements per rank; small integers, so sums are exact in every dtype


def shape_of(obj) -> tuple:
    if isinstance(obj, DLPackOnly):
        return np.from_dlpack(obj).shape
    return tuple(obj.shape) if hasattr(obj, "shape") else (len(obj),)


def rank_values(rank: int) -> np.ndarray:
    return np.arange(N, dtype=np.float64) + 10 * rank


COMM = zcoll.Communicator()


def case_objects(ck: Checks) -> None:
    """1. Every kind of array object through every collective."""
    for kind in KINDS:
        check_kind(COMM, ck, kind)


def check_kind(comm, ck: Checks, kind: Kind) -> None:
    p, rank = comm.size, comm.rank
    total = sum(rank_values(r) for r in range(p))

    def fresh():
        return kind.make(rank_values(rank).tolist())

    def same(what, obj, expected):
        got, expected = kind.read(obj).reshape(-1), np.asarray(expected, np.float64).reshape(-1)
        ck.check(
            np.array_equal(got, expected), f"{kind.name} {what}", f"got {got.tolist()}, expected {expected}"
        )

    x = fresh()
    shape = shape_of(x)
    res = comm.allreduce(x)
    if kind.check_new(ck, f"{kind.name} allreduce", res, shape):
        same("allreduce", res, total)
    same("allreduce leaves its input alone", x, rank_values(rank))

    ptr = x.data_ptr() if isinstance(x, torch.Tensor) else None
    res = comm.allreduce(x, out=x)
    if ck.check(res is x, f"{kind.name} allreduce out=x", "did not return x itself"):
        same("allreduce in place", x, total)
        if ptr is not None:
            ck.check(x.data_ptr() == ptr, f"{kind.name} allreduce in place", "tensor storage moved")

    x, out = fresh(), kind.make([0] * N)
    res = comm.allreduce(x, op="max", out=out)
    if ck.check(res is out, f"{kind.name} allreduce out=other", "did not return out"):
        same("allreduce max into out", out, rank_values(p - 1))

    x = fresh()
    res = comm.broadcast(x, root=p - 1)
    if ck.check(res is x, f"{kind.name} broadcast", "did not return x itself"):
        same("broadcast", x, rank_values(p - 1))

    res = comm.allgather(fresh())
    if kind.check_new(ck, f"{kind.name} allgather", res, (p, *shape)):
        same("allgather", res, np.concatenate([rank_values(r) for r in range(p)]))

    block = zcoll.block_range(N, p, rank)
    res = comm.reduce_scatter(fresh())
    if kind.check_new(ck, f"{kind.name} reduce_scatter", res, (len(block),)):
        same("reduce_scatter", res, total[block.start : block.stop])

    res = comm.reduce(fresh(), root=0, op="min")
    if rank != 0:
        ck.check(res is None, f"{kind.name} reduce", f"non-root got {type(res).__name__}, expected None")
    elif kind.check_new(ck, f"{kind.name} reduce", res, shape):
        same("reduce min", res, rank_values(0))


def case_read_only_inputs(ck: Checks) -> None:
    """Inputs may be read-only (a read-only numpy array, bytes, a read-only DLPack export)."""
    comm = COMM
    p = comm.size
    for name, x in [
        ("read-only numpy", read_only(np.full(4, comm.rank + 1, np.int32))),
        ("bytes", bytes([comm.rank + 1] * 4)),
        ("read-only DLPack", DLPackOnly(read_only(np.full(4, comm.rank + 1.0)))),
    ]:
        res = comm.allreduce(x)
        expected = [p * (p + 1) // 2] * 4
        ok = isinstance(res, np.ndarray) and res.tolist() == expected
        ck.check(ok, f"allreduce of {name}", f"got {res!r}, expected {expected}")


def case_zero_copy_out(ck: Checks) -> None:
    """A torch `out` receives the result in its own storage, for every floating torch dtype."""
    comm = COMM
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.full((3, 5), float(comm.rank + 1), dtype=dtype)
        out = torch.empty((3, 5), dtype=dtype)
        ptr = out.data_ptr()
        res = comm.allreduce(x, op="avg", out=out)
        expected = (comm.size + 1) / 2
        ok = res is out and out.data_ptr() == ptr and bool((out.to(torch.float64) == expected).all())
        ck.check(ok, f"torch {dtype} allreduce avg out=", f"got {res} (same object: {res is out})")


def case_errors(ck: Checks) -> None:
    """2. Bad calls raise on every rank before any traffic; the communicator still works."""
    comm = COMM
    for name, call, exc, words in BAD_CALLS:
        before = comm.stats()
        ck.raises(exc, functools.partial(call, comm), *words.split(), what=name)
        ck.check(comm.stats() == before, name, f"traffic counters moved: {before} -> {comm.stats()}")
    # Stray messages from a rank that went ahead would corrupt these (same tags as the calls above).
    x = np.full(5, comm.rank + 1.0, dtype=np.float32)
    total = np.full(5, comm.size * (comm.size + 1) / 2, np.float32)
    for name, call in [
        ("allreduce", lambda: comm.allreduce(x)),
        ("reduce", lambda: comm.reduce(x, root=0)),
        ("reduce_scatter", lambda: comm.reduce_scatter(np.tile(x, comm.size))),
        (
            "broadcast",
            lambda: comm.broadcast(np.full(5, comm.size - 1.0, np.float32) if comm.rank == 0 else x.copy()),
        ),
    ]:
        res = call()
        expected = total if name != "broadcast" else np.full(5, comm.size - 1.0, np.float32)
        if res is not None:  # reduce: None on non-root ranks
            ck.check(
                np.array_equal(res, expected), f"{name} after the errors", f"got {res}, expected {expected}"
            )


def case_subcommunicator(ck: Checks) -> None:
    """Communicator(comm) over an mpi4py sub-communicator: even and odd ranks reduce apart."""
    sub = WORLD.Split(WORLD.rank % 2, WORLD.rank)
    with zcoll.Communicator(sub) as c:
        mine = [r for r in range(WORLD.size) if r % 2 == WORLD.rank % 2]
        ck.check((c.size, c.rank) == (len(mine), mine.index(WORLD.rank)), "sub-communicator", f"{c}")
        res = c.allreduce(np.array([WORLD.rank], dtype=np.int64), algorithm="ring")
        ck.check(res.tolist() == [sum(mine)], "sub-communicator allreduce", f"got {res.tolist()}")
    sub.Free()


def case_free(ck: Checks) -> None:
    c = zcoll.Communicator()
    with c:
        ck.check(not c.freed, "context manager", "freed too early")
    ck.check(c.freed, "context manager", "not freed on exit")
    c.free()  # idempotent
    x = np.zeros(2, np.float32)
    for name, call in [
        ("allreduce", lambda: c.allreduce(x)),
        ("reduce_scatter", lambda: c.reduce_scatter(x)),
        ("allgather", lambda: c.allgather(x)),
        ("broadcast", lambda: c.broadcast(x)),
        ("reduce", lambda: c.reduce(x)),
        ("barrier", c.barrier),
        ("rank", lambda: c.rank),
        ("size", lambda: c.size),
        ("stats", c.stats),
    ]:
        ck.raises(ValueError, call, "freed", what=f"{name} on a freed communicator")


if __name__ == "__main__":
    run_cases(globals(), teardown=COMM.free)
