"""Every collective x algorithm x dtype x op against a numpy reference, at any world size.

    PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/collectives.py [--torch] [case ...]

Cases, one per collective: allreduce reduce_scatter reduce allgather broadcast barrier. Arrays are numpy
(every dtype numpy has: all but bfloat16); with --torch they are CPU torch tensors of bfloat16
and float16 (zero-copy: results must land in the tensors passed).

Exact cases: every rank can compute every rank's input (a function of rank, index, dtype and
op), chosen so that every reduction order gives the same bits, so results are compared bit for
bit with numpy: integers take any value (wrap-around + and * are order-independent);
floating sum/avg take small integers times a power of two shared by all ranks (sums exact
in every type, bfloat16 included; -0.0 on every rank at some indices); prod takes +-2^k;
min/max take any values plus +-inf, but no zeros or NaNs (min(-0, +0) and NaN payloads depend
on the order). avg is the exact sum divided by p in the dtype (numerics.divide).
Random cases (floating sum, avg, prod): within a tolerance of the float64 result of
(p + 1) * u * sum_r |x_r| (sum; divided by p for avg) or (p + 1) * u * |result| (prod), u the
unit roundoff of the dtype (2^-24, 2^-53, 2^-11, 2^-8), and allreduce results bitwise identical
on every rank.

Counts: 0 .. 4099 (a prime among them) and p - 1, p + 1, 24p + 1. Each (dtype, op, count) runs
in place and out of place (into a given `out`, or a new array), with comm.segment_bytes /
comm.pipeline_depth rotating over PIPELINES so multi-segment code runs on small inputs.
"""

from __future__ import annotations

from harness import WORLD, Checks, option, rng_for, run_cases

# isort: split
import time
from dataclasses import dataclass

import numpy as np
import zcoll
from numerics import (
    DTYPE_CODES,
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    OP_CODES,
    UNIT_ROUNDOFF,
    describe_mismatch,
    equal_bits,
    from_values,
    ops_for,
    random_bits,
    reduce_all,
    smallest_subnormal,
    storage_dtype,
    values,
)

COUNTS = [0, 1, 2, 3, 7, 8, 9, 17, 31, 33, 1000, 1009, 4099]
LARGE = 1 << 18  # one case per algorithm / collective with the default segments (several of them)
RANDOM_COUNTS = [33, 1009, 4099]
# (segment_bytes, pipeline_depth); 0 = the built-in default (128 KiB, 4). See pipeline().
PIPELINES = [(0, 0), (64, 1), (64, 3), (4096, 3)]
ALGORITHMS = list(zcoll.ALGORITHMS)


def slow_first_hop(p: int) -> np.ndarray:
    """A made-up link matrix (bytes/s): 1 GB/s, but rank 0 -> 1 at a quarter of that."""
    bw = np.full((p, p), 1e9)
    if p > 1:
        bw[0, 1] = 0.25e9
    return bw

SENTINEL = 0x5A


@dataclass(frozen=True)
class Case:
    collective: str
    dtype: str
    count: int
    algorithm: str = ""
    op: str = ""
    root: int = -1
    placement: str = "out"  # "in-place", "out" (a given out buffer) or "new" (out=None)
    segment_bytes: int = 0
    depth: int = 0
    inputs: str = "exact"  # "exact", "random", "nan" or "bits" (copying collectives)

    def __str__(self) -> str:
        parts = [self.collective]
        if self.algorithm:
            parts.append(f"algorithm={self.algorithm}")
        parts.append(f"dtype={self.dtype}")
        if self.op:
            parts.append(f"op={self.op}")
        parts.append(f"count={self.count}")
        if self.root >= 0:
            parts.append(f"root={self.root}")
        parts += [
            self.placement,
            f"segment_bytes={self.segment_bytes}",
            f"depth={self.depth}",
            f"inputs={self.inputs}",
        ]
        return " ".join(parts)


def counts_for(p: int) -> list:
    return sorted(set(COUNTS + [p - 1, p + 1, 24 * p + 1]))


