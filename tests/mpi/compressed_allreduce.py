"""Compressed allreduce under mpirun (any world size):
`PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/compressed_allreduce.py [case ...]`.

Cases:
  identical  every compressor x dtype x size x op x segment size: results bitwise identical on
             every rank and within the documented error bound of the exact sum; top-k equals a
             numpy reference (per-segment top-k of every rank, added in rank order) bit for bit
  feedback   error feedback over steps: sum of results + sum of residuals == sum of inputs; the
             mean result converges where compression without feedback stays biased
  nonfinite  NaN / Inf on one rank: FloatingPointError naming the key on every rank, and the
             communicator and the compressor work afterwards; check mode catches ranks passing
             different compressors
Results are reported through tests/harness.py.
"""

from harness import WORLD, Checks, run_cases

# isort: split
import numpy as np
import torch
import zcoll
from zcoll.compression.error_bounds import error_bound

comm = zcoll.Communicator()
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


def check(ck: Checks, name, dtype, n, op, seg, in_place, depth=0):
    what = f"{name} {dtype} n={n} {op} seg={seg} depth={depth}{' in place' if in_place else ''}"
    c = COMPRESSORS[name]()
    xs = inputs(n, dtype)
    exact = np.sum(xs, axis=0) / (p if op == "avg" else 1) if n else np.zeros(0)
    x = as_dtype(xs[rank], dtype)
    comm.segment_bytes, comm.pipeline_depth = seg, depth
    y = comm.allreduce(x, op=op, compression=c, out=x if in_place else None)
    comm.segment_bytes, comm.pipeline_depth = 0, 0
    ck.check((y is x) == in_place, what, f"returned its input: {y is x}")
    ck.same_on_all_ranks(what, raw_bytes(y))
    err = np.abs(as_f64(y) - exact)
    allowed = error_bound(c, xs, exact, op) + np.abs(exact) * U[dtype]
    bad = np.flatnonzero(~(err <= allowed))
    outside = "" if bad.size == 0 else f"first {bad[0]}: err {err[bad[0]]} > {allowed[bad[0]]}"
    ck.check(bad.size == 0, what, f"{bad.size} elements outside the bound, {outside}")
    s = c.last_stats
    ck.check(s.nonfinite == 0 and s.count == n and (s.wire_bytes > 0) == (p > 1 and n > 0), what, f"{s}")


def blockwise_topk_sum(ck: Checks, c, xs):
    """numpy reference of a top-k allreduce without error feedback (op sum, float32): every
    rank's per-segment top-k (ties to the lower index), added in rank order in float32."""
    n = xs[0].size
    y = np.zeros(n, np.float32)
    for x in xs:
        x32 = x.astype(np.float32)
        for lo, hi, k in c.segments(n):
            want_k = max(1, min(hi - lo, int(c.ratio * (hi - lo) + 0.5)))
            ck.check(k == want_k, f"top-k segments of n={n}", f"[{lo}, {hi}) keeps {k}, expected {want_k}")
            i = lo + np.argsort(-np.abs(x32[lo:hi]), kind="stable")[:k]
            y[i] += x32[i]
    return y


def check_topk_reference(ck: Checks, n, ratio, seg):
    """The result equals the numpy reference bit for bit, whatever the pipeline segment size."""
    what = f"top-k n={n} ratio={ratio} seg={seg}"
    c = zcoll.TopK(ratio, error_feedback=False)
    xs = inputs(n, "float32", salt=1)
    comm.segment_bytes = seg
    y = comm.allreduce(xs[rank].astype(np.float32), compression=c)
    comm.segment_bytes = 0
    want = blockwise_topk_sum(ck, c, xs)
    pairs = p * sum(k for _, _, k in c.segments(n))
    ck.check(c.last_stats.pairs == pairs, what, f"{c.last_stats.pairs} pairs, expected {pairs}")
    if c.last_stats.dense_fallback:  # a ring adds in another order: float rounding only
        ck.check(2 * c.last_stats.pairs > n, what, f"dense fallback with {c.last_stats.pairs} pairs")
        slack = p * 2.0**-23 * np.sum([np.abs(x) for x in xs], axis=0)
        ck.check(np.all(np.abs(y.astype(np.float64) - want) <= slack), what, "dense: beyond float rounding")
    else:
        ck.check(2 * c.last_stats.pairs <= n, what, f"sparse with {c.last_stats.pairs} pairs")
        ck.check(y.tobytes() == want.tobytes(), what, "not the reference")


def case_identical(ck: Checks):
    for n, ratio in ((1000, 0.01), (65537, 0.01), ((1 << 18) + 3, 0.001), (40000, 0.2)):
        for seg in (0, 4096):
            check_topk_reference(ck, n, ratio, seg)
    for name in COMPRESSORS:
        dtypes = (
            ["float32", "float16", "bfloat16"] if name in ("int8", "fp16", "bf16", "topk") else ["float32"]
        )
        for dtype in dtypes:
            for n in SIZES:
                for op in ("sum", "avg"):
                    check(ck, name, dtype, n, op, 0, in_place=n == 1000)
                if n >= 1000:  # several segments per chunk: one block of 256 per segment
                    check(ck, name, dtype, n, "sum", 1024, in_place=False)
                if n >= 1000 and dtype == "float32":  # the send stream 0 and 1 messages ahead (default 3)
                    check(ck, name, dtype, n, "avg", 1024, in_place=True, depth=1)
                    check(ck, name, dtype, n, "sum", 1024, in_place=False, depth=2)


