"""The reduction kernels (zcoll._C.reduce_kernel / divide_kernel) against numpy, single process.

Every kernel table (scalar, avx2, avx512: those this CPU lacks are skipped with a reason, see
kernel_tables.py) and the dispatcher, every dtype and op, sizes around every vector width. The
scalar table must equal the numpy reference bit for bit (NaN payloads aside for + and *, where
IEEE leaves the payload to the hardware); every other table must equal the scalar one bit for
bit, NaN payloads included. Inputs mix random bit patterns (NaN, inf, subnormals), values of
similar magnitude (so sums round), and the cross product of edge values. The output is
surrounded by guard elements that must stay untouched, and buffers start misaligned for some
sizes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from kernel_tables import IMPLS, ISAS, require
from numerics import (
    DTYPE_CODES,
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    OP_CODES,
    bf16_from_f32,
    bits,
    describe_mismatch,
    divide,
    equal_bits,
    from_values,
    isnan,
    ops_for,
    random_bits,
    reduce_pair,
    storage_dtype,
    values,
)
from zcoll import _C

SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 1009, 1 << 20]
GUARD = 64  # elements on each side of the output (one 64-byte vector even for int8)
SENTINEL = 0xA5


def edge_values(dtype: str) -> np.ndarray:
    """Values where implementations tend to differ, as storage."""
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        return np.array([0, 1, -1, 2, info.min, info.max, info.min + 1, info.max - 1], dtype=np.int64).astype(
            dtype
        )
    if dtype == "bfloat16":
        # 1 + 2^-8 and 1 + 3 * 2^-8 sums land on ties; 0x0001/0x8001 are subnormal; 0x7f7f is max.
        raw = [
            0x0000,
            0x8000,
            0x3F80,
            0xBF80,
            0x3F81,
            0x3F83,
            0x0001,
            0x8001,
            0x007F,
            0x7F7F,
            0xFF7F,
            0x7F80,
            0xFF80,
            0x7FC0,
            0xFFC1,
            0x7F81,
        ]
        return np.array(raw, dtype=np.uint16)
    info = np.finfo(dtype)
    tiny_sub = info.smallest_subnormal
    v = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        1.0 + info.eps,
        1.5,
        info.eps / 2,
        tiny_sub,
        -tiny_sub,
        info.tiny,
        info.tiny - tiny_sub,
        info.max,
        -info.max,
        np.inf,
        -np.inf,
        np.nan,
    ]
    out = np.array(v, dtype=dtype)
    # NaNs with other payloads and signs: min/max must pick the right one.
    u = bits(out, dtype).copy()
    nan = u[-1]
    u = np.append(u, [nan | 1, nan | (1 << (u.itemsize * 8 - 1))]).astype(u.dtype)
    return u.view(storage_dtype(dtype))


def operands(dtype: str, n: int, seed: int) -> tuple:
    """(a, b) storage arrays of n elements: the edge cross product first, then random bits and
    values of similar magnitude alternating in blocks."""
    rng = np.random.default_rng(seed)
    a, b = random_bits(rng, n, dtype), random_bits(rng, n, dtype)
    if dtype in FLOAT_DTYPES and n > 1:
        # every other block of 8: normal values within a factor ~16 of each other, both signs
        close = rng.standard_normal(2 * n) * np.exp2(rng.integers(-3, 4, 2 * n))
        mask = (np.arange(n) // 8) % 2 == 1
        a[mask] = from_values(close[:n], dtype)[mask]
        b[mask] = from_values(close[n:], dtype)[mask]
    edges = edge_values(dtype)
    ea, eb = np.repeat(edges, edges.size), np.tile(edges, edges.size)
    k = min(n, ea.size)
    a[:k], b[:k] = ea[:k], eb[:k]
    return a, b


def buffer(n: int, dtype: str, offset: int) -> np.ndarray:
    """A storage array of n + 2 * GUARD elements filled with the sentinel, starting `offset`
    elements past a 64-byte boundary."""
    es = storage_dtype(dtype).itemsize
    raw = np.full((n + 2 * GUARD + offset) * es + 64, SENTINEL, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset * es
    return raw[start : start + (n + 2 * GUARD) * es].view(storage_dtype(dtype))


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


def run_reduce(a: np.ndarray, b: np.ndarray, dtype: str, op: str, impl: str, offset: int) -> np.ndarray:
    """Runs the kernel on misaligned copies of a and b into a guarded output; returns the output."""
    n = a.size
    ba, bb, out = buffer(n, dtype, offset), buffer(n, dtype, offset), buffer(n, dtype, offset)
    ba[GUARD : GUARD + n], bb[GUARD : GUARD + n] = a, b
    _C.reduce_kernel(
        addr(out[GUARD:]), addr(ba[GUARD:]), addr(bb[GUARD:]), n, DTYPE_CODES[dtype], OP_CODES[op], impl
    )
    guards = np.concatenate([out[:GUARD], out[GUARD + n :]]).view(np.uint8)
    assert (guards == SENTINEL).all(), f"{impl} {dtype} {op} n={n}: wrote outside the output"
    assert (ba[GUARD : GUARD + n].view(np.uint8) == a.view(np.uint8)).all(), f"{impl}: modified input a"
    return out[GUARD : GUARD + n].copy()


def assert_same(got, expected, dtype, what, nan_payload=True, any_nan_where=None):
    """Bitwise equality; with nan_payload=False any NaN matches any NaN, and where
    `any_nan_where` is true any NaN matches any NaN too."""
    ok = equal_bits(got, expected, dtype, nan_payload)
    if any_nan_where is not None:
        ok |= any_nan_where & isnan(got, dtype) & isnan(expected, dtype)
    assert ok.all(), f"{what}: " + describe_mismatch(got, expected, dtype, ok)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,op", [(d, o) for d in DTYPES for o in ops_for(d)])
def test_reduce_kernel(dtype, op, impl):
    """The scalar table against numpy; every other table against the scalar one."""
    require(impl)
    minmax = op in ("min", "max")
    for size in SIZES:
        a, b = operands(dtype, size, seed=size * 31 + DTYPE_CODES[dtype] * 7 + OP_CODES[op])
        offset = size % 3
        scalar = run_reduce(a, b, dtype, op, "scalar", offset)
        if impl == "scalar":
            expected = reduce_pair(a, b, dtype, op)
            # + and * leave the payload of a NaN result to the hardware: any NaN matches numpy's.
            assert_same(scalar, expected, dtype, f"scalar {dtype} {op} n={size} vs numpy", nan_payload=minmax)
            continue
        # Between tables: bitwise, NaN payloads included, except where a and b are both NaN in
        # + and *: which payload wins then depends on the operand order the compiler emitted
        # (x86 returns the first source's NaN), which C++ does not pin down.
        both_nan = None if minmax else isnan(a, dtype) & isnan(b, dtype)
        got = run_reduce(a, b, dtype, op, impl, offset)
        assert_same(got, scalar, dtype, f"{impl} {dtype} {op} n={size} vs scalar", any_nan_where=both_nan)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_kernel_in_place(impl, dtype):
    """out may alias a or b exactly."""
    require(impl)
    for size in (17, 1009):
        a, b = operands(dtype, size, seed=size)
        expected = reduce_pair(a, b, dtype, "sum")
        x, y = a.copy(), b.copy()
        _C.reduce_kernel(addr(x), addr(x), addr(y), size, DTYPE_CODES[dtype], OP_CODES["sum"], impl)
        assert_same(x, expected, dtype, f"{impl} {dtype} out=a", nan_payload=False)
        x, y = a.copy(), b.copy()
        _C.reduce_kernel(addr(y), addr(x), addr(y), size, DTYPE_CODES[dtype], OP_CODES["sum"], impl)
        assert_same(y, expected, dtype, f"{impl} {dtype} out=b", nan_payload=False)


@pytest.mark.parametrize("impl", IMPLS)
def test_min_max_nan_rule(impl):
    """Spelled out on a few values: a NaN in a wins, else a NaN in b, else the smaller/larger."""
    require(impl)
    nan_a = np.array([np.nan, 1.0, np.nan, 2.0, -0.0, 0.0], dtype=np.float32)
    b = np.array([1.0, np.nan, -np.nan, 3.0, 0.0, -0.0], dtype=np.float32)
    nan_a_bits = bits(nan_a, "float32").copy()
    nan_a_bits[0] |= 1  # a's NaN has a payload b's NaN lacks
    a = nan_a_bits.view(np.float32)
    for op, numbers in (("min", [2.0, 0.0, -0.0]), ("max", [3.0, 0.0, -0.0])):
        out = np.empty_like(a)
        _C.reduce_kernel(addr(out), addr(a), addr(b), a.size, DTYPE_CODES["float32"], OP_CODES[op], impl)
        ob = bits(out, "float32")
        assert ob[0] == bits(a, "float32")[0], f"{impl} {op}: NaN in a must win"
        assert ob[1] == bits(b, "float32")[1], f"{impl} {op}: NaN in b must win over a number"
        assert ob[2] == bits(a, "float32")[2], f"{impl} {op}: a's NaN wins over b's"
        assert list(bits(out[3:], "float32")) == list(bits(np.array(numbers, np.float32), "float32")), impl


@pytest.mark.parametrize("impl", IMPLS)
def test_integer_wrap(impl):
    require(impl)
    a = np.array([127, -128, 100, -1], dtype=np.int8)
    b = np.array([1, -1, 100, -1], dtype=np.int8)
    for op, expected in (("sum", [-128, 127, -56, -2]), ("prod", [127, -128, 16, 1])):
        out = np.empty_like(a)
        _C.reduce_kernel(addr(out), addr(a), addr(b), 4, DTYPE_CODES["int8"], OP_CODES[op], impl)
        assert out.tolist() == expected, (impl, op)


def test_bf16_helper_matches_torch():
    """The numpy bfloat16 rounding used as the reference agrees with torch's conversion."""
    rng = np.random.default_rng(7)
    f = random_bits(rng, 1 << 16, "float32")
    f = f[~np.isnan(f)]  # torch and we may quiet NaNs differently; NaNs are checked below
    ties = (np.arange(1 << 16, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exact halfway cases
    f = np.concatenate([f, ties[~np.isnan(ties)]])
    ours = bf16_from_f32(f)
    theirs = torch.from_numpy(f).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert (ours == theirs).all()
    nan = bf16_from_f32(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(values(nan, "bfloat16")).all()


def run_divide(a: np.ndarray, dtype: str, divisor: int, impl: str) -> np.ndarray:
    """Divides a misaligned, guarded copy of a in place; returns the result."""
    n = a.size
    buf = buffer(n, dtype, n % 3)
    buf[GUARD : GUARD + n] = a
    _C.divide_kernel(addr(buf[GUARD:]), n, DTYPE_CODES[dtype], divisor, impl)
    guards = np.concatenate([buf[:GUARD], buf[GUARD + n :]]).view(np.uint8)
    assert (guards == SENTINEL).all(), f"{impl} divide wrote outside the buffer"
    return buf[GUARD : GUARD + n].copy()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("divisor", [2, 3, 4, 7])
def test_divide_kernel(dtype, divisor, impl):
    """The scalar table against numpy; every other table against the scalar one, bit for bit."""
    require(impl)
    for size in SIZES:
        a, _ = operands(dtype, size, seed=size + divisor)
        scalar = run_divide(a, dtype, divisor, "scalar")
        if impl == "scalar":
            expected = divide(a, dtype, divisor)
            assert_same(scalar, expected, dtype, f"scalar divide {dtype} /{divisor} n={size}", False)
        else:
            got = run_divide(a, dtype, divisor, impl)
            assert_same(got, scalar, dtype, f"{impl} divide {dtype} /{divisor} n={size} vs scalar")


@pytest.mark.parametrize("impl", IMPLS)
def test_divide_by_one_is_identity(impl):
    require(impl)
    a, _ = operands("float32", 1009, seed=1)
    x = a.copy()
    _C.divide_kernel(addr(x), x.size, DTYPE_CODES["float32"], 1, impl)
    assert (bits(x, "float32") == bits(a, "float32")).all()


def test_kernel_impls_follow_the_cpu():
    """kernel_impls() lists the reference and every ISA up to the detected one, in order."""
    level = _C.detected_simd_level()
    assert _C.kernel_impls() == ISAS[: ISAS.index(level) + 1]
    assert _C.simd_level() in _C.kernel_impls()


def test_unsupported_impl_raises():
    missing = [i for i in ISAS if i not in _C.kernel_impls()]
    if not missing:
        pytest.skip(f"this CPU runs every kernel table up to {_C.detected_simd_level()}: none to refuse")
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=f"'{missing[0]}' is not supported by this CPU"):
        _C.reduce_kernel(addr(x), addr(x), addr(x), 4, 0, 0, missing[0])
    with pytest.raises(ValueError, match="not supported by this CPU"):
        _C.divide_kernel(addr(x), 4, 0, 2, missing[0])


def test_bad_kernel_arguments():
    x = np.zeros(4, np.float32)
    for name in ("sse9", "", "AVX2", "auto"):
        with pytest.raises(ValueError, match="unknown kernel implementation"):
            _C.reduce_kernel(addr(x), addr(x), addr(x), 4, 0, 0, name)
        with pytest.raises(ValueError, match="unknown kernel implementation"):
            _C.divide_kernel(addr(x), 4, 0, 2, name)
    with pytest.raises(ValueError, match="dtype"):
        _C.reduce_kernel(addr(x), addr(x), addr(x), 4, len(_C.DType.__members__), 0, "scalar")
    with pytest.raises(ValueError, match="op"):
        _C.reduce_kernel(addr(x), addr(x), addr(x), 4, 0, len(_C.ReduceOp.__members__), "scalar")
    with pytest.raises(ValueError, match="avg"):
        _C.reduce_kernel(addr(x), addr(x), addr(x), 4, DTYPE_CODES["int32"], OP_CODES["avg"], "scalar")


@pytest.mark.parametrize("level", ISAS)
def test_simd_env_override(level):
    """ZCOLL_SIMD selects the dispatched level (never above what the CPU has)."""
    require(level)
    code = "from zcoll import _C; print(_C.simd_level(), _C.detected_simd_level())"
    env = {**os.environ, "ZCOLL_SIMD": level}
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [level, _C.detected_simd_level()]
