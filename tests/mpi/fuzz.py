"""Fuzzing (Hypothesis) of everything a caller hands zcoll's C++ code, in one process.

    PYTHONPATH=tests mpirun -n 1 python -m mpi4py tests/mpi/fuzz.py [--examples=N] [--seed=S] [case ...]

Run under mpirun so that a crash (a segfault in C++) ends this job, not the pytest process that
launched it (tests/core/test_fuzz.py); one rank, because Hypothesis adapts its inputs to what it saw,
so two ranks would not make the same calls. Each case runs one Hypothesis property for
--examples examples (default 300; deterministic unless --seed is given) and fails with the
shrunk falsifying example.

Every example asserts: no crash; a refusal is ValueError or TypeError with a message (or
FloatingPointError, documented for non-finite data in compressed calls) and writes nothing; a call
the contract allows is accepted and gives the reference result; a call it forbids is refused.
The contract, as a model written from the documentation (docs/errors.md, the headers):

  collective_arguments  Communicator.allreduce / reduce_scatter / allgather / broadcast / reduce,
                        compressed allreduce: x and out from numpy (every dtype, byte order,
                        shape, strides, read-only), torch (dtypes, strided views, sparse), the
                        buffer protocol, DLPack, or junk; out aliasing x exactly, overlapping it,
                        of the wrong size or dtype; op / algorithm / root as names, enums (valid
                        and not), ints, None, floats. One rank: results equal the input.
  compressor_arguments  the five compressors' constructors with every kind of argument, then
                        compress / decompress of random data (NaN, Inf, denormals, huge values),
                        payloads whose bytes were overwritten, decompress into wrong outputs.
  reduce_kernels        reduce_kernel / divide_kernel: random dtype / op / table codes, lengths,
                        misalignment, in-place, bit patterns; numpy and the scalar table as oracles.
  quantize_kernels      quantize, dequantize(_add), dequantize_add_quantize, quantize_ef, cast:
                        random bits / block / rounding / seed / offset; every table equals the
                        scalar one bit for bit, the scalar one meets the documented error bound,
                        guard bytes around every output stay untouched.
  sparsify_kernels      topk, topk_ef, threshold, randomk, scatter_add: random n, k, t, capacity,
                        seeds, indices out of range; numpy references, guard elements.
"""

from __future__ import annotations

import array
import math
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable


from harness import Checks, option, run_cases

# isort: split
import numpy as np
import torch
import zcoll
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numerics import (
    DTYPES,
    FLOAT_DTYPES,
    bf16_from_f32,
    divide,
    equal_bits,
    isnan,
    reduce_pair,
    storage_dtype,
)
from zcoll import _C

EXAMPLES = int(option("examples", "300"))
SEED = option("seed")
COMM: Any = None  # the one-rank Communicator, made in __main__

# ---- the contract of a buffer argument (buffers.cc's documentation) -------------------
NUMPY_OK = {
    "<f4": "float32",
    "<f8": "float64",
    "<f2": "float16",
    "|i1": "int8",
    "|u1": "uint8",
    "<i4": "int32",
    "<i8": "int64",
    "|b1": "bool",
    "<c8": "complex64",
    "<c16": "complex128",
}  # native little-endian (this machine)
TORCH_OK = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
    torch.complex32: "complex32",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}
FLOAT_KINDS = ("float32", "float16", "bfloat16")  # what compressors take
ITEMSIZE = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
}
ALL_DTYPES = list(_C.DType.__members__)  # zcoll's dtype codes in order: numerics.DTYPES, then these
INTEGRAL_KINDS = ("int8", "uint8", "int32", "int64", "bool")
COMPLEX_REAL = {"complex32": "float16", "complex64": "float32", "complex128": "float64"}


def op_allowed(op: str, dtype: str) -> bool:
    """The contract of an op on a dtype: avg on floating and complex types, band / bor / bxor on
    integers and bool, complex types sum and avg only."""
    if op == "avg":
        return dtype not in INTEGRAL_KINDS
    if op in ("band", "bor", "bxor"):
        return dtype in INTEGRAL_KINDS
    return dtype not in COMPLEX_REAL or op == "sum"


def storage_of(dtype: str) -> np.dtype:
    """numerics.storage_dtype, and complex32 (which numpy lacks) as its 4 raw bytes."""
    return np.dtype(np.uint32) if dtype == "complex32" else storage_dtype(dtype)


def buffer_format(fmt: str, itemsize: int) -> str | None:
    """The dtype a buffer-protocol format stands for, or None (an optional '@', '=' or '<' prefix,
    one type character; integers by item size)."""
    if fmt[:1] in ("@", "=", "<"):
        fmt = fmt[1:]
    simple = {
        "f": ("float32", 4),
        "d": ("float64", 8),
        "e": ("float16", 2),
        "b": ("int8", 1),
        "B": ("uint8", 1),
    }
    simple["?"] = ("bool", 1)
    simple.update({"Ze": ("complex32", 4), "Zf": ("complex64", 8), "Zd": ("complex128", 16)})
    if fmt in simple:
        return simple[fmt][0] if simple[fmt][1] == itemsize else None
    if fmt in ("i", "l", "q", "n"):
        return {4: "int32", 8: "int64"}.get(itemsize)
    return None


