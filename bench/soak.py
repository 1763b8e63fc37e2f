"""Soak: a long, seeded mix of every collective, each result checked, resident memory watched.

    mpirun -n 4 python -m mpi4py bench/soak.py --collectives 100000          # the long run
    mpirun -n 2 python -m mpi4py bench/soak.py --collectives 2500 --max-bytes 256K   # CI's short one

1. Targets, interleaved: zcoll Communicators on the world (one with check mode and 8 KiB
   segments) and on a subgroup (ranks 1..p-1), and, when torch is installed, the torch "zcoll"
   process groups of the world and of the same subgroup. A rank outside a subgroup skips its
   calls (they are calls on another communicator, so nothing waits for it).
2. Every rank draws the same sequence from --seed: per call a target, a collective (allreduce with
   every algorithm, compressed allreduce with every compressor, with and without error feedback
   on a fixed pool of keys, reduce_scatter, allgather, broadcast, reduce, barrier), a dtype and op
   valid for it, a size log-uniform in [1 B, --max-bytes] (3% empty), numpy or torch arrays, in
   place or not, a root. Call i uses its own generator (seed, i), so ranks agree without talking.
3. Inputs are exact: small integers (scaled by a power of two for floats) whose sums and
   products are exact in any order, so sum, prod, min, max must match numpy bit for bit and avg
   within one rounding; integers may wrap, which is order-independent too. Compressed results
   must lie within the compressor's documented error bound (docs/algorithms.md) of the exact sum
   of every rank's input plus its error-feedback residual (gathered before the call), and be
   identical on every rank.
4. A prologue first runs every collective, algorithm and compressor at --max-bytes on every
   target, so each scratch area is at its high-water mark before memory is measured; RSS (from
   /proc/self/statm, so what is resident now, not a peak) is sampled after --baseline calls and at
   the end, after malloc_trim and with glibc's mmap threshold fixed (steady_heap), so that
   it counts what the process holds, not what the allocator caches of freed temporaries. The
   summary names the calls during which RSS grew most, should it grow.
   Each RSS figure comes with where it is: malloc's bytes in use (heap, mmapped blocks), the
   heap's free bytes, and the kernel's anonymous / shared-memory / file split. With MPICH's
   default ucx netmod RSS grows by ~0.2 MiB per 1,000 calls in anonymous memory that malloc
   did not hand out (measured: +18.6 MiB over 100,000 calls while malloc's bytes in use grew
   +3.0 MiB); with MPIR_CVAR_CH4_NETMOD=ofi, the same calls, it does not: the growth is the ucx
   transport's, not zcoll's, and this is how to soak zcoll itself:
       mpirun -n 2 -genv MPIR_CVAR_CH4_NETMOD ofi python -m mpi4py bench/soak.py
5. Progress lines on rank 0 every --progress seconds; a summary; exit status 1 when any result
   was wrong or any rank's RSS grew by more than --rss-limit MiB, 0 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import zcoll
from mpi4py import MPI
from zcoll.compression.error_bounds import beyond_bound
from zcoll.tools import exact_inputs
from zcoll.tools.exact_inputs import INT_DTYPES

try:
    import torch
except ImportError:  # numpy arrays only, no torch process groups, no bfloat16
    torch = None

WORLD = MPI.COMM_WORLD
ALGORITHMS = list(zcoll.ALGORITHMS)  # every name, ordered_ring and hierarchical too
FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
ITEMSIZE = {d: 2 if d == "bfloat16" else np.dtype(d).itemsize for d in INT_DTYPES + FLOAT_DTYPES}
KINDS = {  # collective: weight in the random phase
    "allreduce": 34,
    "compressed": 16,
    "reduce_scatter": 12,
    "allgather": 12,
    "broadcast": 10,
    "reduce": 10,
    "barrier": 6,
}
TORCH_KINDS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "barrier"]
COMPRESSED_DTYPES = ["float32", "float16", "bfloat16"]
# Each zcoll target builds one of each and keeps it; "+ef": error feedback, on the fixed keys.
COMPRESSORS: dict[str, Callable[[], Any]] = {
    "int8": lambda: zcoll.GradientQuantizer(8, error_feedback=False),
    "int4": lambda: zcoll.GradientQuantizer(4, error_feedback=False),
    "sign": lambda: zcoll.GradientQuantizer(1, error_feedback=False),
    "int8-stochastic": lambda: zcoll.GradientQuantizer(8, stochastic=True, error_feedback=False, seed=7),
    "int4-block64": lambda: zcoll.GradientQuantizer(4, block=64, error_feedback=False),
    "fp16": lambda: zcoll.HalfPrecision("fp16"),
    "bf16": lambda: zcoll.HalfPrecision("bf16"),
    "topk": lambda: zcoll.TopK(0.01, error_feedback=False),
    "topk-exact": lambda: zcoll.TopK(0.05, error_feedback=False, exact=True),
    "randomk": lambda: zcoll.RandomK(0.05, seed=3, error_feedback=False),
    "threshold": lambda: zcoll.Threshold(1.5, error_feedback=False),
    "int8+ef": lambda: zcoll.GradientQuantizer(8),
    "sign+ef": lambda: zcoll.GradientQuantizer(1),
    "topk+ef": lambda: zcoll.TopK(0.02),
    "randomk+ef": lambda: zcoll.RandomK(0.1, seed=5),
    "threshold+ef": lambda: zcoll.Threshold(1.0),
    "bf16+ef": lambda: zcoll.HalfPrecision("bf16", error_feedback=True),
}
EF_KEYS = 3  # error-feedback keys per compressor, each of a size fixed for the run


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def options(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--collectives", type=int, default=100_000, help="calls in all, prologue included (100000)"
    )
    p.add_argument(
        "--seconds", type=float, default=0, help="stop after this long, whatever the count (0: no limit)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the call sequence (1)")
    p.add_argument("--max-bytes", type=parse_bytes, default=4 << 20, help="largest input per rank (4M)")
    p.add_argument("--baseline", type=int, default=1000, help="RSS baseline after this many calls (1000)")
    p.add_argument(
        "--rss-limit", type=float, default=5.0, help="allowed RSS growth after the baseline, MiB (5)"
    )
    p.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines (10)")
    p.add_argument("--no-torch", action="store_true", help="no torch arrays or process groups")
    p.add_argument("--show", type=int, default=20, help="wrong results printed per rank (20)")
    o = p.parse_args(argv)
    if o.collectives < 1 or o.max_bytes < 8 or o.baseline < 0 or o.rss_limit < 0:
        p.error("--collectives >= 1, --max-bytes >= 8, --baseline >= 0 and --rss-limit >= 0")
    return o


LIBC = ctypes.CDLL(None)  # glibc's mallopt / malloc_trim where present


def steady_heap() -> bool:
    """Allocations above 64 KiB straight from mmap, so that freed ones go back to the OS.

    glibc otherwise raises its mmap threshold to the largest block freed (up to 32 MiB): the
    checker's numpy temporaries (up to 4 MiB per rank and input) then come from the heap, whose
    free space fragments and stays resident. True when set (glibc only)."""
    mallopt = getattr(LIBC, "mallopt", None)
    return bool(mallopt and mallopt(-3, 64 << 10))  # M_MMAP_THRESHOLD


def rss_bytes(trim: bool = False) -> int:
    """Resident bytes now (/proc/self/statm). trim: first hand the allocator's free pages back
    (malloc_trim), so that the figure is what the process holds, not what glibc keeps cached."""
    if trim and hasattr(LIBC, "malloc_trim"):
        LIBC.malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def memory_breakdown() -> dict:
    """Where resident memory is: malloc's bytes handed out and not had back (mallinfo2, every
    arena, glibc 2.33+: in-use heap chunks, and blocks mmapped on their own), the free bytes
    its heaps keep, and the kernel's split of RSS (anonymous, shared memory, files). A leak
    grows what is in use; fragmentation grows the heaps' free bytes; memory mapped outside
    malloc grows the RSS split alone."""
    out = {}
    fn = getattr(LIBC, "mallinfo2", None)
    if fn is not None:
        fn.restype = _Mallinfo2
        m = fn()
        out = {"malloc heap in use": m.uordblks, "malloc mmapped": m.hblkhd, "malloc heap free": m.fordblks}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssShmem", "RssFile")):
                name, kib = line.split()[:2]
                out[name.rstrip(":")] = int(kib) * 1024
    return out


def say(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write per line: hydra prefixes each chunk it reads
    sys.stdout.flush()


# -- targets -------------------------------------------------------------------------------------
def slow_first_hop(p: int) -> np.ndarray:
    """A made-up link matrix (bytes/s): 1 GB/s, but rank 0 -> 1 at a quarter of that."""
    bw = np.full((p, p), 1e9)
    if p > 1:
        bw[0, 1] = 0.25e9
    return bw


class Target:
    """A communicator the calls run on; `member` is False on ranks outside it. `size` is known
    on every rank (calls are drawn alike everywhere), `rank` on members only."""

    name: str
    mpi: Any  # the mpi4py communicator with the same ranks (gathering residuals and digests)
    size: int
    member: bool
    torch_only: bool = False

    @property
    def rank(self) -> int:
        return self.mpi.rank


class ZcollTarget(Target):
    def __init__(self, name: str, mpi_comm: Any, size: int, check: bool = False, segment_bytes: int = 0):
        self.name, self.mpi, self.size = name, mpi_comm, size
        self.member = mpi_comm != MPI.COMM_NULL
        if self.member:
            # links with one slow hop in rank order: algorithm ordered_ring runs a permuted ring
            self.comm = zcoll.Communicator(mpi_comm, check=check, topology=slow_first_hop(size))
            self.comm.segment_bytes = segment_bytes
            self.compressors = {name: make() for name, make in COMPRESSORS.items()}

    def free(self) -> None:
        if self.member:
            self.comm.free()


class TorchTarget(Target):
    torch_only = True

    def __init__(self, name: str, mpi_comm: Any, size: int, group: Any):
        self.name, self.mpi, self.size, self.group = name, mpi_comm, size, group
        self.member = mpi_comm != MPI.COMM_NULL

    def free(self) -> None:
        pass  # torch's process groups are destroyed with the default one


# -- one call ----------------------------------------------------------------------------------------
@dataclass
class Call:
    index: int
    target: Target
    kind: str
    dtype: str = "float32"
    count: int = 0
    op: str = "sum"
    algorithm: str = "auto"
    root: int = 0
    in_place: bool = False
    use_torch: bool = False
    compressor: str = ""
    key: str | None = None
    async_op: bool = False
    pattern: tuple = ()  # (m, a, b, c, scale exponent) of the exact inputs

    def describe(self) -> str:
        what = [f"#{self.index} {self.target.name} {self.kind}"]
        if self.kind != "barrier":
            what.append(f"{self.dtype}[{self.count}]")
        if self.kind in ("allreduce", "reduce_scatter", "reduce"):
            what.append(f"op={self.op}")
        if self.kind == "allreduce" and not self.target.torch_only:
            what.append(f"algorithm={self.algorithm}")
        if self.kind == "compressed":
            what.append(f"{self.compressor} op={self.op}" + (f" key={self.key}" if self.key else ""))
        if self.kind in ("broadcast", "reduce"):
            what.append(f"root={self.root}")
        for flag, text in ((self.in_place, "in place"), (self.use_torch, "torch"), (self.async_op, "async")):
            if flag:
                what.append(text)
        return " ".join(what)


class Plan:
    """Draws calls: the same ones on every rank."""

    def __init__(self, seed: int, targets: list[Target], max_bytes: int, with_torch: bool):
        self.seed, self.targets, self.max_bytes, self.with_torch = seed, targets, max_bytes, with_torch
        self.kinds = list(KINDS)
        self.weights = np.array([KINDS[k] for k in self.kinds], dtype=float)
        self.weights /= self.weights.sum()
        rng = np.random.default_rng([seed, 1 << 40])
        top = max(1, int(math.log2(max(max_bytes // 4, 2))))
        self.ef_keys = {f"w{j}": int(2 ** rng.uniform(0, top)) for j in range(EF_KEYS)}  # key: count
        self.dtypes = INT_DTYPES + [d for d in FLOAT_DTYPES if d != "bfloat16" or with_torch]

    def draw(self, index: int) -> Call:
        rng = np.random.default_rng([self.seed, index])
        target = self.targets[rng.integers(len(self.targets))]
        kinds = TORCH_KINDS if target.torch_only else self.kinds
        weights = None if target.torch_only else self.weights
        kind = str(rng.choice(kinds, p=weights))
        return self.fill(Call(index, target, kind), rng)

    def fill(self, c: Call, rng, nbytes: int | None = None) -> Call:
        p = c.target.size
        if c.kind == "compressed":
            c.compressor = str(rng.choice(list(COMPRESSORS)))
            c.dtype = str(rng.choice(COMPRESSED_DTYPES if self.with_torch else COMPRESSED_DTYPES[:2]))
            c.op = str(rng.choice(["sum", "avg"]))
            if c.compressor.endswith("+ef"):
                c.key = str(rng.choice(list(self.ef_keys)))
                c.count = self.ef_keys[c.key]
        elif c.kind != "barrier":
            c.dtype = str(rng.choice(self.dtypes))
            ops = ["sum", "prod", "min", "max"] + (["avg"] if c.dtype in FLOAT_DTYPES else [])
            c.op = str(rng.choice(ops))
            c.algorithm = str(rng.choice(ALGORITHMS))
        if c.kind != "barrier" and not c.key:
            if nbytes is None:
                nbytes = 0 if rng.random() < 0.03 else int(2 ** rng.uniform(0, math.log2(self.max_bytes)))
            c.count = nbytes // ITEMSIZE[c.dtype]
            if c.target.torch_only and c.kind == "reduce_scatter":
                c.count -= c.count % p  # reduce_scatter_tensor: p equal blocks
        c.root = int(rng.integers(p))
        c.in_place = bool(rng.random() < 0.4)
        c.use_torch = self.with_torch and (
            c.target.torch_only or c.dtype == "bfloat16" or rng.random() < 0.25
        )
        c.async_op = c.target.torch_only and bool(rng.random() < 0.3)
        m = int(rng.integers(3, 256))
        c.pattern = (m, *(int(v) for v in rng.integers([1, 0, 0, 0], [m, m, m, 5])))
        return c

    def prologue(self) -> list[Call]:
        """Every collective, algorithm and compressor at the largest size on every target."""
        calls: list[Call] = []
        rng = np.random.default_rng([self.seed, 1 << 41])

        def add(target, kind, **fields):
            c = Call(-1, target, kind)
            self.fill(c, rng, self.max_bytes)
            for k, v in fields.items():
                setattr(c, k, v)
            if kind == "compressed" and c.key:
                c.count = self.ef_keys[c.key]
            elif kind != "barrier":
                c.count = self.max_bytes // ITEMSIZE[c.dtype]
                c.count -= c.count % c.target.size if c.target.torch_only and kind == "reduce_scatter" else 0
            calls.append(c)

        def rooted(t, **fields):  # every root, both parities
            for root in range(t.size):
                for kind in ("broadcast", "reduce", "reduce_scatter", "allgather"):
                    for _ in range(2):
                        add(t, kind, dtype="float32", op="sum", root=root, **fields)

        for t in self.targets:
            if t.torch_only:
                for kind in TORCH_KINDS:
                    add(t, kind, dtype="float32", op="sum", use_torch=True)
                for dtype in ("int8", "float16", "float32", "float64"):  # as below
                    for _ in range(2):
                        add(t, "allreduce", dtype=dtype, op="sum", use_torch=True)
                rooted(t, use_torch=True)
                continue
            # every algorithm with every element size, both parities of the call, every root:
            # scratch and staging at their high-water marks before memory is measured
            for algorithm in ALGORITHMS:
                for dtype in ("int8", "float16", "float32", "float64"):
                    for _ in range(2):
                        add(t, "allreduce", dtype=dtype, op="sum", algorithm=algorithm)
            rooted(t)
            for name in COMPRESSORS:
                keys = list(self.ef_keys) if name.endswith("+ef") else [None]
                for dtype in ("float32", "float16"):  # float16: the widest float32 scratch per byte
                    for key in keys:
                        add(t, "compressed", compressor=name, dtype=dtype, op="sum", key=key)
        for i, c in enumerate(calls):
            c.index = i
        return calls


# -- inputs and references ----------------------------------------------------------------------------
def exact_values(c: Call, rank: int) -> np.ndarray:
    """Rank `rank`'s input of an exact call, as float64 (floats) or int64 (integers)."""
    return exact_inputs.exact_values(c.pattern, c.count, c.dtype, c.op, rank, c.target.size)


