"""Overlapping input and output, every collective and every shape, numpy and torch:
`PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/overlap.py [case ...]` (any P).

zcoll's rule (docs/errors.md): out must share no memory with x, except in the in-place
position, which each collective names (allreduce, reduce, compressed allreduce: out = x's own
memory; allgather: x = out[rank]; reduce_scatter: out = this rank's block of x). Anything else
raises ValueError ("share memory") on every rank before any traffic, and writes nothing.

Every case lays x and out in one buffer `base` (numpy, or a torch tensor), at element offsets
and lengths that give each shape, on every rank alike:
  apart        out right after x (touching, no shared byte): accepted, correct result
  out_in_x     out strictly inside x            refused unless that is the in-place position
  x_in_out     x strictly inside out            refused unless that is the in-place position
  tail         out starts inside x, ends past it: refused
  head         x starts inside out, ends past it: refused
  in_place     the collective's in-place position, x and out two views of the memory (for
               allreduce, reduce and compressed allreduce: the same memory): accepted, correct
  near_miss    one element off the in-place position: refused
Accepted calls are checked against exact results (x_r[i] = f(r, i), small integers).
"""

from harness import Checks, run_cases

# isort: split
import numpy as np
import torch
import zcoll

N = 12  # elements of x per rank (reduce_scatter: blocks of N/p, uneven for p that do not divide N)


def values(rank: int, n: int) -> np.ndarray:
    return ((np.arange(n) * 3 + rank * 5) % 11 + rank).astype(np.float32)


def buffers(kind: str, size: int):
    base = np.zeros(size, np.float32)
    return base if kind == "numpy" else torch.zeros(size, dtype=torch.float32)


def as_numpy(a) -> np.ndarray:
    return a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


class Layout:
    """x at base[x0 : x0 + nx], out at base[o0 : o0 + no] of one buffer."""

    def __init__(self, kind: str, x0: int, nx: int, o0: int, no: int):
        self.base = buffers(kind, max(x0 + nx, o0 + no) + 4)
        self.x0, self.nx, self.o0, self.no = x0, nx, o0, no

    @property
    def x(self):
        return self.base[self.x0 : self.x0 + self.nx]

    @property
    def out(self):
        return self.base[self.o0 : self.o0 + self.no]