class DLPackOnly:
    """An object zcoll can reach only through __dlpack__ (a numpy array behind it)."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __repr__(self) -> str:
        return f"DLPackOnly({self.a!r})"


@dataclass
class Expect:
    """What zcoll must do with one buffer argument: ok True (take it), False (refuse it), None
    (either: the contract does not say, e.g. DLPack producers' own limits)."""

    ok: bool | None
    dtype: str = ""
    count: int = 0
    ptr: int = 0
    nbytes: int = 0
    is_torch: bool = False


def expect_buffer(obj: Any, write: bool) -> Expect:
    if isinstance(obj, np.ndarray):
        d = NUMPY_OK.get(obj.dtype.str)
        ok = d is not None and obj.flags.c_contiguous and (obj.flags.writeable or not write)
        return Expect(ok, d or "", obj.size, obj.ctypes.data, obj.nbytes)
    if isinstance(obj, torch.Tensor):
        d = TORCH_OK.get(obj.dtype)
        strided = obj.layout == torch.strided
        ok = d is not None and strided and obj.is_contiguous()
        ptr = obj.data_ptr() if strided else 0
        return Expect(ok, d or "", obj.numel(), ptr, obj.numel() * obj.element_size(), True)
    if isinstance(obj, DLPackOnly):
        a = obj.a
        d = NUMPY_OK.get(a.dtype.str)
        ok = d is not None and a.flags.c_contiguous and (a.flags.writeable or not write)
        return Expect(ok, d or "", a.size, a.ctypes.data, a.nbytes)
    try:
        m = memoryview(obj)
    except TypeError:
        return Expect(False)
    d = buffer_format(m.format, m.itemsize)
    ok = d is not None and m.c_contiguous and (not m.readonly or not write)
    ptr = (
        np.frombuffer(m.cast("B") if m.c_contiguous else m.tobytes(), np.uint8).ctypes.data if m.nbytes else 0
    )
    return Expect(ok, d or "", m.nbytes // max(m.itemsize, 1), ptr, m.nbytes)


def overlap_ok(x: Expect, out: Expect, in_place_offset: int) -> bool:
    """out shares no memory with x, or starts exactly where in place puts it."""
    if x.nbytes == 0 or out.nbytes == 0 or x.ptr + x.nbytes <= out.ptr or out.ptr + out.nbytes <= x.ptr:
        return True
    return x.ptr - out.ptr == in_place_offset


def expect_name(v: Any, names: tuple, enum_type: Any) -> str | None:
    """The name an op / algorithm argument stands for, or None when it must be refused."""
    if isinstance(v, str):
        return v if v in names else None
    if isinstance(v, enum_type):
        return names[int(v)] if 0 <= int(v) < len(names) else None
    return None


def expect_root(v: Any, size: int) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return False
    try:
        i = int(np.int64(v.__index__())) if hasattr(v, "__index__") else None
    except (OverflowError, TypeError):
        return False
    return i is not None and 0 <= i < size


# ---- snapshots and comparisons -----------------------------------------------------------
def snapshot(obj: Any) -> bytes | None:
    """The bytes an argument holds (to see that a refused call wrote nothing), or None when it
    holds none that can be read (junk, sparse tensors, object arrays)."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            return None
        t = obj.detach().contiguous().view(-1)
        raw = {torch.bfloat16: torch.int16, torch.complex32: torch.int32}.get(t.dtype, t.dtype)
        return t.view(raw).numpy().tobytes()
    if isinstance(obj, DLPackOnly):
        obj = obj.a
    if isinstance(obj, np.ndarray):
        return None if obj.dtype.hasobject else np.ascontiguousarray(obj).tobytes()
    try:
        return memoryview(obj).tobytes()
    except TypeError:
        return None


def storage(obj: Any, dtype: str) -> np.ndarray:
    """A buffer's elements as a flat numpy array of zcoll's storage type (bfloat16 as uint16)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous().view(-1)
        if t.dtype == torch.complex32:
            return t.view(torch.int32).numpy().view(np.uint32).copy()
        return (
            t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        ).copy()
    if isinstance(obj, DLPackOnly):
        obj = obj.a
    raw = np.frombuffer(memoryview(obj).tobytes(), np.uint8) if not isinstance(obj, np.ndarray) else obj
    return np.ascontiguousarray(raw).reshape(-1).view(np.uint8).view(storage_of(dtype)).copy()


def same_numbers(got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    """Bitwise, except that any NaN matches any NaN (dividing by one may quiet one); bool and
    complex bitwise (one rank copies them)."""
    if dtype not in DTYPES:
        return got.shape == want.shape and got.tobytes() == want.tobytes()
    return got.shape == want.shape and bool(equal_bits(got, want, dtype, nan_payload=False).all())


# ---- strategies: arguments of every kind ----------------------------------------------------
def usually(draw, good: st.SearchStrategy, bad: st.SearchStrategy, percent_bad: int = 15) -> Any:
    """A value from `good`, or from `bad` percent_bad times in a hundred: with several
    arguments each valid at random, few calls would otherwise get past the first check."""
    return draw(bad) if draw(st.integers(0, 99)) < percent_bad else draw(good)


def with_specials(draw, values: np.ndarray) -> np.ndarray:
    """values with, now and then, a few elements replaced by NaN, Inf, huge or denormal ones."""
    if values.size and draw(st.integers(0, 3)) == 0:
        special = st.sampled_from(
            [0.0, -0.0, 1e-40, -1e-45, 3e38, -3.4e38, 7e4, np.inf, -np.inf, np.nan, 1e-8]
        )
        for _ in range(draw(st.integers(1, 3))):
            values[draw(st.integers(0, values.size - 1))] = draw(special)
    return values


NUMPY_DTYPES = list(NUMPY_OK) + ["<i2", "<u2", "<u4", "<u8", ">c8", ">f4", ">i8", ">f2", "<M8[s]"]
TORCH_DTYPES = list(TORCH_OK) + [torch.int16]


def junk() -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.integers(-3, 3),
        st.floats(allow_nan=True),
        st.text(max_size=5),
        st.binary(max_size=8),  # bytes: a read-only uint8 buffer, valid where only reading
        st.lists(st.floats(-2, 2), max_size=4),
        st.just(object()),
        st.just(np.array([1, None], dtype=object)),
        st.just(np.array(["ab", "c"])),
        st.sampled_from([np.float32(1.5), np.int64(3)]),  # numpy scalars (0-d, read-only buffers)
    )


@st.composite
def numpy_base(draw, dtype: str | None = None, max_len: int = 40) -> np.ndarray:
    dtype = dtype or usually(draw, st.sampled_from(list(NUMPY_OK)), st.sampled_from(NUMPY_DTYPES), 30)
    n = draw(st.integers(0, max_len))
    return draw(hnp.arrays(np.dtype(dtype), n))


@st.composite
def view_of(draw, base: np.ndarray) -> np.ndarray:
    """A view of a 1-D base: a slice (maybe strided), reshaped, transposed, or read-only."""
    n = base.size
    a = draw(st.integers(0, n))
    b = draw(st.integers(a, n))
    step = usually(draw, st.just(1), st.sampled_from([2, 3, -1]), 25)
    v = base[a:b:step] if step > 0 else base[b - 1 : a - 1 if a else None : -1] if b > a else base[a:a]
    shape = draw(st.sampled_from(["flat", "2d", "0d", "T"]))
    if shape == "2d" and v.size % 2 == 0 and v.size and v.flags.c_contiguous:
        v = v.reshape(2, -1)
    elif shape == "0d" and v.size == 1:
        v = v.reshape(())
    elif shape == "T" and v.size % 2 == 0 and v.size and v.flags.c_contiguous:
        v = v.reshape(2, -1).T
    if draw(st.integers(0, 9)) == 0:
        v = v.view()
        v.flags.writeable = False
    return v


@st.composite
def torch_tensor(draw) -> torch.Tensor:
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    n = draw(st.integers(0, 30))
    vals = draw(hnp.arrays(np.float64, n, elements=st.floats(-300, 300, allow_nan=False)))
    t = torch.from_numpy(vals).to(dtype) if dtype != torch.bool else torch.from_numpy(vals > 0)
    form = draw(st.sampled_from(["plain", "plain", "strided", "2d", "T", "sparse", "grad"]))
    if form == "strided" and n:
        t = t[::2]
    elif form == "2d" and n % 2 == 0 and n:
        t = t.view(2, -1)
    elif form == "T" and n % 2 == 0 and n:
        t = t.view(2, -1).t()
    elif form == "sparse" and n and dtype != torch.bfloat16:
        t = t.to_sparse()
    elif form == "grad" and dtype in (torch.float32, torch.float64):
        t = t.clone().requires_grad_(True)
    return t


@st.composite
def same_memory_as(draw, base: np.ndarray) -> Any:
    """The memory of a numpy array as another kind of object: a memoryview, a DLPack-only
    producer, a torch tensor (writable arrays of torch's dtypes), or the array itself."""
    kinds = ["numpy", "dlpack", "memoryview"]
    if base.dtype.str in NUMPY_OK and base.flags.writeable and all(s >= 0 for s in base.strides):
        kinds.append("torch")  # (torch has no negative strides)
    kind = draw(st.sampled_from(kinds))
    if kind == "dlpack":
        return DLPackOnly(base)
    if kind == "memoryview":
        try:
            return memoryview(base)
        except (ValueError, TypeError):  # dtypes the buffer protocol cannot show (datetime)
            return base
    return torch.from_numpy(base) if kind == "torch" else base


@st.composite
def argument(draw, dtype: str | None = None) -> Any:
    """x: an array-like of any kind, or junk."""
    kind = draw(st.sampled_from(["numpy"] * 5 + ["torch"] * 2 + ["other"] * 2 + ["junk"]))
    if kind == "numpy":
        return draw(view_of(draw(numpy_base(dtype))))
    if kind == "torch":
        return draw(torch_tensor())
    if kind == "other":
        base = draw(view_of(draw(numpy_base(dtype))))
        which = draw(st.sampled_from(["bytearray", "array", "same memory"]))
        if which == "bytearray":
            return bytearray(draw(st.binary(max_size=32)))
        if which == "array":
            code = draw(st.sampled_from("fdbBilqhHIQ"))
            return array.array(code, [0] * draw(st.integers(0, 9)))
        return draw(same_memory_as(base))
    return draw(junk())


def out_for(draw, x: Any, count: int) -> Any:
    """out: None, x itself, an exact alias, a view overlapping x, a fresh right or wrong buffer, junk."""
    kind = draw(
        st.sampled_from(["none"] * 3 + ["same", "alias", "overlap"] + ["fresh"] * 3 + ["wrong", "junk"])
    )
    if kind == "none":
        return None
    if kind == "same":
        return x
    inner = x.a if isinstance(x, DLPackOnly) else x
    if isinstance(inner, np.ndarray) and inner.dtype != object:
        base = inner.base if isinstance(inner.base, np.ndarray) else inner
        if kind == "alias":
            return (
                inner.view()
                if draw(st.booleans())
                else inner.reshape(-1)
                if inner.flags.c_contiguous
                else inner.view()
            )
        if kind == "overlap" and base.ndim == 1 and base.size:
            a = draw(st.integers(0, base.size - 1))
            return base[a : a + draw(st.sampled_from([count, max(count, 1), base.size]))]
    if isinstance(inner, torch.Tensor) and inner.layout == torch.strided and kind in ("alias", "overlap"):
        flat = inner.view(-1) if inner.is_contiguous() else inner
        return flat if kind == "alias" else flat[draw(st.integers(0, max(flat.numel() - 1, 0))) :]
    if kind in ("fresh", "alias", "overlap"):
        e = expect_buffer(x, False)
        dtype = e.dtype or "float32"
        if isinstance(inner, torch.Tensor) or dtype == "bfloat16":
            return torch.zeros(count, dtype={v: k for k, v in TORCH_OK.items()}[dtype])
        return np.zeros(count, dtype)
    if kind == "wrong":
        return draw(st.one_of(numpy_base(max_len=12), torch_tensor()))
    return draw(junk())


OP_VALUES = st.one_of(
    st.sampled_from(zcoll.OPS),
    st.sampled_from(list(_C.ReduceOp.__members__.values())),
    st.integers(-2, 7).map(_C.ReduceOp),  # pybind11 builds any code: C++ must check it
    st.sampled_from(["SUM", "mean", "", "sum ", "band"]),
    junk(),
)
ALGORITHM_VALUES = st.one_of(
    st.sampled_from(zcoll.ALGORITHMS),
    st.sampled_from(list(_C.Algorithm.__members__.values())),
    st.integers(-2, 9).map(_C.Algorithm),
    st.sampled_from(["Ring", "nccl", "", "auto "]),
    junk(),
)
ROOT_VALUES = st.one_of(
    st.integers(-2, 2),
    st.integers(),
    st.booleans(),
    st.sampled_from([np.int64(0), np.int32(0), np.uint8(0), np.int64(1), np.float64(0.0)]),
    junk(),
)
COMPRESSORS = [
    lambda: zcoll.GradientQuantizer(8, error_feedback=False),
    lambda: zcoll.GradientQuantizer(4, block=64, stochastic=True, error_feedback=False),
    lambda: zcoll.GradientQuantizer(1),
    lambda: zcoll.HalfPrecision("fp16"),
    lambda: zcoll.HalfPrecision("bf16", error_feedback=True),
    lambda: zcoll.TopK(0.1, error_feedback=False),
    lambda: zcoll.TopK(0.5, exact=True),
    lambda: zcoll.RandomK(0.3, seed=2),
    lambda: zcoll.Threshold(0.5, error_feedback=False),
]


# ---- one call and what it must do ------------------------------------------------------------
OUTCOMES: Counter = Counter()  # per case: what the examples did (printed, to see the spread)


def expect_call(
    method: str, x: Any, out: Any, op: Any, algorithm: Any, root: Any, comp: Any, key: Any
) -> bool | None:
    """True: the contract allows the call; False: it forbids it; None: it does not say."""
    verdicts = []
    ex = expect_buffer(x, write=out is x or method == "broadcast")
    verdicts.append(ex.ok)
    if ex.ok is False:
        return False
    if method == "broadcast":
        return None if ex.ok is None else expect_root(root, COMM.size)
    if method == "reduce" and not expect_root(root, COMM.size):
        return False
    if method in ("allreduce", "reduce_scatter", "reduce", "compressed"):
        name = expect_name(op, zcoll.OPS, _C.ReduceOp)
        if name is None or (ex.ok and not op_allowed(name, ex.dtype)):
            return False
        if method == "compressed" and name not in ("sum", "avg"):
            return False
    if method in ("allreduce", "compressed"):
        name = expect_name(algorithm, zcoll.ALGORITHMS, _C.Algorithm)
        # compressed: auto, or hierarchical with a ring codec (a quantizer or half precision)
        ring_codec = isinstance(comp, (zcoll.GradientQuantizer, zcoll.HalfPrecision))
        if name is None or (method == "compressed" and name != "auto" and not (name == "hierarchical" and ring_codec)):
            return False
    if method == "compressed":
        if comp.error_feedback and key is None or key is not None and not isinstance(key, str):
            return False
        if ex.ok and ex.dtype not in FLOAT_KINDS:
            return False
    if out is not None and out is not x:
        eo = expect_buffer(out, write=True)
        if eo.ok is False:
            return False
        verdicts.append(eo.ok)
        if ex.ok and eo.ok:
            want = ex.count
            if eo.dtype != ex.dtype or eo.count != want or not overlap_ok(ex, eo, 0):
                return False
    elif out is x and method in ("reduce_scatter", "allgather") and COMM.size != 1:
        return False
    if out is None and ex.dtype == "bfloat16" and not ex.is_torch:
        return False  # numpy cannot hold the result
    return None if None in verdicts else True


def call(method: str, x: Any, out: Any, op: Any, algorithm: Any, root: Any, comp: Any, key: Any) -> Any:
    if method == "allreduce":
        return COMM.allreduce(x, op=op, algorithm=algorithm, out=out)
    if method == "reduce_scatter":
        return COMM.reduce_scatter(x, op=op, out=out)
    if method == "allgather":
        return COMM.allgather(x, out=out)
    if method == "broadcast":
        return COMM.broadcast(x, root=root)
    if method == "reduce":
        return COMM.reduce(x, root=root, op=op, out=out)
    return COMM.allreduce(x, op=op, algorithm=algorithm, out=out, compression=comp, key=key)


def finite_scale(v: np.ndarray) -> float:
    with np.errstate(all="ignore"):
        return float(np.max(np.abs(v.astype(np.float64)))) if v.size else 0.0


def check_refusal(e: BaseException, method: str, x_before: Any, x: Any, out_before: Any, out: Any) -> None:
    assert str(e).strip(), f"{type(e).__name__} without a message"
    assert snapshot(x) == x_before, f"refused ({e}) but x was written"
    if out is not None and out is not x:
        assert snapshot(out) == out_before, f"refused ({e}) but out was written"


def check_result(
    method: str, x: Any, out: Any, y: Any, x_before: bytes, comp: Any, e_before: Any, key: Any
) -> None:
    ex = expect_buffer(x, False)
    want = (
        np.frombuffer(x_before, np.uint8).view(storage_of(ex.dtype))
        if ex.count
        else np.zeros(0, storage_of(ex.dtype))
    )
    if out is not None:
        assert y is out, "did not return out"
    if method == "broadcast":
        assert y is x and snapshot(x) == x_before, "one-rank broadcast changed x"
        return
    in_place = out is x or out is not None and not overlap_ok(ex, expect_buffer(out, True), -1)
    if not in_place:
        assert snapshot(x) == x_before, "input changed"
    got = storage(y, ex.dtype)
    if method == "compressed":
        check_compressed(comp, want, got, ex.dtype, e_before, key)
        return
    assert same_numbers(got, want, ex.dtype), f"one-rank {method} changed values: {got[:8]} vs {want[:8]}"
    if out is None:  # a new array of x's kind: torch for tensors, numpy for everything else
        xshape = (
            tuple((x.a if isinstance(x, DLPackOnly) else x).shape)
            if hasattr(x, "shape") or isinstance(x, DLPackOnly)
            else tuple(memoryview(x).shape)
        )
        want_shape = {"allgather": (1, *xshape), "reduce_scatter": (ex.count,)}.get(method, xshape)
        assert tuple(y.shape) == want_shape, f"result shape {tuple(y.shape)}, expected {want_shape}"
        assert isinstance(y, torch.Tensor) == isinstance(x, torch.Tensor), f"result is a {type(y).__name__}"


def as_f64(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def check_compressed(comp: Any, x: np.ndarray, y: np.ndarray, dtype: str, e_before: Any, key: Any) -> None:
    """One rank: y = D(C(x + e)) within the documented bound; with a key, D + e_after == x + e."""
    x64, y64 = as_f64(x, dtype), as_f64(y, dtype)
    eff = x64 + (e_before.reshape(-1).astype(np.float64) if e_before is not None else 0.0)
    bound = (
        compressed_bound(comp, eff)
        + np.abs(eff) * {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    )
    if dtype == "float16":
        bound += 2.0**-24  # one float16 denormal step
    err = np.abs(y64 - eff)
    bad = np.flatnonzero(~(err <= bound))
    i = bad[0] if bad.size else 0
    assert not bad.size, f"{comp!r}: {bad.size} beyond the bound; at {i}: |{y64[i]} - {eff[i]}| > {bound[i]}"


def compressed_bound(comp: Any, x: np.ndarray) -> np.ndarray:
    """docs/algorithms.md's bounds for one rank (p = 1)."""
    n = x.size
    if isinstance(comp, zcoll.GradientQuantizer):
        nb = -(-n // comp.block)
        pad = np.zeros(nb * comp.block)
        pad[:n] = np.abs(x)
        A = np.repeat(pad.reshape(nb, comp.block).max(axis=1), comp.block)[:n] if n else np.zeros(0)
        q = 127 if comp.bits == 8 else 7
        k = 1.0 if comp.bits == 1 else (1.0 if comp.stochastic else 0.5) / q
        return A * k + np.abs(x) * 2.0**-20 + 2.0**-149 * 128
    if isinstance(comp, zcoll.HalfPrecision):
        u = 2.0**-11 if comp.fmt == "fp16" else 2.0**-8
        return np.abs(x) * u + np.abs(x) * 2.0**-20 + 2.0**-24
    if isinstance(comp, zcoll.TopK):
        A = np.zeros(n)
        for lo, hi, k in comp.segments(n):
            A[lo:hi] = np.sort(np.abs(x[lo:hi]))[::-1][k - 1]
        return A + np.abs(x) * 2.0**-23
    if isinstance(comp, zcoll.Threshold):  # (a tiny negative value is -0.0 in float32)
        return max(comp.value, 0.0) + np.abs(x) * 2.0**-23
    return np.abs(x) * (1 + 2.0**-23)  # RandomK: what was not picked is lost


def nonfinite_allowed(comp: Any, x: Any) -> bool:
    """FloatingPointError is the documented answer to NaN / Inf data (or float16 overflow)."""
    e = expect_buffer(x, False)
    if not e.ok or not e.count:
        return False
    v = as_f64(storage(x, e.dtype), e.dtype)
    limit = 65504.0 if isinstance(comp, zcoll.HalfPrecision) and comp.fmt == "fp16" else 1e38
    with np.errstate(all="ignore"):
        return bool(not np.isfinite(v).all() or np.abs(v).max() > limit / 2)


@st.composite
def collective_call(draw):
    methods = ["allreduce", "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "compressed"]
    method = draw(st.sampled_from(methods))
    comp = draw(st.sampled_from(COMPRESSORS))() if method == "compressed" else None
    x = draw(compress_input()) if method == "compressed" else draw(argument())
    count = expect_buffer(x, False).count
    out = out_for(draw, x, count) if method != "broadcast" else None
    good_ops = ["sum", "avg"] if method == "compressed" else list(zcoll.OPS)
    op = usually(draw, st.sampled_from(good_ops), OP_VALUES)
    algorithm = usually(
        draw,
        st.just("auto") if method == "compressed" else st.sampled_from(zcoll.ALGORITHMS),
        ALGORITHM_VALUES,
    )
    root = usually(draw, st.just(0), ROOT_VALUES)
    key = (
        usually(draw, st.sampled_from(["w", "b"]), st.one_of(st.none(), st.integers(0, 2))) if comp else None
    )
    return method, x, out, op, algorithm, root, comp, key


# ---- running a property as a case ------------------------------------------------------------
def fuzz(
    ck: Checks, name: str, strategy: st.SearchStrategy, body: Callable[[Any], None], examples: int
) -> None:
    """Runs body on `examples` drawn values; a failure is reported with the shrunk example."""
    ran = [0]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=SEED is None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
        print_blob=False,
    )
    @given(strategy)
    def prop(value):
        ran[0] += 1
        body(value)

    if SEED is not None:
        prop = hypothesis_seed(int(SEED))(prop)
    try:
        prop()
    except Exception as e:  # noqa: BLE001 - Hypothesis re-raises the shrunk failure: report it
        text = "".join(traceback.format_exception(e))[-6000:]
        ck.fail(name, f"after {ran[0]} examples: {text}")
        OUTCOMES.clear()
        return
    ck.check(ran[0] >= examples // 2, name, f"only {ran[0]} examples ran (asked for {examples})")
    spread = ", ".join(f"{k} {v}" for k, v in sorted(OUTCOMES.items()))
    print(f"fuzz {name}: {ran[0]} examples ({spread})", flush=True)
    OUTCOMES.clear()


def run_collective(args) -> None:
    method, x, out, op, algorithm, root, comp, key = args
    expected = expect_call(method, x, out, op, algorithm, root, comp, key)
    x_before, out_before = snapshot(x), snapshot(out) if out is not None else None
    e_before = comp.residual(key) if comp is not None and isinstance(key, str) else None
    e_before = None if e_before is None else e_before.copy()
    try:
        y = call(method, x, out, op, algorithm, root, comp, key)
    except (ValueError, TypeError) as e:
        assert expected is not True, f"refused a call the contract allows: {type(e).__name__}: {e}"
        check_refusal(e, method, x_before, x, out_before, out)
        OUTCOMES[f"{method} refused"] += 1
        return
    except FloatingPointError as e:
        assert method == "compressed" and nonfinite_allowed(comp, x), (
            f"FloatingPointError on finite data: {e}"
        )
        OUTCOMES[f"{method} non-finite"] += 1
        return
    assert expected is not False, f"accepted a call the contract forbids; returned {type(y).__name__}"
    OUTCOMES[f"{method} accepted"] += 1
    if method == "compressed" and nonfinite_allowed(comp, x):
        return  # non-finite data the compressor passed through: nothing to compare
    check_result(method, x, out, y, x_before, comp, e_before, key)


def case_collective_arguments(ck: Checks) -> None:
    fuzz(ck, "collective arguments", collective_call(), run_collective, EXAMPLES)


# ---- compressors: constructors, compress / decompress, tampered payloads -------------------------
def number_values() -> st.SearchStrategy:
    return st.one_of(
        st.integers(-5, 300),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(0, 1),
        st.booleans(),
        st.sampled_from([np.int64(8), np.float32(0.25), np.uint8(4)]),
        junk(),
    )


@st.composite
def compressor_spec(draw):
    cls = draw(st.sampled_from(["GradientQuantizer", "TopK", "RandomK", "Threshold", "HalfPrecision"]))
    canon = draw(st.booleans())  # half the time: valid-looking values, to reach compress()
    kw: dict = {}
    if cls == "GradientQuantizer":
        kw["bits"] = draw(st.sampled_from([8, 4, 1]) if canon else number_values())
        kw["block"] = draw(st.sampled_from([256, 64, 8, 16, 2048]) if canon else number_values())
        kw["stochastic"] = draw(st.booleans() if canon else st.one_of(st.booleans(), junk()))
    elif cls in ("TopK", "RandomK"):
        kw["ratio"] = draw(st.floats(0.01, 1.0) if canon else number_values())
        if cls == "TopK":
            kw["exact"] = draw(st.booleans() if canon else st.one_of(st.booleans(), junk()))
    elif cls == "Threshold":
        kw["value"] = draw(st.floats(0, 4) if canon else number_values())
    else:
        kw["fmt"] = draw(
            st.sampled_from(["fp16", "bf16"]) if canon else st.one_of(st.text(max_size=5), junk())
        )
    if cls != "Threshold" and cls != "HalfPrecision" and draw(st.booleans()):
        kw["seed"] = draw(st.integers(0, 2**70) if canon else number_values())
    kw["error_feedback"] = draw(st.booleans() if canon else st.one_of(st.booleans(), junk()))
    kw["measure_error"] = draw(st.booleans())
    x = draw(compress_input())
    tamper = draw(
        st.one_of(
            st.none(), st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1), st.floats(allow_nan=True))
        )
    )
    out_kind = draw(st.sampled_from(["none", "none", "right", "wrong", "junk", "payload"]))
    return cls, kw, x, tamper, out_kind, draw(st.sampled_from([None, "k"]))


@st.composite
def compress_input(draw):
    n = draw(st.integers(0, 600))
    kind = draw(st.sampled_from(["f4", "f4", "f2", "bf16", "other"]))
    if kind == "other":
        return draw(argument(draw(st.sampled_from(["<f4", "<f2", None]))))
    vals = with_specials(draw, draw(hnp.arrays(np.float64, n, elements=st.floats(-10, 10))))
    if kind == "f4":
        return vals.astype(np.float32)
    if kind == "f2":
        with np.errstate(over="ignore"):
            return vals.astype(np.float16)
    return torch.from_numpy(vals.astype(np.float32)).to(torch.bfloat16)


def constructor_expect(cls: str, kw: dict) -> bool | None:
    """True/False where the contract is plain (ints for ints, floats for floats, in range)."""

    def is_int(v):
        return type(v) is int

    def is_num(v):
        return type(v) in (int, float)

    plain = True
    for name in ("stochastic", "exact", "error_feedback"):
        if name in kw and not isinstance(kw[name], bool):
            plain = False
    if "seed" in kw:
        s = kw["seed"]
        if is_int(s) and s < 0 or isinstance(s, (str, type(None), float, list)):
            return False
        plain &= is_int(s)
    if cls == "GradientQuantizer":
        bits, block = kw["bits"], kw["block"]
        if isinstance(bits, (str, type(None), list, float)) or isinstance(
            block, (str, type(None), list, float)
        ):
            return False
        if is_int(bits) and bits not in (1, 4, 8) or is_int(block) and block <= 0:
            return False
        if is_int(bits) and is_int(block) and (bits == 4 and block % 2 or bits == 1 and block % 8):
            return False
        if is_int(bits) and bits == 1 and kw["stochastic"] is True:
            return False
        plain &= is_int(bits) and is_int(block)
    elif cls in ("TopK", "RandomK"):
        r = kw["ratio"]
        if isinstance(r, (str, type(None), list)) or is_num(r) and not 0 < r <= 1:
            return False
        plain &= is_num(r) and not isinstance(r, bool)
    elif cls == "Threshold":
        v = kw["value"]
        if isinstance(v, (str, type(None), list)) or is_num(v) and not (-1e-38 < v < 3e38):
            return False  # (a tiny negative value is -0.0 in float32: either answer)
        plain &= is_num(v) and not isinstance(v, bool) and v >= 0
    else:
        if isinstance(kw["fmt"], str) and kw["fmt"] not in ("fp16", "bf16"):
            return False
        plain &= isinstance(kw["fmt"], str)
    return True if plain else None


def run_compressor(args) -> None:
    cls, kw, x, tamper, out_kind, key = args
    expected = constructor_expect(cls, kw)
    try:
        comp = getattr(zcoll, cls)(**kw)
    except (ValueError, TypeError) as e:
        assert expected is not True, f"{cls}(**{kw}) refused: {type(e).__name__}: {e}"
        assert str(e).strip(), "no message"
        OUTCOMES["constructor refused"] += 1
        return
    assert expected is not False, f"{cls}(**{kw}) was accepted"
    OUTCOMES["constructed"] += 1
    ex = expect_buffer(x, False)
    x_before = snapshot(x)
    try:
        payload = comp.compress(x, key=key)
    except (ValueError, TypeError) as e:
        assert not (ex.ok and ex.dtype in FLOAT_KINDS), f"compress refused a valid input: {e}"
        assert str(e).strip() and snapshot(x) == x_before, f"refused ({e}) but wrote x or gave no message"
        OUTCOMES["compress refused"] += 1
        return
    except FloatingPointError as e:
        assert nonfinite_allowed(comp, x), f"FloatingPointError on finite data: {e}"
        OUTCOMES["compress non-finite"] += 1
        return
    assert ex.ok is not False and ex.dtype in FLOAT_KINDS, f"compress took {type(x).__name__} {ex.dtype}"
    assert snapshot(x) == x_before, "compress changed its input"
    wire_bytes = len(memoryview(payload.wire))
    for name, a in payload.arrays.items():
        inside = np.frombuffer(payload.wire, np.uint8).ctypes.data
        start = a.ctypes.data - inside if a.size else 0
        assert 0 <= start and start + a.nbytes <= wire_bytes, (
            f"payload array {name} lies outside the wire bytes"
        )
    if tamper is not None and payload.arrays:
        names = list(payload.arrays)
        a = payload.arrays[names[tamper[0] % len(names)]]
        if a.size:
            a.view(np.uint8)[tamper[1] % a.nbytes] = tamper[1] & 0xFF
            if a.dtype == np.float32:
                a[tamper[1] % a.size] = tamper[2]
    out = None
    if out_kind == "right":
        out = payload.like(payload.shape)
    elif out_kind == "wrong":
        out = np.zeros(ex.count + 1, np.float32)
    elif out_kind == "junk":
        out = "out"
    elif out_kind == "payload":  # the payload's own bytes as out: must be refused, not decoded into
        out = np.frombuffer(payload.wire, np.uint8)[: ex.count * ITEMSIZE[ex.dtype]]
        out = out.view(storage_dtype(ex.dtype)) if out.nbytes % ITEMSIZE[ex.dtype] == 0 else out
    try:
        y = comp.decompress(payload, out=out)
    except (ValueError, TypeError) as e:
        ok_out = out is None or out_kind == "right"
        assert not ok_out or tamper is not None, f"decompress refused: {e}"
        assert str(e).strip(), "no message"
        OUTCOMES["decompress refused"] += 1
        return
    OUTCOMES["decompressed" + (" tampered" if tamper is not None else "")] += 1
    assert out_kind in ("none", "right") or out_kind == "payload" and ex.count == 0, (
        f"decompress accepted out={out_kind}"
    )
    if tamper is None and not nonfinite_allowed(comp, x) and key is None:
        got = storage(y, ex.dtype)
        check_compressed(comp, storage(x, ex.dtype), got, ex.dtype, None, None)


def case_compressor_arguments(ck: Checks) -> None:
    fuzz(ck, "compressor arguments", compressor_spec(), run_compressor, EXAMPLES)


# ---- kernels -----------------------------------------------------------------------------
IMPLS = ["scalar", "avx2", "avx512", "dispatch"]
BAD_IMPLS = ["neon", "", "AVX2", "auto", "scalar "]
GUARD = 64
SENTINEL = 0xA5


def impl_ok(impl: str) -> bool:
    return impl == "dispatch" or impl in _C.kernel_impls()


def guarded(nbytes: int, misalign: int = 0) -> tuple:
    """(raw guarded buffer, the usable byte view starting `misalign` bytes past a 64-byte line)."""
    raw = np.full(nbytes + 2 * GUARD + 64 + misalign, SENTINEL, np.uint8)
    start = (-raw.ctypes.data) % 64 + GUARD + misalign
    return raw, raw[start : start + nbytes]


def guards_intact(raw: np.ndarray, inner: np.ndarray) -> bool:
    lo = inner.ctypes.data - raw.ctypes.data
    hi = lo + inner.nbytes
    return bool((raw[:lo] == SENTINEL).all() and (raw[hi:] == SENTINEL).all())


class Guarded:
    """A buffer of `nbytes` with sentinel bytes on both sides, starting `misalign` bytes past a
    64-byte line; `view` is the usable part as `dtype`."""

    def __init__(self, nbytes: int, dtype: Any = np.uint8, misalign: int = 0, fill: Any = None):
        self.raw, inner = guarded(nbytes, misalign)
        self.view = inner.view(dtype)
        if fill is not None:
            self.view[:] = fill

    @property
    def address(self) -> int:
        return self.view.ctypes.data

    def intact(self) -> bool:
        return guards_intact(self.raw, self.view.view(np.uint8))


def raw_elements(rng: np.random.Generator, n: int, dtype: str, specials: bool) -> np.ndarray:
    """n storage elements: random bits (NaN, Inf, denormals) or values of similar magnitude
    (bool: 0 or 1; complex: parts of its real type)."""
    st_dtype = storage_of(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(np.bool_)
    if dtype in COMPLEX_REAL and not specials:
        return raw_elements(rng, 2 * n, COMPLEX_REAL[dtype], False).view(st_dtype)
    if specials:
        u = rng.integers(0, 256, n * st_dtype.itemsize, dtype=np.uint8)
        return u.view(st_dtype).copy()
    v = rng.standard_normal(n) * 2.0 ** rng.integers(-4, 5, n)
    if dtype == "bfloat16":
        return bf16_from_f32(v.astype(np.float32))
    if dtype in FLOAT_DTYPES:
        return v.astype(st_dtype)
    return rng.integers(-100, 100, n).astype(st_dtype)


@st.composite
def reduce_kernel_call(draw):
    return (
        draw(st.sampled_from(["reduce", "reduce", "divide"])),
        usually(draw, st.integers(0, len(ALL_DTYPES) - 1), st.integers(-2, len(ALL_DTYPES) + 2)),
        usually(draw, st.integers(0, len(zcoll.OPS) - 1), st.integers(-2, len(zcoll.OPS) + 2)),
        usually(draw, st.sampled_from(IMPLS), st.sampled_from(BAD_IMPLS)),
        draw(st.one_of(st.integers(0, 70), st.integers(0, 5000))),
        draw(st.integers(0, 7)),
        draw(st.sampled_from(["none", "a", "b"])),
        draw(st.integers(0, 2**32)),
        draw(st.booleans()),
        usually(draw, st.integers(1, 9), st.integers(-3, 2**31 + 2)),
    )


def run_reduce_kernel(args) -> None:
    what, dcode, ocode, impl, n, misalign, alias, seed, specials, divisor = args
    valid_dtype = 0 <= dcode < len(ALL_DTYPES)
    dtype = ALL_DTYPES[dcode] if valid_dtype else "int8"
    es = ITEMSIZE[dtype]
    rng = np.random.default_rng(seed)
    a, b = raw_elements(rng, n, dtype, specials), raw_elements(rng, n, dtype, specials)
    raws, views = zip(*(guarded(n * es, misalign) for _ in range(3)))
    va, vb, vo = (v.view(storage_of(dtype)) for v in views)
    va[:], vb[:] = a, b
    out = {"none": vo, "a": va, "b": vb}[alias]
    if what == "divide":
        floating = dtype in FLOAT_DTYPES or dtype in COMPLEX_REAL
        ok = valid_dtype and floating and impl_ok(impl) and 0 < divisor < 2**31
        known = ok or not valid_dtype or not impl_ok(impl) or divisor <= 0 or divisor >= 2**31
        try:
            _C.divide_kernel(va.ctypes.data, n, dcode, divisor, impl)
        except (ValueError, TypeError) as e:
            assert not ok, f"divide refused: {e}"
            assert (va.view(np.uint8) == a.view(np.uint8)).all(), "refused divide wrote"
            OUTCOMES["divide refused"] += 1
            return
        OUTCOMES["divide accepted"] += 1
        assert ok or not known, f"divide accepted dtype {dcode} impl {impl!r} divisor {divisor}"
        assert all(guards_intact(r, v) for r, v in zip(raws, views)), "divide wrote outside its buffer"
        if ok:
            lanes = COMPLEX_REAL.get(dtype, dtype)
            va, a = (v.view(storage_of(lanes)) for v in (va, a))
            want = divide(a, lanes, divisor)
            assert equal_bits(va, want, lanes, nan_payload=False).all(), (
                f"{impl} divide {dtype} /{divisor} differs from numpy"
            )
        return
    op_names = list(zcoll.OPS)
    ok = valid_dtype and 0 <= ocode < len(op_names) and impl_ok(impl) and op_allowed(op_names[ocode], dtype)
    try:
        _C.reduce_kernel(out.ctypes.data, va.ctypes.data, vb.ctypes.data, n, dcode, ocode, impl)
    except (ValueError, TypeError) as e:
        assert not ok, f"reduce refused: {e}"
        assert str(e).strip()
        assert (va.view(np.uint8) == a.view(np.uint8)).all() and (vb.view(np.uint8) == b.view(np.uint8)).all()
        OUTCOMES["reduce refused"] += 1
        return
    OUTCOMES["reduce accepted"] += 1
    assert ok, f"reduce accepted dtype {dcode} op {ocode} impl {impl!r}"
    assert all(guards_intact(r, v) for r, v in zip(raws, views)), f"{impl} reduce wrote outside its buffers"
    op = op_names[ocode]
    if dtype == "bool" or op in ("band", "bor", "bxor"):  # numpy's own; bool: logical, 0 / 1
        fns = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
        if dtype == "bool":
            logical = {"sum": np.logical_or, "max": np.logical_or, "prod": np.logical_and}
            logical["min"] = np.logical_and
            fns = {**fns, **logical}
        assert np.array_equal(out, fns[op](a, b)), f"{impl} {dtype} {op} n={n} differs from numpy"
        return
    if dtype in COMPLEX_REAL:  # sum / avg: each part as its real type adds
        dtype = COMPLEX_REAL[dtype]
        out, a, b = (v.view(storage_of(dtype)) for v in (out, a, b))
    want = reduce_pair(a, b, dtype, "sum" if op == "avg" else op)
    eq = equal_bits(out, want, dtype, nan_payload=op in ("min", "max") and impl == "scalar")
    eq |= isnan(out, dtype) & isnan(want, dtype)
    assert eq.all(), f"{impl} {dtype} {op} n={n}: {np.flatnonzero(~eq)[:5]} differ from numpy"


def case_reduce_kernels(ck: Checks) -> None:
    fuzz(ck, "reduce kernels", reduce_kernel_call(), run_reduce_kernel, EXAMPLES)


@st.composite
def quantize_call(draw):
    bits = usually(draw, st.sampled_from([8, 4, 1]), st.integers(-2, 17))
    good_block = st.sampled_from([256, 64, 8, 32]) if bits == 1 else st.sampled_from([256, 64, 8, 2, 6, 1000])
    return (
        draw(st.sampled_from(["quantize", "quantize_ef", "daq", "dequantize", "cast"])),
        usually(draw, st.sampled_from([0, 2, 3]), st.integers(-1, 9)),
        bits,
        usually(draw, good_block, st.integers(0, 3000)),
        usually(
            draw,
            st.just("nearest") if bits == 1 else st.sampled_from(["nearest", "stochastic"]),
            st.sampled_from(["stochastic", "up", ""]),
        ),
        usually(draw, st.sampled_from(IMPLS), st.sampled_from(BAD_IMPLS)),
        draw(st.one_of(st.integers(0, 80), st.integers(0, 6000))),
        draw(st.integers(0, 2**64 - 1)),
        draw(st.one_of(st.just(0), st.integers(0, 2**64 - 1))),
        draw(st.integers(0, 2**32)),
        draw(st.integers(0, 3)) == 0,  # random bit patterns (NaN, Inf, denormals) instead of values
        draw(st.integers(0, 3)),
    )


def quant_params_ok(bits: int, block: int, rounding: str) -> bool:
    return (
        bits in (1, 4, 8)
        and block > 0
        and not (bits == 4 and block % 2)
        and not (bits == 1 and block % 8)
        and rounding in ("nearest", "stochastic")
        and not (bits == 1 and rounding == "stochastic")
    )


def quantize_kernel(what: str, impl: str, p: dict, x: Guarded, e0: np.ndarray, payload: tuple) -> tuple:
    """Runs one quantizing kernel into fresh guarded outputs: (status, {name: output}, guards intact)."""
    n, bits, block, dcode = p["n"], p["bits"], p["block"], p["dcode"]
    nb = -(-n // block) if block > 0 else n + 1  # sizes for valid params; generous otherwise
    codes = Guarded((n * bits + 7) // 8 if bits in (1, 4, 8) else n, np.uint8, p["misalign"], 0xAA)
    scales = Guarded(4 * nb, np.float32, 0, -1.0)
    extra = Guarded(4 * n, np.float32, 0, e0)  # e (quantize_ef), sums (daq), y (dequantize)
    q = {"bits": bits, "block": block, "rounding": p["rounding"], "seed": p["seed"], "offset": p["offset"]}
    status = None
    if what == "quantize":
        status = _C.quantize(x.address, dcode, n, codes.address, scales.address, impl=impl, **q)
    elif what == "quantize_ef":
        status = _C.quantize_ef(
            x.address, dcode, extra.address, n, codes.address, scales.address, impl=impl, **q
        )
    elif what == "daq":
        codes_in, scales_in = payload[0].address, payload[1].address
        status = _C.dequantize_add_quantize(
            codes_in,
            scales_in,
            x.address,
            dcode,
            n,
            codes.address,
            scales.address,
            extra.address,
            impl=impl,
            **q,
        )
    else:
        extra.view[:] = 0
        _C.dequantize(
            payload[0].address, payload[1].address, n, extra.address, bits=bits, block=block, impl=impl
        )
    outputs = {"codes": codes.view, "scales": scales.view, "extra": extra.view}
    return status, outputs, all(b.intact() for b in (codes, scales, extra))


def run_quantize_kernel(args) -> None:
    what, dcode, bits, block, rounding, impl, n, seed, offset, data_seed, specials, misalign = args
    rng = np.random.default_rng(data_seed)
    if what == "cast":
        return run_cast(dcode, bits % 8, impl, n, rng, specials, misalign)
    dtype = {0: "float32", 2: "float16", 3: "bfloat16"}.get(dcode, "float32")
    p = dict(n=n, bits=bits, block=block, dcode=dcode, rounding=rounding, seed=seed, offset=offset)
    p["misalign"] = misalign
    x_values = raw_elements(rng, n, dtype, specials)
    x = Guarded(x_values.nbytes, x_values.dtype, misalign, x_values)
    e0 = raw_elements(rng, n, "float32", False).astype(np.float32) * np.float32(0.1)
    nb = -(-n // block) if block > 0 else n + 1
    # an incoming payload for daq and dequantize: random codes; positive (or random-bit) scales
    code_bytes = (n * bits + 7) // 8 if bits in (1, 4, 8) else n
    scales_in = raw_elements(rng, nb, "float32", True) if specials else np.abs(rng.standard_normal(nb))
    payload = (
        Guarded(code_bytes, np.uint8, 0, rng.integers(0, 256, code_bytes, np.uint8)),
        Guarded(4 * nb, np.float32, 0, scales_in),
    )
    if what == "dequantize":  # rounding and dtype are not its arguments
        ok = quant_params_ok(bits, block, "nearest") and impl_ok(impl)
    else:
        ok = quant_params_ok(bits, block, rounding) and dcode in (0, 2, 3) and impl_ok(impl)
    try:
        status, got, intact = quantize_kernel(what, impl, p, x, e0, payload)
    except (ValueError, TypeError) as err:
        assert not ok, f"{what} refused: {err}"
        assert str(err).strip(), "no message"
        OUTCOMES[f"{what} refused"] += 1
        return
    finally:
        assert (x.view.view(np.uint8) == x_values.view(np.uint8)).all() and x.intact(), (
            f"{what} wrote its input"
        )
    OUTCOMES[f"{what} accepted"] += 1
    where = f"{what} {impl} n={n} bits={bits} block={block} rounding={rounding}"
    assert ok, f"{where}: accepted (dtype code {dcode})"
    assert intact, f"{where}: wrote outside an output"
    ref_status, ref, _ = quantize_kernel(what, "scalar", p, x, e0, payload)
    assert status == ref_status, f"{where}: status {status}, scalar {ref_status}"
    for name, want in ref.items():  # bit for bit; only NaN payloads are unspecified (quantize.h)
        same = (
            equal_bits(got[name], want, "float32", nan_payload=False)
            if want.dtype == np.float32
            else got[name] == want
        )
        assert same.all(), f"{where}: {name} differs from the scalar table at {np.flatnonzero(~same)[:5]}"
    if what == "quantize" and not specials and rounding == "nearest" and n:  # the documented bound
        xf = (
            (x_values.astype(np.uint32) << 16).view(np.float32)
            if dtype == "bfloat16"
            else x_values.astype(np.float32)
        )
        y = np.zeros(n, np.float32)
        _C.dequantize(
            ref["codes"].ctypes.data, ref["scales"].ctypes.data, n, y.ctypes.data, bits=bits, block=block
        )
        bound = compressed_bound(
            zcoll.GradientQuantizer(bits, block, error_feedback=False), xf.astype(np.float64)
        )
        err = np.abs(y.astype(np.float64) - xf)
        assert (err <= bound).all(), f"{where}: error {err.max()} beyond the bound"


def run_cast(dcode: int, to_pick: int, impl: str, n: int, rng, specials: bool, misalign: int) -> None:
    to = [0, 2, 3, 1, 4, 0, 2, 3][to_pick]
    frm = dcode
    valid = {(0, 2), (0, 3), (2, 0), (3, 0)}
    ok = (frm, to) in valid and impl_ok(impl)
    f_dt = DTYPES[frm] if 0 <= frm < 8 else "float32"
    t_dt = DTYPES[to]
    x = raw_elements(rng, n, f_dt, specials)
    _, vx = guarded(x.nbytes, misalign)
    vx = vx.view(x.dtype)
    vx[:] = x
    by, vy = guarded(n * storage_dtype(t_dt).itemsize)
    try:
        _C.cast(vx.ctypes.data, frm, vy.ctypes.data, to, n, impl)
    except (ValueError, TypeError) as err:
        assert not ok, f"cast {frm}->{to} refused: {err}"
        OUTCOMES["cast refused"] += 1
        return
    OUTCOMES["cast accepted"] += 1
    assert ok, f"cast accepted {frm} -> {to} impl {impl!r}"
    assert guards_intact(by, vy), "cast wrote outside its output"
    y = vy.view(storage_dtype(t_dt))
    if to == 0:
        want = (x.astype(np.uint32) << 16).view(np.float32) if f_dt == "bfloat16" else x.astype(np.float32)
    elif to == 2:
        with np.errstate(all="ignore"):
            want = x.astype(np.float16)
    else:
        want = bf16_from_f32(x)
    assert equal_bits(y, want, t_dt, nan_payload=False).all(), f"cast {f_dt}->{t_dt} differs from numpy"


def case_quantize_kernels(ck: Checks) -> None:
    fuzz(ck, "quantize kernels", quantize_call(), run_quantize_kernel, EXAMPLES)


@st.composite
def sparsify_call(draw):
    n = draw(st.one_of(st.integers(0, 100), st.integers(0, 40000)))
    return (
        draw(st.sampled_from(["topk", "topk_ef", "threshold", "randomk", "scatter_add"])),
        n,
        usually(draw, st.integers(0, n), st.integers(n + 1, n + 3)),
        usually(draw, st.sampled_from(["sampled", "exact"]), st.just("approx")),
        usually(draw, st.sampled_from(IMPLS), st.sampled_from(BAD_IMPLS)),
        draw(st.integers(0, 2**64 - 1)),
        draw(st.integers(0, 2**32)),
        draw(st.sampled_from(["normal", "specials", "ties", "zeros"])),
        usually(draw, st.floats(0, 3), st.sampled_from([-1.0, np.nan, np.inf, 0.0, -0.0, -1e-30])),
    )


def sparse_data(rng, n: int, kind: str) -> np.ndarray:
    if kind == "specials":
        return raw_elements(rng, n, "float32", True)
    if kind == "ties":
        return rng.integers(-3, 4, n).astype(np.float32)
    if kind == "zeros":
        x = np.zeros(n, np.float32)
        x[rng.integers(0, max(n, 1), n // 50)] = 1.0 if n else 0
        return x
    return rng.standard_normal(n).astype(np.float32)


def np_topk(x: np.ndarray, k: int) -> np.ndarray:
    """Largest |x| bit pattern first (NaN > Inf > finite), ties by lower index; index order."""
    keys = (x.view(np.uint32) & 0x7FFFFFFF).astype(np.int64)
    return np.sort(np.lexsort((np.arange(x.size), -keys))[:k])


def run_sparsify_kernel(args) -> None:
    what, n, k, method, impl, seed, data_seed, kind, t = args
    rng = np.random.default_rng(data_seed)
    x_values = sparse_data(rng, n, kind)
    e0 = (rng.standard_normal(n) * 0.5).astype(np.float32)
    x, e = Guarded(4 * n, np.float32, 0, x_values), Guarded(4 * n, np.float32, 0, e0)
    idx, val = Guarded(4 * k, np.uint32), Guarded(4 * k, np.float32)  # k pairs (threshold: capacity k)
    method_ok = method in ("sampled", "exact")
    if what == "scatter_add":  # k pairs into x, some indices past n when the data has specials
        sidx = rng.integers(0, n + (2 if kind == "specials" else 0) + 1, k).astype(np.uint32)
        idx.view[:], val.view[:] = sidx, sparse_data(rng, k, kind)
    ok = {
        "topk": k <= n and method_ok and impl_ok(impl),
        "topk_ef": k <= n and method_ok and impl_ok(impl),
        "threshold": t >= 0 and not math.isnan(t) and impl_ok(impl),
        "randomk": k <= n,
        "scatter_add": impl_ok(impl) and (k == 0 or int(idx.view.max()) < n),
    }[what]
    a = {"x": x.address, "e": e.address, "idx": idx.address, "val": val.address}
    try:
        if what == "topk":
            _C.topk(a["x"], n, k, a["idx"], a["val"], method=method, seed=seed, impl=impl)
        elif what == "topk_ef":
            _C.topk_ef(a["x"], a["e"], n, k, a["idx"], a["val"], method=method, seed=seed, impl=impl)
        elif what == "threshold":
            count = _C.threshold(a["x"], n, t, a["idx"], a["val"], k, impl=impl)
        elif what == "randomk":
            _C.randomk(a["x"], n, k, seed, a["idx"], a["val"])
        else:
            _C.scatter_add(a["x"], n, a["idx"], a["val"], k, impl=impl)
    except (ValueError, TypeError) as err:
        assert not ok, f"{what} refused: {err}"
        assert str(err).strip(), "no message"
        unchanged = (x.view.view(np.uint32) == x_values.view(np.uint32)).all() and (e.view == e0).all()
        assert unchanged, f"refused {what} wrote its inputs"
        OUTCOMES[f"{what} refused"] += 1
        return
    OUTCOMES[f"{what} accepted"] += 1
    assert ok, f"{what} accepted n={n} k={k} method={method} impl={impl!r} t={t}"
    assert all(b.intact() for b in (x, e, idx, val)), f"{what} wrote outside a buffer (n={n}, k={k})"
    got_x, x, e, idx, val = x.view, x_values, e.view, idx.view, val.view
    if what == "topk":
        want = np_topk(x, k)
        assert np.array_equal(idx, want), f"topk {method} {impl} n={n} k={k}: indices differ from numpy"
        assert (val.view(np.uint32) == x[want].view(np.uint32)).all(), "topk values are not x[idx]"
    elif what == "topk_ef":
        r = x + e0
        want = np_topk(r, k)
        assert np.array_equal(idx, want), f"topk_ef {method} {impl} n={n} k={k}: indices differ"
        rest = r.copy()
        rest[want] = 0
        assert (e.view(np.uint32) == rest.view(np.uint32)).all(), "topk_ef residual differs"
    elif what == "threshold":
        keys = x.view(np.uint32) & 0x7FFFFFFF
        want = np.flatnonzero(keys > np.float32(t).view(np.uint32) & 0x7FFFFFFF)
        assert count == want.size, f"threshold count {count} vs {want.size}"
        shown = min(count, k)
        assert np.array_equal(idx[:shown], want[:shown]), "threshold indices differ"
    elif what == "randomk":
        assert k == 0 or (np.all(np.diff(idx.astype(np.int64)) > 0) and int(idx[-1]) < n), (
            "randomk indices not sorted, distinct, in range"
        )
        assert (val.view(np.uint32) == x[idx].view(np.uint32)).all(), "randomk values are not x[idx]"
    else:
        want = x.copy()
        np.add.at(want, idx, val)
        assert equal_bits(got_x, want, "float32", nan_payload=False).all(), (
            "scatter_add differs from np.add.at"
        )


def case_sparsify_kernels(ck: Checks) -> None:
    fuzz(ck, "sparsify kernels", sparsify_call(), run_sparsify_kernel, EXAMPLES)


if __name__ == "__main__":
    COMM = zcoll.Communicator()
    COMM.set_topology(np.full((COMM.size, COMM.size), 1e9))  # so that ordered_ring runs too
    run_cases(globals(), teardown=COMM.free)
