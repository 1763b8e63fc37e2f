"""bool, complex and the bitwise ops (band, bor, bxor) through every collective, against numpy.

    PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/dtypes.py [case ...]

Cases: allreduce (every algorithm, mpi included), reduce_scatter, reduce (every root),
allgather, broadcast (every root), refused (every combination without meaning raises ValueError
naming dtype and op, before any message), torch_tensors (bool and complex32, which numpy lacks,
and complex64 as torch tensors, in place).

The references are numpy's own operations, not zcoll's lane mapping: bool reduces with
np.logical_or / logical_and / logical_xor (sum and max: or; prod and min: and), integers with
np.bitwise_and / or / xor (any bit patterns: order-free), complex sums in complex128 of parts
that are small integers times a power of two shared by every rank (exact in any order, also in
float16), avg each part divided by p in its real type (float16: in float32, rounded once).
Results are compared bit for bit (bool: bytes 0 or 1, never 2) and must be the same on every rank.
Counts 0, 1, 2, 7, 31, 97, 1009, p - 1, p + 1, 24p + 1; every call in place, into a given out
or into a new array, rotating; segment sizes rotate over 0 (default), 64 and 200 bytes.
"""

from __future__ import annotations

from harness import WORLD, Checks, rng_for, run_cases

# isort: split
import numpy as np
import torch
import zcoll

P, R = WORLD.size, WORLD.rank
BANDWIDTH = np.full((P, P), 1e9)  # a topology, so that ordered_ring runs too
if P > 1:
    BANDWIDTH[0, 1] = 0.25e9
COMM = zcoll.Communicator(topology=BANDWIDTH)
COUNTS = sorted({0, 1, 2, 7, 31, 97, 1009, max(P - 1, 0), P + 1, 24 * P + 1})
SEGMENTS = [(0, 0), (64, 1), (200, 3)]
BOOL_OPS = ["sum", "prod", "min", "max", "band", "bor", "bxor"]
BITWISE = ["band", "bor", "bxor"]
# (dtype, ops): what each type takes (what torch's gloo takes)
MATRIX = [("bool", BOOL_OPS), ("complex64", ["sum", "avg"]), ("complex128", ["sum", "avg"])] + [
    (d, BITWISE) for d in ("int8", "uint8", "int32", "int64")
]
LOGICAL = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or, "prod": np.logical_and,
           "min": np.logical_and, "band": np.logical_and, "bxor": np.logical_xor}  # fmt: skip
BITS = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
REAL = {"complex32": np.float16, "complex64": np.float32, "complex128": np.float64}


def value(dtype: str, op: str, count: int, rank: int) -> np.ndarray:
    """Rank `rank`'s input (numpy; complex32 as its complex64 values, exact in float16)."""
    i = np.arange(count)
    rng = rng_for(rank, count, len(dtype), len(op))
    if dtype == "bool":
        v = rng.integers(0, 2, count).astype(bool)
        v[i % 5 == 0], v[i % 7 == 0] = True, False  # all true / all false somewhere
        return v
    if dtype.startswith("complex"):
        scale = np.exp2((i % 11) - 5)
        re = (((i * 13 + rank * 7 + 3) % 17) - 8) * scale
        im = (((i * 5 + rank * 11 + 1) % 15) - 7) * scale
        return (re + 1j * im).astype("complex64" if dtype == "complex32" else dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)


def reference(dtype: str, op: str, inputs: list) -> np.ndarray:
    if dtype == "bool":
        return LOGICAL[op].reduce(np.stack(inputs), axis=0)
    if dtype in BITS or op in BITS:
        return BITS[op].reduce(np.stack(inputs), axis=0)
    total = np.sum(np.stack(inputs).astype(np.complex128), axis=0)  # exact
    real = REAL[dtype]
    parts = [total.real.astype(real), total.imag.astype(real)]
    if op == "avg":
        wide = np.float64 if real is np.float64 else np.float32
        parts = [(p.astype(wide) / wide(len(inputs))).astype(real) for p in parts]
    if dtype == "complex32":
        return np.stack(parts, axis=-1)  # float16 pairs: the layout of torch.complex32
    return (parts[0] + 1j * parts[1].astype(np.float64)).astype(dtype)