def compressed_values(c: Call, rank: int) -> np.ndarray:
    """A gradient-like input (blocks of very different scale), rounded to the dtype, as float64."""
    rng = np.random.default_rng([c.index, rank, *c.pattern])  # the pattern carries --seed
    n = c.count
    scale = np.repeat(rng.uniform(0.1, 8, size=n // 64 + 1), 64)[:n]
    return round_to(rng.standard_normal(n) * scale, c.dtype)


def round_to(x64: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return torch.from_numpy(x64.astype(np.float32)).to(torch.bfloat16).to(torch.float64).numpy()
    return x64.astype(dtype).astype(np.float64)


def to_array(values: np.ndarray, dtype: str, use_torch: bool) -> Any:
    """numpy or torch array of dtype holding `values` (exactly representable ones)."""
    if dtype == "bfloat16":
        return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
    a = values.astype(dtype)
    return torch.from_numpy(a) if use_torch else a


def as_numbers(y: Any) -> np.ndarray:
    """A result as float64 (floats) or int64 (integers) numpy values."""
    if torch is not None and isinstance(y, torch.Tensor):
        return y.to(torch.float64 if y.is_floating_point() else torch.int64).numpy()
    return y.astype(np.float64 if y.dtype.kind == "f" else np.int64)


def reduce_exact(c: Call, xs: list[np.ndarray]) -> np.ndarray:
    """OP over the ranks' inputs, as numbers (zcoll.tools.exact_inputs.reduce_exact)."""
    return exact_inputs.reduce_exact(xs, c.dtype, c.op)


def mismatch(got: np.ndarray, want: np.ndarray, c: Call) -> str | None:
    """None when got equals want (avg: within one rounding of the dtype), else what differs."""
    one_rounding = c.op == "avg" and c.kind in ("allreduce", "reduce_scatter", "reduce")
    return exact_inputs.mismatch(got, want, c.dtype, one_rounding)


def digest(y: Any) -> bytes:
    if torch is not None and isinstance(y, torch.Tensor):
        y = (y.view(torch.int16) if y.dtype == torch.bfloat16 else y).numpy()
    return hashlib.blake2b(np.ascontiguousarray(y).tobytes(), digest_size=16).digest()


def same_everywhere(t: Target, y: Any) -> bool:
    mine = digest(y)
    return all(d == mine for d in t.mpi.allgather(mine))


# -- running a call ------------------------------------------------------------------------------------
def run_zcoll(c: Call) -> str | None:
    t: ZcollTarget = c.target
    comm, rank, p = t.comm, t.rank, t.size
    if c.kind == "barrier":
        comm.barrier()
        return None
    if c.kind == "compressed":
        return run_compressed(c)
    xs = [exact_values(c, r) for r in range(p)]
    x = to_array(xs[rank], c.dtype, c.use_torch)
    if c.kind == "allreduce":
        out = x if c.in_place else None
        y = comm.allreduce(x, op=c.op, algorithm=c.algorithm, out=out)
        if c.op == "avg" and not same_everywhere(t, y):
            return "result bits differ between ranks"
        return mismatch(as_numbers(y), reduce_exact(c, xs), c)
    if c.kind == "reduce_scatter":
        r = zcoll.block_range(c.count, p, rank)
        y = comm.reduce_scatter(x, op=c.op, out=x[r.start : r.stop] if c.in_place else None)
        return mismatch(as_numbers(y), reduce_exact(c, xs)[r.start : r.stop], c)
    if c.kind == "allgather":
        if c.in_place:
            out = to_array(np.zeros((p, c.count)), c.dtype, c.use_torch)
            out[rank] = x
            y = comm.allgather(out[rank], out=out)
        else:
            y = comm.allgather(x)
        return mismatch(as_numbers(y), np.stack(xs) if c.count else np.zeros((p, 0)), c)
    if c.kind == "broadcast":
        y = comm.broadcast(x, root=c.root)
        return mismatch(as_numbers(y), xs[c.root], c)
    if c.kind == "reduce":
        out = x if (c.in_place and rank == c.root) else None
        y = comm.reduce(x, root=c.root, op=c.op, out=out)
        if rank != c.root:
            return None if y is None else f"returned {type(y).__name__} off the root"
        return mismatch(as_numbers(y), reduce_exact(c, xs), c)
    raise AssertionError(c.kind)


def run_compressed(c: Call) -> str | None:
    t: ZcollTarget = c.target
    comp = t.compressors[c.compressor]
    xs = [compressed_values(c, r) for r in range(t.size)]
    if c.key:  # the residual each rank adds, gathered before the call changes it
        e = comp.residual(c.key)
        mine = np.zeros(c.count, np.float32) if e is None else e.reshape(-1)
        every = np.empty((t.size, c.count), np.float32)
        t.mpi.Allgather(mine, every)
        xs_eff = [xs[r] + every[r].astype(np.float64) for r in range(t.size)]
    else:
        xs_eff = xs
    x = to_array(xs[t.rank], c.dtype, c.use_torch)
    y = t.comm.allreduce(x, op=c.op, compression=comp, key=c.key, out=x if c.in_place else None)
    if not same_everywhere(t, y):
        return "result bits differ between ranks"
    return beyond_bound(as_numbers(y), xs_eff, comp, c.op, c.dtype)


def run_torch(c: Call) -> str | None:
    import torch.distributed as dist

    t: TorchTarget = c.target
    g, rank, p = t.group, t.rank, t.size
    if c.kind == "barrier":
        w = dist.barrier(group=g, async_op=c.async_op)
        if c.async_op:
            w.wait()
        return None
    xs = [exact_values(c, r) for r in range(p)]
    x = to_array(xs[rank], c.dtype, True)
    ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN}
    ops.update(max=dist.ReduceOp.MAX, avg=dist.ReduceOp.AVG)
    to_global = dist.get_global_rank(g, c.root) if g is not None else c.root
    if c.kind == "allreduce":
        w = dist.all_reduce(x, op=ops[c.op], group=g, async_op=c.async_op)
        y, want = x, reduce_exact(c, xs)
    elif c.kind == "reduce_scatter":
        y = torch.empty(c.count // p, dtype=x.dtype)
        reduce_scatter = (
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        )  # torch >= 2.13
        w = reduce_scatter(y, x, op=ops[c.op], group=g, async_op=c.async_op)
        r = zcoll.block_range(c.count, p, rank)
        want = reduce_exact(c, xs)[r.start : r.stop]
    elif c.kind == "allgather":
        y = torch.empty(p * c.count, dtype=x.dtype)
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        w = all_gather(y, x, group=g, async_op=c.async_op)
        want = np.concatenate(xs) if c.count else np.zeros(0)
    elif c.kind == "broadcast":
        w = dist.broadcast(x, src=to_global, group=g, async_op=c.async_op)
        y, want = x, xs[c.root]
    elif c.kind == "reduce":
        w = dist.reduce(x, dst=to_global, op=ops[c.op], group=g, async_op=c.async_op)
        y, want = x, reduce_exact(c, xs)
    else:
        raise AssertionError(c.kind)
    if c.async_op:
        w.wait()
    if c.kind == "reduce" and rank != c.root:
        return None
    return mismatch(as_numbers(y), want, c)


def run(c: Call) -> str | None:
    try:
        return run_torch(c) if c.target.torch_only else run_zcoll(c)
    except Exception as e:
        if isinstance(e, (MemoryError, KeyboardInterrupt)):
            raise
        return f"raised {type(e).__name__}: {e}"


# -- the run ---------------------------------------------------------------------------------------------
def make_targets(with_torch: bool) -> list[Target]:
    p = WORLD.size
    sub_ranks = list(range(1, p)) if p > 1 else [0]
    sub = WORLD.Create_group(WORLD.group.Incl(sub_ranks))
    targets: list[Target] = [
        ZcollTarget("world", WORLD, p),
        ZcollTarget("world-checked", WORLD, p, check=True, segment_bytes=8192),
        ZcollTarget("sub", sub, len(sub_ranks)),
    ]
    if with_torch:
        import torch.distributed as dist
        import zcoll.torch

        zcoll.torch.init_process_group()
        group = dist.new_group(sub_ranks)
        targets.append(TorchTarget("torch", WORLD, p, None))
        targets.append(TorchTarget("torch-sub", sub, len(sub_ranks), group))
    return targets


def summary_lines(per_rank_counts: list) -> list[str]:
    """Calls per target and collective, then per allreduce algorithm and per compressor (each
    label as the busiest rank counted it: non-members of a subgroup count none)."""
    merged: dict[str, int] = {}
    for counts in per_rank_counts:
        for label, n in counts.items():
            merged[label] = max(merged.get(label, 0), n)
    per_kind: dict[str, dict[str, int]] = {}
    detail: dict[str, dict[str, int]] = {"allreduce": {}, "compressed": {}}
    for label, n in merged.items():
        target, what = label.split(": ", 1)
        kind, _, variant = what.partition(" ")
        per_kind.setdefault(target, {})[kind] = per_kind.get(target, {}).get(kind, 0) + n
        if variant:
            detail[kind][variant] = detail[kind].get(variant, 0) + n
    lines = [
        f"{t}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) for t, kinds in per_kind.items()
    ]
    for kind, variants in detail.items():
        lines.append(
            f"{kind} by {'algorithm' if kind == 'allreduce' else 'compressor'}: "
            + ", ".join(f"{v} {n}" for v, n in sorted(variants.items()))
        )
    return lines


@dataclass
class Tally:
    """What this rank's calls did so far: calls and RSS growth per label, wrong results."""

    show: int  # wrong results printed at most
    counts: dict[str, int] = field(default_factory=dict)
    grew: dict[str, int] = field(default_factory=dict)  # RSS change (bytes) per label, after the baseline
    wrong: int = 0
    shown: int = 0
    rss_base: int | None = None
    mem_base: dict = field(default_factory=dict)

    def call(self, c: Call) -> None:
        """Runs c, counting it under its label (and the RSS change it came with)."""
        before = rss_bytes() if self.rss_base is not None else 0
        problem = run(c)
        label = c.kind + (f" {c.algorithm}" if c.kind == "allreduce" and not c.target.torch_only else "")
        label = f"{c.target.name}: " + (f"compressed {c.compressor}" if c.kind == "compressed" else label)
        self.counts[label] = self.counts.get(label, 0) + 1
        if self.rss_base is not None:  # which calls the growth came with, should there be any
            self.grew[label] = self.grew.get(label, 0) + rss_bytes() - before
        if problem:
            self.wrong += 1
            if self.shown < self.show:
                self.shown += 1
                say(f"soak WRONG rank {WORLD.rank}: {c.describe()}: {problem}")

    def progress(self, o: argparse.Namespace, done: int, seconds: float) -> str:
        grown = (
            ""
            if self.rss_base is None
            else f" ({(rss_bytes(trim=True) - self.rss_base) / 2**20:+.2f} MiB since call {o.baseline}"
            + memory_change({"mem_base": self.mem_base, "mem_end": memory_breakdown()})
            + ")"
        )
        rss = rss_bytes() / 2**20
        calls = f"{done}/{o.collectives} calls, {seconds:.0f} s"
        return f"soak: {calls}, rss {rss:.1f} MiB{grown}, wrong {self.wrong}"


def run_calls(o: argparse.Namespace, plan: Plan, prologue: list, tally: Tally) -> tuple:
    """The prologue, then drawn calls, until --collectives or --seconds; (calls done, seconds)."""
    start = last_progress = time.monotonic()
    done = 0
    while done < o.collectives:
        if (
            o.seconds
            and done % 64 == 0
            and WORLD.allreduce(time.monotonic() - start >= o.seconds, op=MPI.LOR)
        ):
            break
        c = prologue[done] if done < len(prologue) else plan.draw(done)
        c.index = done
        if c.target.member:
            tally.call(c)
        done += 1
        if done == o.baseline:
            tally.rss_base, tally.mem_base = rss_bytes(trim=True), memory_breakdown()
        now = time.monotonic()
        if WORLD.rank == 0 and now - last_progress >= o.progress:
            last_progress = now
            say(tally.progress(o, done, now - start))
    return done, time.monotonic() - start


def main(argv=None) -> int:
    o = options(argv)
    steady = steady_heap()
    with_torch = torch is not None and not o.no_torch
    rank, p = WORLD.rank, WORLD.size
    targets = make_targets(with_torch)
    plan = Plan(o.seed, targets, o.max_bytes, with_torch)
    prologue = plan.prologue()
    if rank == 0:
        say(
            f"soak: {o.collectives} collectives on {p} ranks, seed {o.seed}, sizes up to {o.max_bytes} B, "
            f"targets {', '.join(t.name for t in targets)}; prologue of {len(prologue)} calls at full size; "
            f"MPICH netmod {os.environ.get('MPIR_CVAR_CH4_NETMOD', 'default (ucx for the PyPI wheel)')}"
            + ("" if steady else "; glibc's mmap threshold could not be fixed: RSS may drift")
        )
    rss_base = rss_bytes(trim=True) if o.baseline == 0 else None
    tally = Tally(o.show, rss_base=rss_base, mem_base=memory_breakdown())
    done, elapsed = run_calls(o, plan, prologue, tally)
    rss_end, mem_end = rss_bytes(trim=True), memory_breakdown()
    for t in targets:
        t.free()
    if with_torch:
        import torch.distributed as dist

        dist.destroy_process_group()
    mine = {"wrong": tally.wrong, "counts": tally.counts, "rss_base": tally.rss_base, "rss_end": rss_end,
            "grew": tally.grew, "mem_base": tally.mem_base, "mem_end": mem_end}  # fmt: skip
    everyone = WORLD.gather(mine, root=0)
    failed = report(o, everyone, done, elapsed) if rank == 0 else False
    return int(WORLD.bcast(failed, root=0))


def memory_change(r: dict) -> str:
    """The change of each of memory_breakdown()'s figures over the same calls."""
    parts = [f"{k} {(r['mem_end'][k] - r['mem_base'][k]) / 2**20:+.2f}" for k in r["mem_end"] if k in r["mem_base"]]
    return "; " + ", ".join(parts) + " MiB"


def report(o: argparse.Namespace, everyone: list, done: int, elapsed: float) -> bool:
    """Prints the summary (rank 0); True when the run failed."""
    wrong = sum(r["wrong"] for r in everyone)
    say(
        f"soak: {done} collectives in {elapsed:.1f} s on {len(everyone)} ranks (seed {o.seed}): "
        f"{wrong} wrong results"
    )
    for line in summary_lines([r["counts"] for r in everyone]):
        say("  " + line)
    growth = []
    for rank, r in enumerate(everyone):
        if r["rss_base"] is None:
            say(
                f"  rank {rank}: rss {r['rss_end'] / 2**20:.2f} MiB; fewer calls than --baseline {o.baseline}"
            )
            continue
        growth.append((r["rss_end"] - r["rss_base"]) / 2**20)
        top = sorted(r["grew"].items(), key=lambda kv: -kv[1])[:4]
        during = ", ".join(f"{label} {b / 2**20:+.2f}" for label, b in top if b >= 1 << 16)
        say(
            f"  rank {rank}: rss {r['rss_base'] / 2**20:.2f} MiB after {o.baseline} calls, "
            f"{r['rss_end'] / 2**20:.2f} MiB at the end ({growth[-1]:+.2f} MiB"
            + (f"; most during {during}" if during else "")
            + ")"
            + memory_change(r)
        )
    worst = max(growth) if growth else 0.0
    failed = wrong > 0 or worst > o.rss_limit
    verdict = "FAIL" if failed else "PASS"
    say(f"soak: {verdict} (wrong {wrong}; largest RSS growth {worst:+.2f} MiB, limit {o.rss_limit})")
    return failed


if __name__ == "__main__":
    sys.exit(main())