# -- inputs -----------------------------------------------------------------------------------
def exact_input(dtype: str, op: str, count: int, rank: int, p: int) -> np.ndarray:
    i = np.arange(count)
    rng = rng_for(rank, count, DTYPE_CODES[dtype], OP_CODES[op])
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    tiny = smallest_subnormal(dtype)
    if op in ("sum", "avg"):
        small = ((i * 13 + rank * 7 + 3) % 17) - 8
        v = small * np.exp2((i % 11) - 5)
        v[i % 29 == 3] = -0.0
        v[i % 31 == 7] = small[i % 31 == 7] * tiny  # subnormal sums are exact too
        return from_values(v, dtype)
    if op == "prod":
        sign = np.where((i + rank) % 3 == 0, -1.0, 1.0)
        return from_values(sign * np.exp2(((i * 5 + rank * 3) % 5) - 2), dtype)
    v = rng.standard_normal(count) * 100.0
    v[(i % 37 == 1) & (i % p == rank)] = np.inf
    v[(i % 37 == 2) & ((i + 1) % p == rank)] = -np.inf
    v[(i % 41 == 5) & (i % p == rank)] = tiny
    v[(i % 41 == 5) & ((i + 1) % p == rank)] = -tiny
    s = from_values(v, dtype)
    s[values(s, dtype) == 0] = from_values(np.ones(1), dtype)[0]
    return s


def random_input(dtype: str, op: str, count: int, rank: int) -> np.ndarray:
    rng = rng_for(rank, count, DTYPE_CODES[dtype], OP_CODES[op], 1)
    if op == "prod":
        v = rng.uniform(0.5, 2.0, count) * rng.choice([-1.0, 1.0], count)
    else:
        v = rng.uniform(-1.0, 1.0, count)
    return from_values(v, dtype)


