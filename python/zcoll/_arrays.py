"""Array adapter: numpy arrays, CPU torch tensors and anything with DLPack or the buffer
protocol, reduced to (address, element count, dtype code) without copying.

torch is never imported here: a tensor is recognised by its type's module, and read through
its own attributes (data_ptr, dtype, is_contiguous), so bfloat16 and float16 work too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

# zcoll dtype codes (csrc/common/dtype.h), by canonical name.
DTYPE_CODES = {
    "float32": 0,
    "float64": 1,
    "float16": 2,
    "bfloat16": 3,
    "int8": 4,
    "uint8": 5,
    "int32": 6,
    "int64": 7,
}
DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4, "int64": 8}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")

_NUMPY_NAMES = {np.dtype(n): n for n in ("float32", "float64", "float16", "int8", "uint8", "int32", "int64")}
_TORCH_NAMES = {
    "torch.float32": "float32",
    "torch.float64": "float64",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.int8": "int8",
    "torch.uint8": "uint8",
    "torch.int32": "int32",
    "torch.int64": "int64",
}


def _valid_dtypes() -> str:
    return ", ".join(DTYPE_CODES)


@dataclass
class View:
    """A contiguous CPU buffer: what the C++ core needs, plus how to make a like-shaped output."""

    obj: Any  # the object the caller passed (kept alive while the view is used)
    address: int
    count: int  # elements
    dtype: str  # canonical zcoll dtype name
    readonly: bool
    shape: tuple
    empty: Callable[[tuple], Any]  # allocates an uninitialised result of the same kind

    @property
    def code(self) -> int:
        return DTYPE_CODES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.count * DTYPE_SIZES[self.dtype]


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_contiguous")


def _torch_view(t: Any, name: str) -> View:
    if t.device.type != "cpu":
        raise ValueError(
            f"{name}: zcoll works on CPU tensors, got a tensor on {t.device}; move it with .cpu() "
            "(a CUDA path does not exist yet)"
        )
    dtype = _TORCH_NAMES.get(str(t.dtype))
    if dtype is None:
        raise ValueError(f"{name}: unsupported dtype {t.dtype}; valid: {_valid_dtypes()}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: tensor is not contiguous; call .contiguous() first")
    if t.is_sparse if hasattr(t, "is_sparse") else False:
        raise ValueError(f"{name}: sparse tensors are not supported")

    def empty(shape: tuple, _t=t):
        import torch

        return torch.empty(shape, dtype=_t.dtype, device="cpu")

    return View(t, t.data_ptr(), t.numel(), dtype, False, tuple(t.shape), empty)


def _numpy_view(a: np.ndarray, name: str, source: Any = None) -> View:
    dtype = _NUMPY_NAMES.get(a.dtype)
    if dtype is None:
        raise ValueError(f"{name}: unsupported dtype {a.dtype}; valid: {_valid_dtypes()}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: array is not C-contiguous; pass np.ascontiguousarray(x)")
    address = a.__array_interface__["data"][0]
    obj = a if source is None else source

    def empty(shape: tuple, _dt=a.dtype):
        return np.empty(shape, dtype=_dt)

    return View(obj, address, a.size, dtype, not a.flags.writeable, a.shape, empty)


def as_view(x: Any, name: str = "x") -> View:
    """Views x without copying; raises ValueError/TypeError naming `name` when it cannot."""
    if isinstance(x, np.ndarray):
        return _numpy_view(x, name)
    if _is_torch_tensor(x):
        return _torch_view(x, name)
    if hasattr(x, "__dlpack__"):
        try:
            a = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError) as e:
            raise ValueError(f"{name}: cannot read this object through DLPack ({e})") from e
        return _numpy_view(a, name, source=x)
    try:
        m = memoryview(x)
    except TypeError:
        raise TypeError(
            f"{name}: expected a numpy array, a CPU torch.Tensor, or an object with DLPack or the "
            f"buffer protocol; got {type(x).__name__}"
        ) from None
    # Through the memoryview: np.asarray(bytes) would make a 0-d string array, not a uint8 view.
    return _numpy_view(np.asarray(m), name, source=x)


def check_writable(v: View, name: str) -> None:
    if v.readonly:
        raise ValueError(f"{name}: buffer is read-only; pass a writable array (e.g. x.copy())")


def check_like(v: View, ref: View, count: int, name: str) -> None:
    if v.dtype != ref.dtype:
        raise ValueError(f"{name}: dtype {v.dtype} does not match the input's {ref.dtype}")
    if v.count != count:
        raise ValueError(f"{name}: has {v.count} elements, expected {count}")


def result(v: View, out: Optional[View]) -> Any:
    return (out or v).obj