def same_bytes(ck: Checks, what, got, want: np.ndarray, every_rank: bool = True) -> None:
    """got's bytes are want's; with every_rank, also the same on every rank (compared at the end)."""
    g = np.ascontiguousarray(got).reshape(-1).view(np.uint8)
    w = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
    ck.check(g.size == w.size and np.array_equal(g, w), what, f"got {got!r:.300}, expected {want!r:.300}")
    if every_rank:
        ck.same_on_all_ranks(what, g.tobytes())


def each_case():
    """(k, dtype, op, count, placement) over the matrix; k rotates settings."""
    k = 0
    for dtype, ops in MATRIX:
        for op in ops:
            for count in COUNTS:
                yield k, dtype, op, count, ("in-place", "out", "new")[k % 3]
                k += 1


def set_segments(k: int) -> None:
    COMM.segment_bytes, COMM.pipeline_depth = SEGMENTS[k % len(SEGMENTS)]


def case_allreduce(ck: Checks) -> None:
    for algorithm in zcoll.ALGORITHMS:
        for k, dtype, op, count, placement in each_case():
            set_segments(k)
            inputs = [value(dtype, op, count, r) for r in range(P)]
            x = inputs[R].copy()
            out = x if placement == "in-place" else None if placement == "new" else np.empty_like(x)
            got = COMM.allreduce(x, op=op, algorithm=algorithm, out=out)
            what = f"allreduce {algorithm} {dtype} {op} count={count} {placement}"
            ck.check(got.dtype == x.dtype and (out is None or got is out), what, f"returned {got.dtype}")
            same_bytes(ck, what, got, reference(dtype, op, inputs))
            if placement != "in-place":
                ck.check(np.array_equal(x, inputs[R]), what, "the input was modified")


def case_reduce_scatter(ck: Checks) -> None:
    for k, dtype, op, count, placement in each_case():
        set_segments(k)
        inputs = [value(dtype, op, count, r) for r in range(P)]
        block = zcoll.block_range(count, P, R)
        x = inputs[R].copy()
        out = x[block.start : block.stop] if placement == "in-place" else None
        got = COMM.reduce_scatter(x, op=op, out=out)
        want = reference(dtype, op, inputs)[block.start : block.stop]
        same_bytes(ck, f"reduce_scatter {dtype} {op} count={count} {placement}", got, want, every_rank=False)


def case_reduce(ck: Checks) -> None:
    for k, dtype, op, count, placement in each_case():
        set_segments(k)
        root = k % P
        inputs = [value(dtype, op, count, r) for r in range(P)]
        x = inputs[R].copy()
        out = x if placement == "in-place" else None
        got = COMM.reduce(x, root=root, op=op, out=out)
        what = f"reduce root={root} {dtype} {op} count={count} {placement}"
        if R == root:
            same_bytes(ck, what, got, reference(dtype, op, inputs), every_rank=False)
        else:
            ck.check(got is None, what, f"returned {type(got).__name__} off the root")


def copying_inputs(dtype: str, count: int, rank: int) -> np.ndarray:
    """Any bit patterns for complex (NaNs, infinities: copies move bytes); bools 0 / 1."""
    if dtype == "bool":
        return value(dtype, "sum", count, rank)
    raw = rng_for(rank, count, 3).integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype)


def case_allgather(ck: Checks) -> None:
    for k, (dtype, _) in enumerate(MATRIX[:3]):
        for j, count in enumerate(COUNTS):
            set_segments(j)
            inputs = [copying_inputs(dtype, count, r) for r in range(P)]
            if (k + j) % 2:  # in place: x is this rank's row of out
                out = np.zeros((P, count), dtype)
                out[R] = inputs[R]
                got = COMM.allgather(out[R], out=out)
            else:
                got = COMM.allgather(inputs[R].copy())
            same_bytes(ck, f"allgather {dtype} count={count}", got, np.stack(inputs))