def nan_input(dtype: str, op: str, count: int, rank: int, p: int) -> np.ndarray:
    """exact_input with a NaN on one rank at every 13th index (a different rank each time)."""
    s = exact_input(dtype, "sum" if op == "avg" else op, count, rank, p)
    i = np.arange(count)
    s[(i % 13 == 0) & ((i // 13) % p == rank)] = from_values(np.array([np.nan]), dtype)[0]
    return s


def make_input(case: Case, rank: int, p: int) -> np.ndarray:
    if case.inputs == "bits":
        return random_bits(rng_for(rank, case.count, DTYPE_CODES[case.dtype], 7), case.count, case.dtype)
    if case.inputs == "random":
        return random_input(case.dtype, case.op, case.count, rank)
    if case.inputs == "nan":
        return nan_input(case.dtype, case.op, case.count, rank, p)
    return exact_input(case.dtype, case.op, case.count, rank, p)


def within_tolerance(got: np.ndarray, inputs: list, dtype: str, op: str) -> np.ndarray:
    p = len(inputs)
    x = np.stack([values(a, dtype).astype(np.float64) for a in inputs])
    g = values(got, dtype).astype(np.float64)
    u = UNIT_ROUNDOFF[dtype]
    if op == "prod":
        ref = np.prod(x, axis=0)
        tol = (p + 1) * u * np.abs(ref)
    else:
        ref, tol = x.sum(axis=0), (p + 1) * u * np.abs(x).sum(axis=0)
        if op == "avg":
            ref, tol = ref / p, tol / p
    return np.abs(g - ref) <= tol


# -- array kinds --------------------------------------------------------------------------------
class NumpyArrays:
    name = "numpy"
    dtypes = tuple(d for d in DTYPES if d != "bfloat16")

    def make(self, storage: np.ndarray, dtype: str):
        return storage.copy()

    def storage(self, obj, dtype: str) -> np.ndarray:
        return obj

    def is_kind(self, obj, dtype: str) -> bool:
        return isinstance(obj, np.ndarray) and obj.dtype == storage_dtype(dtype)


class TorchArrays:
    name = "torch"
    dtypes = ("bfloat16", "float16")

    def __init__(self):
        import torch

        self.torch = torch

    def make(self, storage: np.ndarray, dtype: str):
        t = self.torch.from_numpy(storage.copy())
        return t.view(self.torch.bfloat16) if dtype == "bfloat16" else t

    def storage(self, obj, dtype: str) -> np.ndarray:
        if dtype == "bfloat16":
            return obj.view(self.torch.int16).numpy().view(np.uint16)
        return obj.numpy()

    def is_kind(self, obj, dtype: str) -> bool:
        return isinstance(obj, self.torch.Tensor) and str(obj.dtype) == f"torch.{dtype}"


# -- the cases ----------------------------------------------------------------------------------
def pipeline(k: int, dtype: str, count: int) -> dict:
    """The k-th pipeline setting (rotating). 64-byte segments of a large buffer mean thousands
    of messages, seconds when ranks are oversubscribed: large buffers get 512-byte ones."""
    seg, depth = PIPELINES[k % len(PIPELINES)]
    if seg == 64 and count * storage_dtype(dtype).itemsize > 1024:
        seg = 512
    return {"segment_bytes": seg, "depth": depth}


def other_placement(k: int) -> str:
    return "out" if k % 2 else "new"


def placement(k: int) -> str:
    return ("in-place", "out", "in-place", "new")[k % 4]


def allreduce_cases(dtypes, p):
    for di, dtype in enumerate(dtypes):
        for oi, op in enumerate(ops_for(dtype)):
            for ci, count in enumerate(counts_for(p)):
                for ai, algorithm in enumerate(ALGORITHMS):
                    # placement and pipeline rotate at different paces, so that over the
                    # counts every (algorithm, dtype, op) meets every combination of the two
                    k = ci + ai + di + oi
                    yield Case(
                        "allreduce",
                        dtype,
                        count,
                        algorithm,
                        op,
                        placement=placement(k),
                        **pipeline(k + ci // 4, dtype, count),
                    )
    for dtype in (d for d in dtypes if d in FLOAT_DTYPES):
        for op in ("sum", "avg", "prod"):
            for ci, count in enumerate(RANDOM_COUNTS):
                for ai, algorithm in enumerate(ALGORITHMS):
                    yield Case(
                        "allreduce",
                        dtype,
                        count,
                        algorithm,
                        op,
                        inputs="random",
                        **pipeline(ci + ai, dtype, count),
                    )
        for op in ("sum", "min", "max"):
            for ai, algorithm in enumerate(ALGORITHMS):
                yield Case("allreduce", dtype, 1009, algorithm, op, inputs="nan", **pipeline(ai, dtype, 1009))
    for algorithm in ALGORITHMS:
        if algorithm != "mpi" or p <= 2:  # MPICH's own collectives are slow when oversubscribed
            yield Case("allreduce", dtypes[0], LARGE, algorithm, "avg", placement="in-place")


def reduce_scatter_cases(dtypes, p):
    for di, dtype in enumerate(dtypes):
        for op in ops_for(dtype):
            for ci, count in enumerate(counts_for(p)):
                yield Case(
                    "reduce_scatter",
                    dtype,
                    count,
                    op=op,
                    placement="in-place",
                    **pipeline(ci + di, dtype, count),
                )
                yield Case(
                    "reduce_scatter",
                    dtype,
                    count,
                    op=op,
                    placement=other_placement(ci),
                    **pipeline(ci + di + 2, dtype, count),
                )
            if dtype in FLOAT_DTYPES and op != "min" and op != "max":
                for ci, count in enumerate(RANDOM_COUNTS):
                    yield Case(
                        "reduce_scatter", dtype, count, op=op, inputs="random", **pipeline(ci, dtype, count)
                    )


def reduce_cases(dtypes, p):
    for di, dtype in enumerate(dtypes):
        for oi, op in enumerate(ops_for(dtype)):
            for ci, count in enumerate(counts_for(p)):
                root = (ci + oi + di) % p
                yield Case(
                    "reduce",
                    dtype,
                    count,
                    op=op,
                    root=root,
                    placement="in-place",
                    **pipeline(ci + di, dtype, count),
                )
                yield Case(
                    "reduce",
                    dtype,
                    count,
                    op=op,
                    root=(root + 1) % p,
                    placement=other_placement(ci),
                    **pipeline(ci + di + 2, dtype, count),
                )
            if dtype in FLOAT_DTYPES and op != "min" and op != "max":
                for ci, count in enumerate(RANDOM_COUNTS):
                    yield Case(
                        "reduce",
                        dtype,
                        count,
                        op=op,
                        root=(ci + oi) % p,
                        inputs="random",
                        **pipeline(ci, dtype, count),
                    )


def allgather_cases(dtypes, p):
    for di, dtype in enumerate(dtypes):
        for ci, count in enumerate(counts_for(p)):
            for k, placement in enumerate(("in-place", "out", "new")):
                yield Case(
                    "allgather",
                    dtype,
                    count,
                    placement=placement,
                    inputs="bits",
                    **pipeline(ci + di + k, dtype, count),
                )


def broadcast_cases(dtypes, p):
    for di, dtype in enumerate(dtypes):
        for ci, count in enumerate(counts_for(p)):
            for root in range(p):
                yield Case(
                    "broadcast",
                    dtype,
                    count,
                    root=root,
                    placement="in-place",
                    inputs="bits",
                    **pipeline(ci + di + root, dtype, count),
                )


def large_cases(dtypes, p):
    """One LARGE case per non-allreduce collective, default pipeline."""
    yield Case("reduce_scatter", dtypes[0], LARGE, op="avg")
    yield Case("reduce", dtypes[0], LARGE, op="sum", root=p - 1, placement="new")
    yield Case("allgather", dtypes[0], LARGE, inputs="bits")
    yield Case("broadcast", dtypes[0], LARGE, root=p - 1, placement="in-place", inputs="bits")


CASES = {
    "allreduce": allreduce_cases,
    "reduce_scatter": reduce_scatter_cases,
    "reduce": reduce_cases,
    "allgather": allgather_cases,
    "broadcast": broadcast_cases,
}


# -- running them ---------------------------------------------------------------------------------
class Tester:
    """Runs Cases of one kind of array on one communicator; self.ck: the checks of the running case."""

    def __init__(self, kind):
        # links with one slow hop in rank order: algorithm ordered_ring runs a permuted ring
        self.comm = zcoll.Communicator(topology=slow_first_hop(WORLD.size))
        self.p, self.rank = self.comm.size, self.comm.rank
        self.kind = kind
        self.ck: Checks = None
        self._last_inputs: tuple = (None, [])

    def all_inputs(self, case: Case) -> list:
        """Every rank's input. They depend on dtype, op, count and kind of inputs only, and the
        generators list cases sharing them one after another: the last ones are kept."""
        key = (case.dtype, case.op, case.count, case.inputs)
        if self._last_inputs[0] != key:
            self._last_inputs = (key, [make_input(case, r, self.p) for r in range(self.p)])
        return self._last_inputs[1]

    def sentinel(self, shape: tuple, dtype: str):
        n = int(np.prod(shape)) if shape else 1
        raw = np.full(n * storage_dtype(dtype).itemsize, SENTINEL, dtype=np.uint8)
        return self.kind.make(raw.view(storage_dtype(dtype)).reshape(shape), dtype)

    def out_for(self, case: Case, x, shape: tuple):
        if case.placement == "in-place":
            return x
        if case.placement == "new":
            return None
        return self.sentinel(shape, case.dtype)

    def check_object(self, case: Case, res, out, shape: tuple) -> bool:
        if out is not None and res is not out:
            return self.ck.check(False, case, "did not return the `out` object it was given")
        if not self.kind.is_kind(res, case.dtype):
            return self.ck.check(False, case, f"returned {type(res).__name__} {getattr(res, 'dtype', '')}")
        return self.ck.check(tuple(res.shape) == shape, case, f"result shape {tuple(res.shape)} != {shape}")

    def compare(self, case: Case, got, expected: np.ndarray, nan_payload: bool = True) -> None:
        got = np.asarray(self.kind.storage(got, case.dtype)).reshape(-1)
        ok = equal_bits(got, expected.reshape(-1), case.dtype, nan_payload)
        self.ck.check(ok.all(), case, describe_mismatch(got, expected.reshape(-1), case.dtype, ok))

    def check_untouched(self, case: Case, obj, before: np.ndarray, what: str) -> None:
        now = np.asarray(self.kind.storage(obj, case.dtype)).reshape(-1)
        ok = equal_bits(now, before.reshape(-1), case.dtype)
        self.ck.check(
            ok.all(),
            case,
            f"{what} was modified: " + describe_mismatch(now, before.reshape(-1), case.dtype, ok),
        )

    def check_reduction(self, case: Case, got, inputs: list, block=slice(None)) -> None:
        """Exact inputs: bitwise against numpy. Random: tolerance. NaN: NaN where expected."""
        if case.inputs == "random":
            g = np.asarray(self.kind.storage(got, case.dtype)).reshape(-1)
            ok = within_tolerance(g, [a[block] for a in inputs], case.dtype, case.op)
            ref = reduce_all([a[block] for a in inputs], case.dtype, case.op)
            self.ck.check(ok.all(), case, "outside tolerance: " + describe_mismatch(g, ref, case.dtype, ok))
        else:
            self.compare(case, got, reduce_all(inputs, case.dtype, case.op)[block], case.inputs != "nan")

    def run(self, case: Case) -> None:
        self.comm.segment_bytes, self.comm.pipeline_depth = case.segment_bytes, case.depth
        try:
            getattr(self, "run_" + case.collective)(case, self.all_inputs(case))
        except Exception as e:
            self.ck.fail(case, f"raised {type(e).__name__}: {e}")
            raise

    def run_allreduce(self, case: Case, inputs: list) -> None:
        x = self.kind.make(inputs[self.rank], case.dtype)
        out = self.out_for(case, x, (case.count,))
        res = self.comm.allreduce(x, op=case.op, algorithm=case.algorithm, out=out)
        if not self.check_object(case, res, out, (case.count,)):
            return
        if case.placement != "in-place":
            self.check_untouched(case, x, inputs[self.rank], "the input")
        self.check_reduction(case, res, inputs)
        if case.inputs == "random":
            self.ck.same_on_all_ranks(case, self.kind.storage(res, case.dtype).tobytes())

    def run_reduce_scatter(self, case: Case, inputs: list) -> None:
        block = zcoll.block_range(case.count, self.p, self.rank)
        n = len(block)
        x = self.kind.make(inputs[self.rank], case.dtype)
        # in place: the output is this rank's own block of the input
        out = x[block.start : block.stop] if case.placement == "in-place" else self.out_for(case, x, (n,))
        res = self.comm.reduce_scatter(x, op=case.op, out=out)
        if not self.check_object(case, res, out, (n,)):
            return
        if case.placement != "in-place":
            self.check_untouched(case, x, inputs[self.rank], "the input")
        self.check_reduction(case, res, inputs, slice(block.start, block.stop))

    def run_reduce(self, case: Case, inputs: list) -> None:
        x = self.kind.make(inputs[self.rank], case.dtype)
        out = self.out_for(case, x, (case.count,))
        before = None if out is None else self.kind.storage(out, case.dtype).copy()
        res = self.comm.reduce(x, root=case.root, op=case.op, out=out)
        if self.rank != case.root:
            self.ck.check(res is None, case, f"returned {type(res).__name__} on a non-root rank")
            if out is not None:
                self.check_untouched(case, out, before, "`out` on a non-root rank")
            return
        if not self.check_object(case, res, out, (case.count,)):
            return
        if case.placement != "in-place":
            self.check_untouched(case, x, inputs[self.rank], "the input")
        self.check_reduction(case, res, inputs)

    def run_allgather(self, case: Case, inputs: list) -> None:
        shape = (self.p, case.count)
        if case.placement == "in-place":  # x is this rank's row of out
            out = self.sentinel(shape, case.dtype)
            self.kind.storage(out, case.dtype)[self.rank] = inputs[self.rank]
            x = out[self.rank]
        else:
            x = self.kind.make(inputs[self.rank], case.dtype)
            out = self.out_for(case, x, shape)
        res = self.comm.allgather(x, out=out)
        if self.check_object(case, res, out, shape):
            self.compare(case, res, np.stack(inputs))

    def run_broadcast(self, case: Case, inputs: list) -> None:
        mine = (
            inputs[self.rank]
            if self.rank == case.root
            else self.kind.storage(self.sentinel((case.count,), case.dtype), case.dtype)
        )
        x = self.kind.make(mine, case.dtype)
        res = self.comm.broadcast(x, root=case.root)
        if self.check_object(case, res, x, (case.count,)):
            self.compare(case, res, inputs[case.root])


def check_barrier(comm, ck: Checks) -> None:
    """Nobody leaves a barrier before the last rank has entered it (the late rank rotates);
    then many barriers back to back, each counted once in stats()."""
    p = comm.size
    rounds = 2 * p
    times = np.zeros((rounds, 2))
    for k in range(rounds):
        if comm.rank == k % p:
            time.sleep(0.03)
        times[k, 0] = time.monotonic()
        comm.barrier()
        times[k, 1] = time.monotonic()
    every = np.empty((p, rounds, 2))
    WORLD.Allgather(times, every)
    for k in range(rounds):
        last_in, first_out = every[:, k, 0].max(), every[:, k, 1].min()
        ck.check(
            first_out >= last_in,
            f"barrier round {k} (rank {k % p} late)",
            f"a rank left {last_in - first_out:.6f} s before the last one entered",
        )
    before = comm.stats()["collectives"]
    for _ in range(200):
        comm.barrier()
    ck.check(comm.stats()["collectives"] - before == 200, "200 barriers", f"stats: {comm.stats()}")


TESTER = Tester(TorchArrays() if option("torch") is not None else NumpyArrays())


def run_collective(collective: str, ck: Checks) -> None:
    TESTER.ck = ck
    large = [c for c in large_cases(TESTER.kind.dtypes, TESTER.p) if c.collective == collective]
    for case in [*CASES[collective](TESTER.kind.dtypes, TESTER.p), *large]:
        TESTER.run(case)


def case_allreduce(ck: Checks) -> None:
    run_collective("allreduce", ck)


def case_reduce_scatter(ck: Checks) -> None:
    run_collective("reduce_scatter", ck)


def case_reduce(ck: Checks) -> None:
    run_collective("reduce", ck)


def case_allgather(ck: Checks) -> None:
    run_collective("allgather", ck)


def case_broadcast(ck: Checks) -> None:
    run_collective("broadcast", ck)


def case_barrier(ck: Checks) -> None:
    check_barrier(TESTER.comm, ck)


if __name__ == "__main__":
    run_cases(globals(), teardown=TESTER.comm.free)
