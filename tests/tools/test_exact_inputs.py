"""zcoll.tools.exact_inputs, the soak's inputs and checker (bench/soak.py): inputs whose
reductions are exact in any order, in the dtype's own arithmetic, and the check that finds a wrong
element and allows an average its one rounding."""

import numpy as np
import pytest
import torch
from zcoll.tools.exact_inputs import exact_values, mismatch, reduce_exact

PATTERN = (251, 17, 5, 3, 2)  # (m, a, b, c, scale exponent): as the soak draws them


def test_checker_finds_wrong_elements():
    want = np.arange(10, dtype=np.float64)
    assert mismatch(want.copy(), want, "float32") is None
    got = want.copy()
    got[7] += 1
    assert "1 of 10 elements wrong; at 7" in mismatch(got, want, "float32")
    assert "shape" in mismatch(want[:9], want, "float32")
    ints = np.arange(10, dtype=np.int64)
    assert mismatch(ints, ints + (ints == 3), "int8") is not None


def test_checker_allows_one_rounding_for_avg():
    want = np.full(4, 1 / 3)
    one_ulp = np.float32(1 / 3).astype(np.float64)  # avg rounds once to float32
    assert mismatch(np.full(4, one_ulp), want, "float32", one_rounding=True) is None
    assert mismatch(np.full(4, one_ulp * (1 + 2**-20)), want, "float32", one_rounding=True) is not None


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
    xs = [exact_values(PATTERN, 3000, dtype, op, r, p) for r in range(p)]
    forward, backward = reduce_in(dtype, xs, op), reduce_in(dtype, xs[::-1], op)
    assert np.array_equal(forward, backward)
    assert np.array_equal(forward, reduce_exact(xs, dtype, op))