def sampled_squares(a, sample=1000):
    """norm_sample's sum, written out: 16 runs of sample // 16, run j at j * (n // 16)."""
    length, stride = sample // 16, a.size // 16
    runs = [a[j * stride : j * stride + length] for j in range(16)]
    return float(sum(np.sum(r.astype(np.float64) ** 2) for r in runs))


def case_feedback(ck: Checks):
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
        WORLD.Allreduce(g.astype(np.float64), total)
        drift = {}
        for ef in (True, False):
            c = make(ef)
            c.norm_sample = 1000  # the guard's sampled norms: this rank's input and residual
            acc = np.zeros(n)
            for _ in range(steps):
                acc += comm.allreduce(g, op="sum", compression=c, key="w" if ef else None)
            drift[ef] = np.abs(acc / steps - total).mean()
            want = sampled_squares(g), sampled_squares(c.residual("w")) if ef else 0.0
            got = c.last_stats.input_squares, c.last_stats.residual_squares
            ck.check(np.allclose(got, want, rtol=1e-9, atol=0), f"{c} norm_sample", f"{got} vs {want}")
            if not ef:
                continue
            e = c.residual("w").astype(np.float64)
            if c.measure_error:
                ck.check(c.last_stats.error_max_abs == np.abs(e).max(), f"{c}", f"{c.last_stats}")
                l2 = np.linalg.norm(e)
                ck.check(np.isclose(c.last_stats.error_l2, l2, rtol=1e-6), f"{c}", f"{c.last_stats} vs {l2}")
            e_sum = np.zeros(n)
            WORLD.Allreduce(e, e_sum)
            # EF invariant: what every rank put in == what came out + what is still owed
            gap = np.abs(acc + e_sum - steps * total).max()
            tol = 1e-5 * steps * p * np.abs(g).max() * 4
            ck.check(gap <= tol, f"{c}", f"sum(results) + sum(residuals) - sum(inputs) = {gap} > {tol}")
        # Feedback re-sends what was lost, so the mean result converges; without it, it stays biased.
        ck.check(
            drift[True] < 0.5 * drift[False],
            f"{make(True)}",
            f"drift with EF {drift[True]}, without {drift[False]}",
        )
    # avg on a 2-byte tensor with a residual: the residual is float32 and the invariant holds / p
    c = zcoll.GradientQuantizer(8)
    t = torch.from_numpy(g).to(torch.bfloat16)
    out = comm.allreduce(t, op="avg", compression=c, key="bf")
    ck.check(
        out.dtype == torch.bfloat16 and c.residual("bf").dtype == np.float32,
        "int8 avg of a bfloat16 tensor",
        f"result {out.dtype}, residual {c.residual('bf').dtype}",
    )


def case_nonfinite(ck: Checks):
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
            what = f"{name}: {value} on rank {bad_rank}"
            c = make()
            key = f"layer.{name}"
            x = np.random.default_rng([rank, 5]).standard_normal(n).astype(np.float32)
            if rank == bad_rank:
                x[n // 3] = value
            try:
                comm.allreduce(x, op="avg", compression=c, key=key)
            except FloatingPointError as e:
                ck.check(key in str(e), what, f"the message does not name the key: {e}")
                if c.error_feedback:
                    ck.check(not c.residual(key).any(), what, "the residual of a failed key is not reset")
            else:
                ck.fail(what, "no FloatingPointError")
            ck.check(c.last_stats.nonfinite > 0, what, f"{c.last_stats}")
            # Nobody hangs, and the next call on the same communicator and key works.
            x[n // 3] = 0.0
            y = comm.allreduce(x, op="sum", compression=c, key=key)
            ck.check(np.isfinite(y).all(), f"{what}, then a finite call", "non-finite result")
            ck.same_on_all_ranks(f"{what}, then a finite call", y.tobytes())
    # Check mode: ranks passing different compressors raise MismatchError instead of hanging.
    checked = zcoll.Communicator(check=True)
    q = zcoll.GradientQuantizer(8 if rank == 0 else 4, error_feedback=False)
    try:
        checked.allreduce(np.ones(n, np.float32), compression=q)
        ck.check(p == 1, "int8 on rank 0, int4 elsewhere, check mode", "no MismatchError")
    except zcoll.MismatchError as e:
        ck.check("the bits of this collective: rank 0 passed 8, rank 1 passed 4" in str(e), "check mode", str(e))
    checked.free()


if __name__ == "__main__":
    run_cases(globals(), teardown=comm.free)
