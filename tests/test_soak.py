"""The soak (bench/soak.py) in short, and its checker.

test_soak_short: 2,500 mixed collectives on 2 ranks (every collective, allreduce algorithm and
compressor; zcoll communicators on the world and a subgroup, torch process groups; inputs up to
256 KiB), every result checked, resident memory after call 1,000 and at the end within 5 MiB.
About a minute here. The long run, the issue's 100,000 collectives on 4 ranks with inputs up to
4 MiB, is the command in bench/soak.py's docstring.
"""

import numpy as np
import pytest
import torch
import zcoll
from mpi_util import ROOT, python_mpirun

import soak  # bench/, on sys.path through conftest.py

SOAK = ROOT / "bench" / "soak.py"


def test_soak_short():
    rc, out = python_mpirun(2, SOAK, "--collectives", "2500", "--max-bytes", "256K", timeout=900)
    assert rc == 0 and "soak: PASS (wrong 0;" in out, out[-6000:]
    for name in zcoll.ALGORITHMS:
        assert f" {name} " in out.split("allreduce by algorithm:")[1].splitlines()[0], f"no allreduce {name}"
    compressors = out.split("compressed by compressor:")[1].splitlines()[0]
    for name in soak.COMPRESSORS:
        assert f" {name} " in compressors + " ", f"no compressed allreduce with {name}"
    for target in ("world", "world-checked", "sub", "torch", "torch-sub"):
        assert f"  {target}: " in out, f"no calls on {target}"


def call(kind="allreduce", dtype="float32", op="sum"):
    return soak.Call(0, target=None, kind=kind, dtype=dtype, op=op)


def test_checker_finds_wrong_elements():
    want = np.arange(10, dtype=np.float64)
    assert soak.mismatch(want.copy(), want, call()) is None
    got = want.copy()
    got[7] += 1
    assert "1 of 10 elements wrong; at 7" in soak.mismatch(got, want, call())
    assert "shape" in soak.mismatch(want[:9], want, call())
    ints = np.arange(10, dtype=np.int64)
    assert soak.mismatch(ints, ints + (ints == 3), call(dtype="int8")) is not None


def test_checker_allows_one_rounding_for_avg():
    want = np.full(4, 1 / 3)
    one_ulp = np.float32(1 / 3).astype(np.float64)  # avg rounds once to float32
    assert soak.mismatch(np.full(4, one_ulp), want, call(op="avg")) is None
    assert soak.mismatch(np.full(4, one_ulp * (1 + 2**-20)), want, call(op="avg")) is not None


@pytest.mark.parametrize(
    "comp",
    [
        zcoll.GradientQuantizer(8, error_feedback=False),
        zcoll.TopK(0.1, error_feedback=False),
        zcoll.HalfPrecision("bf16"),
        zcoll.Threshold(0.5, error_feedback=False),
    ],
    ids=repr,
)
def test_checker_holds_compressed_results_to_the_bound(comp):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(1000) for _ in range(3)]
    exact = np.sum(xs, axis=0)
    assert soak.beyond_bound(exact, xs, comp, "sum", "float32") is None
    bound = soak.error_bound(comp, xs, exact, "sum")
    off = exact.copy()
    off[500] += 2 * bound[500] + 1e-3
    assert "1 of 1000 elements beyond the error bound; at 500" in soak.beyond_bound(
        off, xs, comp, "sum", "float32"
    )


def reduce_in(dtype: str, xs: list, op: str) -> np.ndarray:
    """OP over xs in list order, in the dtype's own arithmetic (bfloat16 through torch)."""
    if dtype == "bfloat16":
        fn = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}[op]
        ts = [torch.from_numpy(x).to(torch.bfloat16) for x in xs]
        acc = ts[0]
        for t in ts[1:]:
            acc = fn(acc, t)
        return acc.to(torch.float64).numpy()
    fn = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    acc = xs[0].astype(dtype)
    for x in xs[1:]:
        acc = fn(acc, x.astype(dtype), dtype=dtype)
    return acc.astype(np.float64 if acc.dtype.kind == "f" else np.int64)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int8", "uint8", "int64"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_inputs_reduce_exactly_in_any_order(p, dtype, op):
    """The soak compares bit for bit, so its inputs must give one result in every order, in the
    dtype's own arithmetic: the exact one for floats, the same wrapped one for integers."""
    c = soak.Call(5, target=type("T", (), {"size": p})(), kind="allreduce", dtype=dtype, op=op, count=3000)
    c.pattern = (251, 17, 5, 3, 2)
    xs = [soak.exact_values(c, r) for r in range(p)]
    forward, backward = reduce_in(dtype, xs, op), reduce_in(dtype, xs[::-1], op)
    assert np.array_equal(forward, backward)
    assert np.array_equal(forward, soak.reduce_exact(c, xs))


def test_checker_allows_rounding_to_a_float16_subnormal():
    """A float16 result is rounded by up to half a subnormal spacing (2^-25) below the normal
    range, whatever its relative error (the soak once flagged 1.07e-8 rounded to 0)."""
    comp = zcoll.HalfPrecision("bf16")
    xs = [np.array([1.07e-8, 3.0e-7])]
    y = np.array(xs[0], np.float16).astype(np.float64)  # 0 and the nearest multiple of 2^-24
    assert soak.beyond_bound(y, xs, comp, "sum", "float16") is None
    off = y.copy()
    off[1] += 2.0**-23  # two subnormal steps away: beyond
    assert "1 of 2 elements beyond the error bound; at 1" in soak.beyond_bound(off, xs, comp, "sum", "float16")
