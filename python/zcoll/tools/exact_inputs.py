"""Inputs whose reductions are exact in any order, and the check of a collective's result on them.

1. ``exact_values(pattern, count, dtype, op, rank, size)``: rank `rank`'s input (float64 or int64
   numbers): small integers, scaled by a power of two for floats, so that every partial sum and
   product of `size` ranks' inputs is exact (floats) or wraps alike (integers) in any order.
   ``pattern`` = (m, a, b, c, e): element i of rank r is ((i mod m) * a + r * b + c) mod m,
   centred and scaled by 2^-e for floats; products use powers of two.
2. ``reduce_exact(xs, dtype, op)``: op over the ranks' inputs, integers in their dtype (wrapping
   as the kernels do), floats in float64 (exact for these inputs).
3. ``mismatch(got, want, dtype, one_rounding)``: None when a result equals the reference bit for
   bit (or, for an average, within one rounding to the dtype), else what differs and where.

bench/soak.py draws its calls' inputs and checks their results with these.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from ..compression.error_bounds import MANTISSA

INT_DTYPES = ["int8", "uint8", "int32", "int64"]
_OPS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def exact_values(pattern: Sequence[int], count: int, dtype: str, op: str, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s input of `count` elements, as float64 (floats) or int64 (integers)."""
    m, a, b, cc, e = pattern
    i = np.arange(count, dtype=np.int64) % m
    v = (i * a + rank * b + cc) % m  # 0..m-1
    if dtype in INT_DTYPES:
        if dtype == "int64":
            return v * (1 << 33) - (m << 32) + rank  # beyond 32 bits; products wrap, which is fine
        return v - m // 2 if dtype != "uint8" else v
    if op == "prod":  # powers of two: exact products in any order (|product| <= 4^size)
        return np.array([1.0, 2.0, -1.0, 0.5, -2.0])[v % 5]
    # |v| <= L with size * L exact in the mantissa: every partial sum is exact
    limit = min(m // 2, (1 << (MANTISSA[dtype] - 1)) // size)
    return ((v % (2 * limit + 1)) - limit).astype(np.float64) * 2.0**-e


def reduce_exact(xs: List[np.ndarray], dtype: str, op: str) -> np.ndarray:
    """op over the ranks' inputs: integers in their dtype (wrapping as the kernels do), floats in
    float64 (exact for these inputs, so equal to any order in the dtype); as numbers."""
    fn = _OPS[op]
    if dtype in INT_DTYPES:
        acc = xs[0].astype(dtype)
        for x in xs[1:]:
            acc = fn(acc, x.astype(dtype), dtype=dtype)  # wraps like the C kernels
        return acc.astype(np.int64)
    acc = xs[0]
    for x in xs[1:]:
        acc = fn(acc, x)  # float64: exact for these inputs
    return acc / len(xs) if op == "avg" else acc


def mismatch(got: np.ndarray, want: np.ndarray, dtype: str, one_rounding: bool = False) -> Optional[str]:
    """None when got equals want (one_rounding: within one rounding to dtype, as an average is),
    else how many elements differ and the first of them."""
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if one_rounding:
        ok = np.abs(got - want) <= np.abs(want) * 2.0 ** (1 - MANTISSA[dtype])
    else:
        ok = got == want
    if ok.all():
        return None
    bad = np.flatnonzero(~ok.reshape(-1))
    i = bad[0]
    g, w = got.reshape(-1)[i], want.reshape(-1)[i]
    return f"{bad.size} of {ok.size} elements wrong; at {i}: got {g!r}, expected {w!r}"
