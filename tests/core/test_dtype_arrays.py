"""bool and complex arrays across the Python/C++ boundary, in this process (one rank): numpy, torch
tensors, DLPack producers (versioned and legacy capsules) and buffer-protocol objects are taken
in place with the right dtype; results with no `out` are new arrays of the input's kind and dtype
(new_like), numpy's missing complex32 refused with a clear error; the op names and enums."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import zcoll
from zcoll import _C


@pytest.fixture(scope="module")
def comm():
    with zcoll.Communicator() as c:
        yield c


class DLPack:
    """An object reachable through __dlpack__ only; legacy=True: a producer without max_version."""

    def __init__(self, a, legacy: bool = False):
        self._a, self._legacy = a, legacy

    def __dlpack__(self, stream=None, **kwargs):
        return self._a.__dlpack__() if self._legacy else self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


NUMPY = {"bool": np.array([True, False, True]), "complex64": np.array([1 + 2j, -3.5j], np.complex64),
         "complex128": np.array([1e-300 + 2j, -3.5 - 1j])}  # fmt: skip
with warnings.catch_warnings():  # "ComplexHalf support is experimental"
    warnings.simplefilter("ignore", UserWarning)
    TORCH = {
        "bool": torch.tensor([True, False, True]),
        "complex32": torch.tensor([1 + 2j, -0.5j], dtype=torch.complex32),
        "complex64": torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64),
        "complex128": torch.tensor([1e-300 + 2j, -3.5 - 1j], dtype=torch.complex128),
    }
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")


def test_names():
    assert zcoll.OPS == ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
    assert list(_C.DType.__members__)[8:] == ["bool", "complex32", "complex64", "complex128"]
    assert [_C.dtype_size(d) for d in ("bool", "complex32", "complex64", "complex128")] == [1, 4, 8, 16]
    assert _C.dtype_size("c64") == 8 and _C.dtype_size("b1") == 1


@pytest.mark.parametrize("dtype", list(TORCH))
def test_every_kind_of_object(comm, dtype):
    """The same memory as a torch tensor, through DLPack (both capsule kinds) and, for numpy's
    dtypes, as numpy and as a memoryview: one dtype name, and one rank's allreduce is a copy."""
    t = TORCH[dtype]
    objects = [t, DLPack(t), DLPack(t, legacy=True)]
    if dtype in NUMPY:
        a = NUMPY[dtype]
        objects += [a, DLPack(a), memoryview(a)]
    for x in objects:
        name, shape, count = _C.describe(x, "x")
        assert (name, shape, count) == (dtype, (len(t),), len(t)), type(x)
        out = t.clone() if isinstance(x, torch.Tensor) or dtype not in NUMPY else np.zeros_like(NUMPY[dtype])
        got = comm.allreduce(x, op="sum", out=out)
        assert got is out
        want = t if isinstance(out, torch.Tensor) else NUMPY[dtype]
        assert bytes(memoryview(np.ascontiguousarray(_raw(got)))) == bytes(memoryview(_raw(want)))


def _raw(a):
    """The bytes of an array or tensor as a numpy uint8 array."""
    if isinstance(a, torch.Tensor):
        return (torch.view_as_real(a) if a.dtype == torch.complex32 else a).numpy().reshape(-1).view(np.uint8)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


@pytest.mark.parametrize("dtype", list(TORCH))
def test_results_of_the_inputs_kind(comm, dtype):
    """No out: a new tensor / array of x's dtype from every collective; in place lands in x."""
    for x in [TORCH[dtype].clone()] + ([NUMPY[dtype].copy()] if dtype in NUMPY else []):
        ops = ["sum", "avg"] if dtype.startswith("complex") else ["sum", "max", "band", "bxor"]
        for op in ops:
            y = comm.allreduce(x, op=op)
            assert type(y) is type(x) and y.dtype == x.dtype and y.shape == x.shape
            assert comm.allreduce(x, op=op, out=x) is x
        assert comm.reduce_scatter(x).dtype == x.dtype and comm.allgather(x).shape == (1, len(x))
        assert comm.reduce(x, root=0).dtype == x.dtype and comm.broadcast(x) is x


def test_numpy_cannot_hold_complex32(comm):
    t = TORCH["complex32"]
    with pytest.raises(ValueError, match="numpy has no complex32 to hold the result; pass out="):
        comm.allreduce(DLPack(t))
    out = t.clone()
    assert comm.allreduce(DLPack(t), out=out) is out


@pytest.mark.parametrize(
    "x,op,words",
    [
        (np.ones(3, np.float32), "band", ["float32", "'band'"]),
        (np.ones(3, np.complex64), "max", ["complex64", "'max'"]),
        (np.ones(3, np.complex128), "bor", ["complex128", "'bor'"]),
        (np.ones(3, bool), "avg", ["bool", "'avg'"]),
        (np.ones(3, np.int32), "avg", ["int32", "'avg'"]),
        (TORCH["complex32"], "prod", ["complex32", "'prod'"]),
        (torch.ones(3, dtype=torch.bfloat16), "bxor", ["bfloat16", "'bxor'"]),
    ],
)
def test_meaningless_ops_refused(comm, x, op, words):
    calls = (
        lambda: comm.allreduce(x, op=op),
        lambda: comm.reduce_scatter(x, op=op),
        lambda: comm.reduce(x, op=op),
        lambda: comm.allreduce(x, op=_C.ReduceOp.__members__[op]),
    )
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert all(w in str(info.value) for w in words), info.value


def test_other_dtypes_still_refused(comm):
    for x in (np.zeros(2, np.int16), np.zeros(2, np.clongdouble), torch.zeros(2, dtype=torch.uint16),
              torch.zeros(2, dtype=torch.float8_e4m3fn), memoryview(np.zeros(2, np.uint32))):  # fmt: skip
        with pytest.raises(ValueError, match="unsupported dtype .*bool, complex32, complex64, complex128"):
            comm.allreduce(x, out=np.zeros(2, np.float32))
