"""Compressed allreduce under mpirun (any world size): `python -m mpi4py compressed_allreduce.py SUITE`.

Suites:
  identical  every compressor x dtype x size x op x segment size: results bitwise identical on
             every rank and within the documented error bound of the exact sum; top-k equals a
             numpy reference (per-segment top-k of every rank, added in rank order) bit for bit
  feedback   error feedback over steps: sum of results + sum of residuals == sum of inputs; the
             mean result converges where compression without feedback stays biased
  nonfinite  NaN / Inf on one rank: FloatingPointError naming the key on every rank, and the
             communicator and the compressor work afterwards; check mode catches ranks passing
             different compressors
An assertion on one rank aborts the job (python -m mpi4py). Rank 0 prints "OK SUITE CHECKS".
"""

import sys

import numpy as np
import torch
import zcoll
from mpi4py import MPI

comm = zcoll.Communicator()
world = MPI.COMM_WORLD
rank, p = comm.rank, comm.size

SIZES = [0, 1, 7, 255, 256, 257, 1000, 4099, 65537]
COMPRESSORS = {
    "int8": lambda: zcoll.GradientQuantizer(8, error_feedback=False),
    "int4": lambda: zcoll.GradientQuantizer(4, error_feedback=False),
    "sign": lambda: zcoll.GradientQuantizer(1, error_feedback=False),
    "int8s": lambda: zcoll.GradientQuantizer(8, stochastic=True, error_feedback=False, seed=7),
    "int4:64": lambda: zcoll.GradientQuantizer(4, block=64, error_feedback=False),
    "fp16": lambda: zcoll.HalfPrecision("fp16"),
    "bf16": lambda: zcoll.HalfPrecision("bf16"),
    "topk": lambda: zcoll.TopK(0.01, error_feedback=False),
    "topk_exact_dense": lambda: zcoll.TopK(0.3, error_feedback=False, exact=True),  # p*0.3 > 0.5: dense
    "randomk": lambda: zcoll.RandomK(0.05, seed=3, error_feedback=False),
    "threshold": lambda: zcoll.Threshold(1.5, error_feedback=False),
}
U = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def inputs(n, dtype, salt=0):
    """Every rank's input (each rank computes all of them), as stored in dtype, in float64."""
    xs = []
    for r in range(p):
        rng = np.random.default_rng([r, n, salt])
        scale = np.repeat(rng.uniform(0.1, 8, size=n // 64 + 1), 64)[:n]
        xs.append(rng.standard_normal(n) * scale)
    return [stored(x.astype(np.float32), dtype) for x in xs]


def stored(x32, dtype):
    if dtype == "float32":
        return x32.astype(np.float64)
    if dtype == "float16":
        return x32.astype(np.float16).astype(np.float64)
    return torch.from_numpy(x32).to(torch.bfloat16).to(torch.float64).numpy()


def as_dtype(x64, dtype):
    if dtype == "bfloat16":
        return torch.from_numpy(x64.astype(np.float32)).to(torch.bfloat16)
    return x64.astype(dtype)


def as_f64(y):
    return y.to(torch.float64).numpy() if isinstance(y, torch.Tensor) else y.astype(np.float64)


def raw_bytes(y):
    return (y.view(torch.int16).numpy() if isinstance(y, torch.Tensor) else y).tobytes()


def bound(name, c, xs, exact, op):
    """The bound of compression.h / docs/algorithms.md, per element."""
    n = exact.size
    if n == 0:
        return exact
    M = np.sum([np.abs(x) for x in xs], axis=0)
    if isinstance(c, zcoll.GradientQuantizer):
        nb = -(-n // c.block)
        A = np.zeros(n)
        for x in xs:
            pad = np.zeros(nb * c.block)
            pad[:n] = np.abs(x)
            A += np.repeat(pad.reshape(nb, c.block).max(axis=1), c.block)[:n]
        q = 127 if c.bits == 8 else 7
        k = 1.0 if c.bits == 1 else (1.0 if c.stochastic else 0.5) / q
        b = p * A * k + p * M * 2.0**-20 + p * 2.0**-149
    elif isinstance(c, zcoll.HalfPrecision):
        u = 2.0**-11 if c.fmt == "fp16" else 2.0**-8
        b = M * ((1 + u) ** p - 1) + p * M * 2.0**-20 + (p * 2.0**-25 if c.fmt == "fp16" else 0)
    else:
        if isinstance(c, zcoll.TopK):  # per segment: sum over ranks of its k_j-th largest |x|
            A = np.zeros(n)
            for lo, hi, k in c.segments(n):
                A[lo:hi] = sum(np.sort(np.abs(x[lo:hi]))[::-1][k - 1] for x in xs)
        elif isinstance(c, zcoll.Threshold):
            A = p * c.value
        else:
            A = M
        b = A + p * M * 2.0**-23
    return b / p if op == "avg" else b


def check(name, dtype, n, op, seg, in_place, depth=0):
    c = COMPRESSORS[name]()
    xs = inputs(n, dtype)
    exact = np.sum(xs, axis=0) / (p if op == "avg" else 1) if n else np.zeros(0)
    x = as_dtype(xs[rank], dtype)
    comm.segment_bytes, comm.pipeline_depth = seg, depth
    y = comm.allreduce(x, op=op, compression=c, out=x if in_place else None)
    comm.segment_bytes, comm.pipeline_depth = 0, 0
    assert (y is x) == in_place
    everyone = world.allgather(raw_bytes(y))
    assert all(b == everyone[0] for b in everyone), f"{name} {dtype} n={n} {op}: ranks differ"
    err = np.abs(as_f64(y) - exact)
    allowed = bound(name, c, xs, exact, op) + np.abs(exact) * U[dtype]
    bad = np.flatnonzero(~(err <= allowed))
    assert bad.size == 0, (
        f"{name} {dtype} n={n} {op} seg={seg}: {bad.size} elements outside the bound, "
        f"first {bad[0]}: err {err[bad[0]]} > {allowed[bad[0]]}"
    )
    s = c.last_stats
    assert s.nonfinite == 0 and s.count == n and (s.wire_bytes > 0) == (p > 1 and n > 0), s
    return 1


def blockwise_topk_sum(c, xs):
    """numpy reference of a top-k allreduce without error feedback (op sum, float32): every
    rank's per-segment top-k (ties to the lower index), added in rank order in float32."""
    n = xs[0].size
    y = np.zeros(n, np.float32)
    for x in xs:
        x32 = x.astype(np.float32)
        for lo, hi, k in c.segments(n):
            assert k == max(1, min(hi - lo, int(c.ratio * (hi - lo) + 0.5)))
            i = lo + np.argsort(-np.abs(x32[lo:hi]), kind="stable")[:k]
            y[i] += x32[i]
    return y


def check_topk_reference(n, ratio, seg):
    """The result equals the numpy reference bit for bit, whatever the pipeline segment size."""
    c = zcoll.TopK(ratio, error_feedback=False)
    xs = inputs(n, "float32", salt=1)
    comm.segment_bytes = seg
    y = comm.allreduce(xs[rank].astype(np.float32), compression=c)
    comm.segment_bytes = 0
    want = blockwise_topk_sum(c, xs)
    assert c.last_stats.pairs == p * sum(k for _, _, k in c.segments(n))
    if c.last_stats.dense_fallback:  # a ring adds in another order: float rounding only
        assert 2 * c.last_stats.pairs > n
        slack = p * 2.0**-23 * np.sum([np.abs(x) for x in xs], axis=0)
        assert np.all(np.abs(y.astype(np.float64) - want) <= slack), f"top-k n={n} ratio={ratio} (dense)"
    else:
        assert 2 * c.last_stats.pairs <= n
        assert y.tobytes() == want.tobytes(), f"top-k n={n} ratio={ratio}: not the reference"
    return 1


def suite_identical():
    checks = 0
    for n, ratio in ((1000, 0.01), (65537, 0.01), ((1 << 18) + 3, 0.001), (40000, 0.2)):
        for seg in (0, 4096):
            checks += check_topk_reference(n, ratio, seg)
    for name in COMPRESSORS:
        dtypes = (
            ["float32", "float16", "bfloat16"] if name in ("int8", "fp16", "bf16", "topk") else ["float32"]
        )
        for dtype in dtypes:
            for n in SIZES:
                for op in ("sum", "avg"):
                    checks += check(name, dtype, n, op, 0, in_place=n == 1000)
                if n >= 1000:  # several segments per chunk: one block of 256 per segment
                    checks += check(name, dtype, n, "sum", 1024, in_place=False)
                if n >= 1000 and dtype == "float32":  # the send stream 0 and 1 messages ahead (default 3)
                    checks += check(name, dtype, n, "avg", 1024, in_place=True, depth=1)
                    checks += check(name, dtype, n, "sum", 1024, in_place=False, depth=2)
    return checks


def suite_feedback():
    checks = 0
    steps = 12
    for n, make in (
        (3000, lambda ef: zcoll.GradientQuantizer(1, error_feedback=ef, measure_error=True)),
        (3000, lambda ef: zcoll.GradientQuantizer(4, error_feedback=ef)),
        (3000, lambda ef: zcoll.TopK(0.1, error_feedback=ef, measure_error=True)),
        (70000, lambda ef: zcoll.TopK(0.1, error_feedback=ef, measure_error=True)),  # 4 segments
        (3000, lambda ef: zcoll.RandomK(0.25, error_feedback=ef)),
        (3000, lambda ef: zcoll.Threshold(2.0, error_feedback=ef)),
    ):
        rng = np.random.default_rng([rank, 99])
        g = (rng.standard_normal(n) * np.repeat(rng.uniform(0.1, 4, n // 100 + 1), 100)[:n]).astype(
            np.float32
        )
        total = np.zeros(n)
        world.Allreduce(g.astype(np.float64), total)
        drift = {}
        for ef in (True, False):
            c = make(ef)
            acc = np.zeros(n)
            for _ in range(steps):
                acc += comm.allreduce(g, op="sum", compression=c, key="w" if ef else None)
            drift[ef] = np.abs(acc / steps - total).mean()
            if not ef:
                continue
            e = c.residual("w").astype(np.float64)
            if c.measure_error:
                assert c.last_stats.error_max_abs == np.abs(e).max(), (c, c.last_stats)
                assert np.isclose(c.last_stats.error_l2, np.linalg.norm(e), rtol=1e-6), c.last_stats
            e_sum = np.zeros(n)
            world.Allreduce(e, e_sum)
            # EF invariant: what every rank put in == what came out + what is still owed
            gap = np.abs(acc + e_sum - steps * total).max()
            tol = 1e-5 * steps * p * np.abs(g).max() * 4
            assert gap <= tol, f"{c}: sum(results) + sum(residuals) differs from sum(inputs) by {gap} > {tol}"
            checks += 1
        # Feedback re-sends what was lost, so the mean result converges; without it, it stays biased.
        assert drift[True] < 0.5 * drift[False], (
            f"{make(True)}: drift with EF {drift[True]}, without {drift[False]}"
        )
        checks += 1
    # avg on a 2-byte tensor with a residual: the residual is float32 and the invariant holds / p
    c = zcoll.GradientQuantizer(8)
    t = torch.from_numpy(g).to(torch.bfloat16)
    out = comm.allreduce(t, op="avg", compression=c, key="bf")
    assert out.dtype == torch.bfloat16 and c.residual("bf").dtype == np.float32
    return checks + 1


def suite_nonfinite():
    checks = 0
    n = 40000  # two top-k segments; the bad value sits in the first
    for name, make in [
        ("int8", lambda: zcoll.GradientQuantizer(8)),
        ("int4", lambda: zcoll.GradientQuantizer(4)),
        ("sign", lambda: zcoll.GradientQuantizer(1)),
        ("fp16", lambda: zcoll.HalfPrecision("fp16")),
        ("bf16", lambda: zcoll.HalfPrecision("bf16")),
        ("topk", lambda: zcoll.TopK(0.01)),
        ("randomk", lambda: zcoll.RandomK(1.0)),
        ("threshold", lambda: zcoll.Threshold(1.0)),
        ("topk_dense", lambda: zcoll.TopK(0.6, error_feedback=False)),
    ]:
        for bad_rank, value in ((p - 1, np.nan), (0, np.inf), (0, -np.inf)):
            c = make()
            key = f"layer.{name}"
            x = np.random.default_rng([rank, 5]).standard_normal(n).astype(np.float32)
            if rank == bad_rank:
                x[n // 3] = value
            try:
                comm.allreduce(x, op="avg", compression=c, key=key)
            except FloatingPointError as e:
                assert key in str(e), str(e)
                if c.error_feedback:
                    assert not c.residual(key).any(), "the residual of a failed key is reset"
            else:
                raise AssertionError(f"{name}: {value} on rank {bad_rank} did not raise on rank {rank}")
            assert c.last_stats.nonfinite > 0
            # Nobody hangs, and the next call on the same communicator and key works.
            x[n // 3] = 0.0
            y = comm.allreduce(x, op="sum", compression=c, key=key)
            assert np.isfinite(y).all()
            everyone = world.allgather(y.tobytes())
            assert all(b == everyone[0] for b in everyone)
            checks += 1
    # Check mode: ranks passing different compressors raise MismatchError instead of hanging.
    checked = zcoll.Communicator(check=True)
    q = zcoll.GradientQuantizer(8 if rank == 0 else 4, error_feedback=False)
    try:
        checked.allreduce(np.ones(n, np.float32), compression=q)
        assert p == 1, "no MismatchError"
    except zcoll.MismatchError as e:
        assert "the bits of this collective: rank 0 passed 8, rank 1 passed 4" in str(e), str(e)
    checked.free()
    return checks + 1


if __name__ == "__main__":
    suite = sys.argv[1]
    count = {"identical": suite_identical, "feedback": suite_feedback, "nonfinite": suite_nonfinite}[suite]()
    comm.barrier()
    if rank == 0:
        print(f"OK {suite} {count}", flush=True)
