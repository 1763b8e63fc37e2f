"""numpy references shared by the kernel tests and the MPI test scripts.

Storage: every zcoll dtype is held in a numpy array of its own dtype, except bfloat16, which
numpy lacks: it is held as its raw uint16 bits. `values()` turns storage into numbers
(float32/float64 for floating types) and `bits()` into unsigned integers for bitwise comparison.
"""

from __future__ import annotations

import numpy as np

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
DTYPE_CODES = {name: code for code, name in enumerate(DTYPES)}
FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
INT_DTYPES = ["int8", "uint8", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
OP_CODES = {name: code for code, name in enumerate(OPS)}

# Unit roundoff (half an ulp of 1.0) of the floating types: the tolerances of inexact results.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def ops_for(dtype: str) -> list:
    """The ops valid for dtype (avg needs a floating type)."""
    return OPS if dtype in FLOAT_DTYPES else OPS[:4]


def storage_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def uint_dtype(dtype: str) -> np.dtype:
    return np.dtype(f"uint{storage_dtype(dtype).itemsize * 8}")


# -- bfloat16 -------------------------------------------------------------------------------
def bf16_from_f32(x) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even on the upper 16 bits; NaN stays NaN (quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet_nan = (u >> np.uint32(16)) | np.uint32(0x40)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def bf16_to_f32(bits) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# -- conversions -----------------------------------------------------------------------------
def values(a: np.ndarray, dtype: str) -> np.ndarray:
    """Storage -> numbers: bfloat16 bits become float32, everything else is returned as is."""
    return bf16_to_f32(a) if dtype == "bfloat16" else a


def from_values(v, dtype: str) -> np.ndarray:
    """Numbers -> storage, rounding to nearest even (exact for values representable in dtype).
    Integers wrap modulo 2^bits like a C cast."""
    v = np.asarray(v)
    if dtype == "bfloat16":
        return bf16_from_f32(v.astype(np.float32))
    if dtype in INT_DTYPES and v.dtype.kind == "f":
        v = v.astype(np.int64)
    return v.astype(storage_dtype(dtype))


def bits(a: np.ndarray, dtype: str) -> np.ndarray:
    return np.ascontiguousarray(a).view(uint_dtype(dtype))


def isnan(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in INT_DTYPES:
        return np.zeros(a.shape, dtype=bool)
    return np.isnan(values(a, dtype))


def smallest_subnormal(dtype: str) -> float:
    """The smallest positive subnormal of a floating type (bit pattern 1)."""
    one = np.ones(1, dtype=uint_dtype(dtype)).view(storage_dtype(dtype))
    return float(values(one, dtype)[0])


def random_bits(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """n elements with uniformly random bit patterns (NaNs, infinities, subnormals included)."""
    u = rng.integers(0, np.iinfo(uint_dtype(dtype)).max, size=n, dtype=uint_dtype(dtype), endpoint=True)
    return u.view(storage_dtype(dtype))


def quiet(a: np.ndarray, dtype: str) -> np.ndarray:
    """The half types go through float32 and back, which quiets a signalling NaN (sets the top
    mantissa bit); float32/float64 min/max return the operand untouched."""
    if dtype not in ("float16", "bfloat16"):
        return a
    quiet_bit = {"float16": 0x0200, "bfloat16": 0x0040}[dtype]
    u = bits(a, dtype)
    return np.where(isnan(a, dtype), u | np.uint16(quiet_bit), u).astype(np.uint16).view(storage_dtype(dtype))


# -- reference arithmetic ----------------------------------------------------------------------
def reduce_pair(a: np.ndarray, b: np.ndarray, dtype: str, op: str) -> np.ndarray:
    """out = a OP b with zcoll's semantics, computed independently with numpy:
    integers wrap; float16 uses numpy's float16 arithmetic (correctly rounded); bfloat16 is
    computed in float32 and rounded once (correctly rounded too); min/max return a if a is NaN,
    else b if b is NaN, else `a if a < b else b` (so min(+0, -0) is -0, min(-0, +0) is +0),
    a NaN of a half type quieted; avg reduces with sum."""
    if op in ("min", "max"):
        x, y = values(a, dtype), values(b, dtype)
        pick_a = (x < y) if op == "min" else (x > y)
        if dtype in FLOAT_DTYPES:
            pick_a |= np.isnan(x)
        return quiet(np.where(pick_a, a, b), dtype)
    fn = np.multiply if op == "prod" else np.add
    with np.errstate(all="ignore"):  # overflow to inf, inf - inf: expected here
        if dtype == "bfloat16":
            return bf16_from_f32(fn(values(a, dtype), values(b, dtype)))
        return fn(a, b, dtype=storage_dtype(dtype))


def divide(a: np.ndarray, dtype: str, divisor: int) -> np.ndarray:
    """avg's last step: float32/float64 divide in their own type; the half types divide in
    float32 and round once."""
    with np.errstate(all="ignore"):
        if dtype == "float64":
            return a / np.float64(divisor)
        if dtype == "float32":
            return a / np.float32(divisor)
        q = values(a, dtype).astype(np.float32) / np.float32(divisor)
        return from_values(q, dtype)


def reduce_all(inputs, dtype: str, op: str) -> np.ndarray:
    """OP over a list of storage arrays (in list order), then / p for avg. Only meaningful for
    inputs whose reduction is exact in every order, or as the 'one fixed order' reference."""
    acc = inputs[0]
    for x in inputs[1:]:
        acc = reduce_pair(acc, x, dtype, op)
    if op == "avg" and len(inputs) > 1:
        acc = divide(acc, dtype, len(inputs))
    return acc


def equal_bits(got: np.ndarray, expected: np.ndarray, dtype: str, nan_payload: bool = True) -> np.ndarray:
    """Elementwise bitwise equality; with nan_payload=False any NaN matches any NaN."""
    eq = bits(got, dtype) == bits(expected, dtype)
    if not nan_payload:
        eq |= isnan(got, dtype) & isnan(expected, dtype)
    return eq


def describe_mismatch(
    got: np.ndarray, expected: np.ndarray, dtype: str, ok: np.ndarray, limit: int = 3
) -> str:
    """'k of n elements differ; at i: got <bits> (<value>), expected ...' for the first few."""
    bad = np.flatnonzero(~ok)
    width = storage_dtype(dtype).itemsize * 2
    parts = []
    for i in bad[:limit]:
        g, e = got.reshape(-1)[i], expected.reshape(-1)[i]
        gv, ev = values(np.array([g]), dtype)[0], values(np.array([e]), dtype)[0]
        gb, eb = bits(np.array([g]), dtype)[0], bits(np.array([e]), dtype)[0]
        parts.append(f"at {i}: got 0x{int(gb):0{width}x} ({gv!r}), expected 0x{int(eb):0{width}x} ({ev!r})")
    return f"{bad.size} of {ok.size} elements differ; " + "; ".join(parts)