def shapes(nx: int, no: int, in_place_at):
    """(name, x offset, out offset, in place?) for x of nx and out of no elements in one buffer;
    in_place_at: where out starts relative to x in this rank's in-place position (elements).
    A shape meant to be refused never lands on the in-place position (it moves one element):
    every rank must refuse it, or the ranks that accept it would wait in the collective."""
    s = [("tail", 0, max(nx // 2, 1)), ("head", no // 2 + 1, 0)]
    if no < nx:
        s.append(("out_in_x", 0, (nx - no) // 2 + 1))
    if nx < no:
        s.append(("x_in_out", (no - nx) // 2 + 1, 0))
    x0 = max(0, -in_place_at)
    s.append(("near_miss", x0 + 1, x0 + in_place_at))
    moved = [(n, x, o + (1 if o - x == in_place_at else 0)) for n, x, o in s]
    return [("apart", 0, nx, False), ("in_place", x0, x0 + in_place_at, True)] + [(*m, False) for m in moved]


def run_shape(ck: Checks, kind, what, nx, no, x0, o0, in_place, call, expected, atol=0.0):
    """One layout: fills x with this rank's values, calls, checks refusal or result."""
    L = Layout(kind, x0, nx, o0, no)
    shared = not (x0 + nx <= o0 or o0 + no <= x0)
    label = f"{what} {kind} x[{x0}:{x0 + nx}] out[{o0}:{o0 + no}]"
    L.x[:] = torch.from_numpy(values(COMM.rank, nx)) if kind == "torch" else values(COMM.rank, nx)
    before = as_numpy(L.base).copy()
    stats = COMM.stats()
    if shared and not in_place:
        ck.raises(ValueError, lambda: call(L.x, L.out), "share memory", "in-place", what=label)
        ck.check(np.array_equal(as_numpy(L.base), before), label, "refused, yet the buffer changed")
        ck.check(
            COMM.stats() == stats, label, f"refused, yet traffic counters moved: {stats} -> {COMM.stats()}"
        )
        return
    y = call(L.x, L.out)
    got = as_numpy(y).reshape(-1) if y is not None else None
    if got is not None:
        close = got.shape == expected.shape and np.all(np.abs(got - expected) <= atol)
        ck.check(close, label, f"got {got.tolist()}, expected {expected.tolist()}")
    if not shared:
        ck.check(np.array_equal(as_numpy(L.x), values(COMM.rank, nx)), label, "x changed (not in place)")


def exact() -> np.ndarray:
    return np.sum([values(r, N) for r in range(COMM.size)], axis=0)


def matrix(ck: Checks, what: str, nx: int, no: int, in_place_at, call, expected, atol=0.0) -> None:
    for kind in ("numpy", "torch"):
        for name, x0, o0, in_place in shapes(nx, no, in_place_at):
            run_shape(ck, kind, f"{what} {name}", nx, no, x0, o0, in_place, call, expected, atol)


def case_allreduce(ck: Checks):
    for algorithm in ("auto", "ring", "mpi"):
        matrix(
            ck,
            f"allreduce {algorithm}",
            N,
            N,
            0,
            lambda x, o, a=algorithm: COMM.allreduce(x, algorithm=a, out=o),
            exact(),
        )


def case_compressed_allreduce(ck: Checks):
    # Sums of small integers: exact through float16 and through these lossless settings; int8
    # quantization rounds (error <= p * absmax / 254 per element, docs/algorithms.md).
    p = COMM.size
    for c, atol in (
        (zcoll.HalfPrecision("fp16"), 0.0),
        (zcoll.TopK(1.0, error_feedback=False), 0.0),
        (zcoll.Threshold(0.0, error_feedback=False), 0.0),
        (zcoll.RandomK(1.0, error_feedback=False), 0.0),
        (zcoll.GradientQuantizer(8, error_feedback=False), p * p * (10 + p) / 254 + 1e-3),
    ):

        def call(x, o, c=c):
            return COMM.allreduce(x, out=o, compression=c)

        matrix(ck, f"compressed {c!r}", N, N, 0, call, exact(), atol)


def case_reduce(ck: Checks):
    p, r = COMM.size, COMM.rank
    for root in {0, p - 1}:
        want = exact() if r == root else None
        matrix(
            ck, f"reduce root={root}", N, N, 0, lambda x, o, root=root: COMM.reduce(x, root=root, out=o), want
        )


def case_allgather(ck: Checks):
    p, r = COMM.size, COMM.rank
    want = np.concatenate([values(q, N) for q in range(p)])
    matrix(ck, "allgather", N, N * p, -N * r, lambda x, o: COMM.allgather(x, out=o), want)


def case_reduce_scatter(ck: Checks):
    p, r = COMM.size, COMM.rank
    block = zcoll.block_range(N, p, r)
    want = exact()[block.start : block.stop]
    matrix(ck, "reduce_scatter", N, len(block), block.start, lambda x, o: COMM.reduce_scatter(x, out=o), want)
    # out = another rank's block of x: overlapping, not in place, on every rank
    if p > 1:
        other = zcoll.block_range(N, p, (r + 1) % p)
        if len(other) == len(block) and len(block):
            for kind in ("numpy", "torch"):
                run_shape(
                    ck,
                    kind,
                    "reduce_scatter another rank's block",
                    N,
                    len(block),
                    0,
                    other.start,
                    other.start == block.start,
                    lambda x, o: COMM.reduce_scatter(x, out=o),
                    want,
                )


def case_torch_views_of_numpy(ck: Checks):
    """Overlap seen through different objects: a torch tensor over a numpy array's memory."""
    base = np.zeros(3 * N, np.float32)
    base[:N] = values(COMM.rank, N)
    t = torch.from_numpy(base)
    ck.raises(ValueError, lambda: COMM.allreduce(base[:N], out=t[N // 2 : N // 2 + N]), "share memory")
    y = COMM.allreduce(base[:N], out=t[:N])  # the same memory: in place
    ck.check(np.array_equal(y.numpy(), exact()), "allreduce numpy x, torch out in place", f"{y}")
    mv = memoryview(base)[N : 2 * N]
    base[N : 2 * N] = values(COMM.rank, N)
    ck.raises(ValueError, lambda: COMM.allreduce(mv, out=base[N + 1 : 2 * N + 1]), "share memory")


if __name__ == "__main__":
    COMM = zcoll.Communicator()
    run_cases(globals(), teardown=COMM.free)
