"""The reduction kernels on bool, complex32/64/128 and the bitwise ops (band, bor, bxor on
integers and bool), single process, every kernel table (kernel_tables.py; tables this CPU lacks
are skipped with a reason) and the dispatcher.

References are numpy's own operations: np.bitwise_and / or / xor on integers (any bit patterns),
np.logical_or / and / xor on bool (sum and max: or; prod and min: and; bytes stay 0 or 1),
complex sums as numpy's complex sums (complex32, which numpy lacks, as float16 pairs: each part
rounded once, numpy's float16 addition), avg's division of each part by p in its real type. The
scalar table must equal numpy bit for bit (NaN payloads aside, as for float sums), every other
table the scalar one bit for bit; outputs sit between guard bytes, inputs start misaligned.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_tables import IMPLS, require
from zcoll import _C

SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 1009, 1 << 16]
GUARD = 64
SENTINEL = 0xA5
CODES = {name: int(v) for name, v in _C.DType.__members__.items()}
OPS = {name: int(v) for name, v in _C.ReduceOp.__members__.items()}
INTEGERS = ["int8", "uint8", "int32", "int64"]
BOOL_OPS = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or, "prod": np.logical_and,
            "min": np.logical_and, "band": np.logical_and, "bxor": np.logical_xor}  # fmt: skip
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
# storage of each complex type: numpy's own, or (complex32) float16 pairs
STORAGE = {"complex32": np.dtype((np.float16, 2)), "complex64": np.dtype(np.complex64),
           "complex128": np.dtype(np.complex128)}  # fmt: skip


def operands(dtype: str, n: int, seed: int):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool), rng.integers(0, 2, n).astype(bool)
    if dtype in INTEGERS:
        info = np.iinfo(dtype)
        return tuple(rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True) for _ in range(2))
    real = np.float16 if dtype == "complex32" else STORAGE[dtype].type(0).real.dtype
    parts = [rng.standard_normal((n, 2)).astype(real) for _ in range(2)]
    if n > 8:  # non-finite parts and subnormals too
        parts[0][3, 0], parts[0][5, 1], parts[1][7, 0] = np.inf, np.nan, np.finfo(real).smallest_subnormal
    if dtype == "complex32":
        return parts[0], parts[1]
    return tuple(np.ascontiguousarray(p).view(dtype).reshape(n) for p in parts)


def guarded(n: int, itemsize: int, offset: int) -> np.ndarray:
    """n * itemsize bytes between guards, starting offset bytes past a 64-byte boundary."""
    raw = np.full(n * itemsize + 2 * GUARD + 128, SENTINEL, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + GUARD + offset
    return raw[start - GUARD : start + n * itemsize + GUARD]


def run(what: str, a, b, dtype: str, op: str, impl: str, offset: int = 0) -> np.ndarray:
    """reduce (what="reduce") or divide-by-3 (b unused) on misaligned guarded copies."""
    n, itemsize = len(a), a.itemsize * (a.shape[1] if a.ndim == 2 else 1)
    bufs = [guarded(n, itemsize, offset) for _ in range(3)]
    bufs[0][GUARD : GUARD + n * itemsize] = a.view(np.uint8).reshape(-1)
    bufs[1][GUARD : GUARD + n * itemsize] = b.view(np.uint8).reshape(-1)
    ptr = [buf[GUARD:].ctypes.data for buf in bufs]
    if what == "reduce":
        _C.reduce_kernel(ptr[2], ptr[0], ptr[1], n, CODES[dtype], OPS[op], impl)
        out = bufs[2]
    else:
        _C.divide_kernel(ptr[0], n, CODES[dtype], 3, impl)
        out = bufs[0]
    assert (out[:GUARD] == SENTINEL).all() and (out[GUARD + n * itemsize :] == SENTINEL).all(), (
        f"{impl} {what} {dtype} {op} n={n}: wrote outside its output"
    )
    return out[GUARD : GUARD + n * itemsize].copy()


def reference(a, b, dtype: str, op: str) -> np.ndarray:
    if dtype == "bool":
        return BOOL_OPS[op](a, b)
    if op in BITWISE:
        return BITWISE[op](a, b)
    return a + b  # complex sum (avg reduces with sum); float16 pairs: numpy's float16 addition


CASES = [(d, o) for d in INTEGERS for o in BITWISE] + [("bool", o) for o in BOOL_OPS]
CASES += [(d, o) for d in STORAGE for o in ("sum", "avg")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_kernel(dtype, op, impl):
    """The scalar table against numpy (bit for bit; a NaN's payload in a complex sum aside);
    every other table against the scalar one, NaN payloads included."""
    require(impl)
    for n in SIZES:
        a, b = operands(dtype, n, seed=n * 7 + CODES[dtype] * 131 + OPS[op])
        scalar = run("reduce", a, b, dtype, op, "scalar", n % 5)
        if impl != "scalar":
            got = run("reduce", a, b, dtype, op, impl, n % 5)
            assert np.array_equal(got, scalar), f"{impl} {dtype} {op} n={n}: differs from the scalar table"
            continue
        want = np.ascontiguousarray(reference(a, b, dtype, op)).view(np.uint8).reshape(-1)
        same = scalar == want
        if dtype in STORAGE:  # a NaN sum's payload is the hardware's: any NaN matches
            real = np.float16 if dtype == "complex32" else np.dtype(dtype).type(0).real.dtype
            nan = np.isnan(scalar.view(real)) & np.isnan(want.view(real))
            same |= np.repeat(nan, np.dtype(real).itemsize)
        assert same.all(), f"scalar {dtype} {op} n={n}: {np.flatnonzero(~same)[:8]} differ from numpy"
        if dtype == "bool":
            assert set(np.unique(scalar)) <= {0, 1}, f"bool {op}: bytes other than 0 and 1"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", list(STORAGE))
def test_divide_kernel_complex(dtype, impl):
    """avg's division: each part divided by p in its real type (float16 in float32, rounded once)."""
    require(impl)
    for n in SIZES:
        a, _ = operands(dtype, n, seed=n)
        got = run("divide", a, a, dtype, "avg", impl, n % 3)
        real = np.float16 if dtype == "complex32" else np.dtype(dtype).type(0).real.dtype
        parts = a.view(real).reshape(-1)
        wide = np.float64 if real == np.float64 else np.float32
        want = (parts.astype(wide) / wide(3)).astype(real)
        same = (got.view(real) == want) | (np.isnan(got.view(real)) & np.isnan(want))
        assert same.all(), f"{impl} divide {dtype} n={n}: {np.flatnonzero(~same)[:8]} differ"


MEANINGLESS = [(d, o) for d in ("float32", "float64", "float16", "bfloat16") for o in BITWISE]
MEANINGLESS += [(d, o) for d in STORAGE for o in ("prod", "min", "max", *BITWISE)]
MEANINGLESS += [(d, "avg") for d in (*INTEGERS, "bool")]


@pytest.mark.parametrize("dtype,op", MEANINGLESS)
def test_meaningless_ops_refused(dtype, op):
    """reduce_kernel refuses them, naming dtype and op, before touching memory."""
    a = np.zeros(16, np.uint8)
    with pytest.raises(ValueError) as info:
        _C.reduce_kernel(a.ctypes.data, a.ctypes.data, a.ctypes.data, 1, CODES[dtype], OPS[op], "scalar")
    assert dtype in str(info.value) and f"'{op}'" in str(info.value), info.value