def case_broadcast(ck: Checks) -> None:
    for dtype, _ in MATRIX[:3]:
        for j, count in enumerate(COUNTS):
            set_segments(j)
            for root in range(P):
                want = copying_inputs(dtype, count, root)
                x = want.copy() if R == root else np.zeros(count, dtype)
                same_bytes(
                    ck, f"broadcast root={root} {dtype} count={count}", COMM.broadcast(x, root=root), want
                )


VALID = {
    **{d: ["sum", "prod", "min", "max", "avg"] for d in ("float32", "float64", "float16")},
    **{d: ["sum", "prod", "min", "max", *BITWISE] for d in ("int8", "uint8", "int32", "int64", "bool")},
    **{d: ["sum", "avg"] for d in ("complex64", "complex128")},
}


def case_refused(ck: Checks) -> None:
    """Every (dtype, op) without meaning: ValueError naming both, on every rank, before any
    message (the traffic counters stay put); the communicator works afterwards."""
    before = COMM.stats()
    for dtype, valid in VALID.items():
        x = np.ones(5, dtype)
        for op in zcoll.OPS:
            if op in valid:
                continue
            calls = {
                "allreduce": lambda x=x, op=op: COMM.allreduce(x, op=op),
                "mpi": lambda x=x, op=op: COMM.allreduce(x, op=op, algorithm="mpi"),
                "reduce_scatter": lambda x=x, op=op: COMM.reduce_scatter(x, op=op),
                "reduce": lambda x=x, op=op: COMM.reduce(x, op=op),
            }
            for name, call in calls.items():
                ck.raises(ValueError, call, dtype, f"'{op}'", what=f"{name} {dtype} {op}")
    for dtype in ("bool", "complex64", "complex128"):  # the compressed allreduce: float types only
        x = np.ones(8, dtype)
        call = lambda x=x: COMM.allreduce(x, compression=zcoll.HalfPrecision())
        ck.raises(ValueError, call, "float32, float16 or bfloat16", dtype, what=f"compressed {dtype}")
    ck.check(COMM.stats() == before, "no traffic", f"{before} -> {COMM.stats()}")
    flag = np.array([R == P - 1])
    same_bytes(ck, "still works", COMM.allreduce(flag, op="max"), np.array([True]))


def case_torch_tensors(ck: Checks) -> None:
    """bool, complex32 (numpy has none) and complex64 as torch tensors through every algorithm in
    turn, results in the tensors given (in place), and into new tensors of the same dtype."""
    for k, dtype, op, count, placement in each_case():
        if dtype not in ("bool", "complex64"):
            continue
        for tdtype in (torch.bool,) if dtype == "bool" else (torch.complex32, torch.complex64):
            name = str(tdtype).split(".")[1]
            set_segments(k)
            inputs = [value(name, op, count, r) for r in range(P)]
            x = torch.from_numpy(inputs[R].copy()).to(tdtype)
            algorithm = zcoll.ALGORITHMS[(k + count) % len(zcoll.ALGORITHMS)]  # every one, mpi too
            got = COMM.allreduce(x, op=op, algorithm=algorithm, out=x if placement == "in-place" else None)
            what = f"torch allreduce {algorithm} {name} {op} count={count} {placement}"
            ck.check(got.dtype == tdtype and (placement != "in-place" or got is x), what, f"got {got.dtype}")
            want = reference(name, op, inputs)
            same_bytes(
                ck, what, (torch.view_as_real(got) if tdtype == torch.complex32 else got).numpy(), want
            )
            if count:
                part = COMM.reduce_scatter(x.clone(), op=op)
                block = zcoll.block_range(count, P, R)
                ck.check(
                    part.dtype == tdtype and part.shape == (len(block),),
                    what + " reduce_scatter",
                    str(part.shape),
                )


if __name__ == "__main__":
    run_cases(globals(), teardown=COMM.free)
