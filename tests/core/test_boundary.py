"""The Python/C++ boundary (csrc/bindings/buffers.h, enums.h, bind_*.cc) in this process (one
rank): every kind of array object taken in C++, enums by name or value, codes C++ refuses,
overlapping input and output, compressors running the collective's own payload code,
lifetime. The same rules on 2 and 3 ranks (tests/mpi/boundary.py), and overlapping input and
output on every collective on 2 and 3 ranks (tests/mpi/overlap.py): refused with a ValueError on
every rank before any traffic, or run in place where the collective names that position; numpy,
torch, and the two mixed (3 ranks: uneven reduce_scatter blocks). The overhead benchmark:
tests/bench/test_python_overhead.py."""

from __future__ import annotations

import array
import ctypes
import gc
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import zcoll
from mpi_util import case_names, script_job
from zcoll import _C

@pytest.fixture(scope="module")
def comm():
    with zcoll.Communicator() as c:
        yield c


# -- objects ----------------------------------------------------------------------------------
class LegacyDLPack:
    """A producer that predates DLPack 1.0: __dlpack__ takes no max_version (a legacy capsule)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class VersionedDLPack(LegacyDLPack):
    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        assert max_version is not None and max_version[0] >= 1, "zcoll asks for DLPack 1.x"
        return self._a.__dlpack__(max_version=max_version)


@pytest.mark.parametrize(
    "make,dtype",
    [
        (lambda v: array.array("b", v), "int8"),
        (lambda v: array.array("B", v), "uint8"),
        (lambda v: array.array("i", v), "int32"),
        (lambda v: array.array("l", v), "int64"),
        (lambda v: array.array("q", v), "int64"),
        (lambda v: array.array("f", v), "float32"),
        (lambda v: array.array("d", v), "float64"),
        (lambda v: (ctypes.c_float * len(v))(*v), "float32"),  # format '<f'
        (lambda v: (ctypes.c_int64 * len(v))(*v), "int64"),  # format '<q' (or '<l')
        (lambda v: memoryview(array.array("f", v)).cast("B").cast("@f"), "float32"),  # '@f'
        (lambda v: np.asarray(v, np.float16), "float16"),
        (lambda v: np.asarray(v, np.int32).reshape(len(v), 1)[:, 0], "int32"),  # a contiguous view
        (lambda v: torch.tensor(v, dtype=torch.bfloat16), "bfloat16"),
        (lambda v: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32)), "float32"),  # a Tensor subclass
        (lambda v: LegacyDLPack(np.asarray(v, np.float64)), "float64"),
        (lambda v: VersionedDLPack(np.asarray(v, np.float32)), "float32"),
        (lambda v: VersionedDLPack(torch.tensor(v, dtype=torch.bfloat16)), "bfloat16"),
    ],
)
def test_every_kind_of_object(comm, make, dtype):
    values = [1, 2, 3, 4]
    x = make(values)
    assert _C.describe(x)[0] == dtype and _C.describe(x)[2] == 4
    out = np.zeros(4, "float32" if dtype == "bfloat16" else dtype)
    if dtype == "bfloat16":
        out = torch.zeros(4, dtype=torch.bfloat16)
    assert comm.allreduce(x, op="max", out=out) is out
    got = out.tolist() if isinstance(out, torch.Tensor) else np.asarray(out, np.float64).tolist()
    assert got == values


def test_dlpack_releases_what_it_takes(comm):
    """The deleter runs after each call: the exporting array is referenced as before."""
    a = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    before = sys.getrefcount(a)
    for x in (LegacyDLPack(a), VersionedDLPack(a)):
        for _ in range(3):
            comm.allreduce(x, out=out)
        del x
    assert sys.getrefcount(a) == before
    assert out.tolist() == a.tolist()


@pytest.mark.parametrize(
    "make,exc,words",
    [
        (lambda: np.zeros(4, ">f4"), ValueError, "x: unsupported dtype >f4 float32"),
        (lambda: array.array("h", [1, 2]), ValueError, "x: unsupported dtype 'h' float32 int64"),
        (lambda: (ctypes.c_int16 * 2)(), ValueError, "x: unsupported dtype"),
        (lambda: torch.zeros(3, 3).to_sparse(), ValueError, "x: sparse"),
        (lambda: torch.zeros(4, device="meta"), ValueError, "x: CPU tensors meta .cpu()"),
        (lambda: LegacyDLPack(np.zeros(4, np.uint16)), ValueError, "x:"),
        (lambda: LegacyDLPack(np.zeros(4, np.int16)), ValueError, "x: unsupported dtype"),
        (lambda: VersionedDLPack(np.zeros((4, 4), np.float32)[:, 1]), ValueError, "x:"),
        (lambda: memoryview(np.zeros(8, np.float32))[::2], ValueError, "x: contiguous"),
        (lambda: 3.0, TypeError, "x: numpy torch DLPack buffer float"),
        (lambda: None, TypeError, "x: NoneType"),
    ],
)
def test_objects_refused(comm, make, exc, words):
    with pytest.raises(exc) as info:
        comm.allreduce(make(), out=np.zeros(4, np.float32))
    missing = [w for w in words.split() if w not in str(info.value)]
    assert not missing, f"message lacks {missing}: {info.value}"


def test_torch_is_not_imported():
    code = (
        "import sys, zcoll, numpy as np; c = zcoll.Communicator(); c.allreduce(np.ones(2)); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
    # torch imported after the first call: its tensors are recognised from then on
    code = (
        "import zcoll, numpy as np; c = zcoll.Communicator(); c.allreduce(np.ones(2)); import torch; "
        "t = torch.ones(2); print(c.allreduce(t, out=t).tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "[1.0, 1.0]", out.stderr


# -- enums and codes --------------------------------------------------------------------------
def test_names_come_from_cpp():
    assert zcoll.OPS == tuple(_C.ReduceOp.__members__)
    assert zcoll.ALGORITHMS == tuple(_C.Algorithm.__members__)
    assert list(_C.DType.__members__) == [
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int8",
        "uint8",
        "int32",
        "int64",
        "bool",
        "complex32",
        "complex64",
        "complex128",
    ]
    assert list(_C.Compression.__members__) == [
        "none",
        "fp16",
        "bf16",
        "quantize",
        "topk",
        "randomk",
        "threshold",
    ]


def test_enums_or_names(comm):
    x = np.arange(4, dtype=np.float32)
    assert comm.allreduce(x, op=_C.ReduceOp.max, algorithm=_C.Algorithm.ring).tolist() == x.tolist()
    assert comm.reduce(x, op=_C.ReduceOp.min).tolist() == x.tolist()
    with pytest.raises(TypeError, match="op must be a str .*ReduceOp, got int"):
        comm.allreduce(x, op=0)
    with pytest.raises(TypeError, match="algorithm must be a str"):
        comm.allreduce(x, algorithm=None)


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda c, x: c.allreduce(x, algorithm=_C.Algorithm(99)), "unknown algorithm code 99"),
        (lambda c, x: c.allreduce(x, algorithm=_C.Algorithm(-1)), "unknown algorithm code -1"),
        (lambda c, x: c.allreduce(x, op=_C.ReduceOp(9)), "unknown op code 9"),
        (lambda c, x: c.reduce_scatter(x, op=_C.ReduceOp(-3)), "unknown op code -3"),
        (lambda c, x: _C.time_allreduce(c, 4, _C.DType(12), "auto", 1), "unknown dtype code 12"),
        (lambda c, x: _C.time_allreduce(c, 4, "float32", _C.Algorithm(9), 1), "unknown algorithm code 9"),
        (lambda c, x: _C.CompressionOptions(_C.Compression(42)), "unknown compression kind 42"),
        (lambda c, x: c.allreduce(x, compression=zcoll.HalfPrecision(), algorithm=_C.Algorithm(10)), "code 10"),
    ],
)
def test_cpp_never_trusts_a_code(comm, call, words):
    """py::enum_ builds members from any int: C++ validates every code it is given."""
    before = comm.stats()
    with pytest.raises(ValueError, match=words):
        call(comm, np.arange(4, dtype=np.float32))
    assert comm.stats() == before


# -- overlap ----------------------------------------------------------------------------------
def test_partial_overlap_is_refused(comm):
    b = np.arange(40, dtype=np.float32)
    t = torch.arange(40, dtype=torch.float32)
    with pytest.raises(ValueError, match="share memory .* in-place position .*out=x"):
        comm.allreduce(b[:-8], out=b[8:])
    with pytest.raises(ValueError, match="share memory"):
        comm.allreduce(t[8:], out=t[:-8])
    with pytest.raises(ValueError, match="share memory"):
        comm.reduce(b[:-4], out=b[4:])
    with pytest.raises(ValueError, match="share memory .*out\\[rank\\]"):
        comm.allgather(b[:-4], out=b[4:])
    with pytest.raises(ValueError, match="share memory .*block of x"):
        comm.reduce_scatter(b[:-4], out=b[4:])
    with pytest.raises(ValueError, match="share memory"):
        comm.allreduce(b[:-16], out=b[16:], compression=zcoll.HalfPrecision())
    assert b.tolist() == list(range(40)), "nothing was written"


def test_exact_aliasing_is_in_place(comm):
    b = np.arange(8, dtype=np.float32)
    assert comm.allreduce(b, out=b[:]).tolist() == list(range(8))  # another object, same memory
    assert comm.reduce(b[2:], out=b[2:]).tolist() == list(range(2, 8))
    assert comm.allgather(b, out=b.reshape(1, 8)).tolist() == [list(range(8))]
    assert comm.reduce_scatter(b, out=b[:]).tolist() == list(range(8))
    t = torch.arange(8, dtype=torch.float32)
    assert comm.allreduce(t, out=t.view(2, 4)).shape == (2, 4)
    q = zcoll.HalfPrecision()
    y = comm.allreduce(b.copy(), compression=q)
    assert comm.allreduce(b, out=b[:], compression=q).tolist() == y.tolist()


# -- compressors: the collective's payload code ------------------------------------------------
def test_payload_arrays_are_views_of_the_cpp_payload():
    q = zcoll.GradientQuantizer(bits=4, block=32)
    assert isinstance(q._options, _C.CompressionOptions) and q._options.bits == 4
    p = q.compress(np.linspace(-1, 1, 100, dtype=np.float32))
    for a in p.arrays.values():
        assert a.base is not None and np.shares_memory(a, np.frombuffer(p.wire, np.uint8))
    p.arrays["scales"][:] = 0  # the payload decoded is the one the arrays show
    assert not q.decompress(p).any()


@pytest.mark.parametrize(
    "make",
    [
        lambda: zcoll.TopK(0.1, exact=True),
        lambda: zcoll.Threshold(0.5),
        lambda: zcoll.RandomK(0.25, seed=3),
        lambda: zcoll.HalfPrecision("bf16", error_feedback=True),
        lambda: zcoll.GradientQuantizer(1),
    ],
)
def test_compress_with_error_feedback_keeps_everything(make):
    """x + residual before == decompress(compress(x)) + residual after (exactly for sparsifiers)."""
    c = make()
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    c.compress(x, key="w")
    e0 = c.residual("w").astype(np.float64)
    y = c.decompress(c.compress(x, key="w")).astype(np.float64)
    np.testing.assert_allclose(
        y + c.residual("w"), x + e0, rtol=0, atol=1e-6 * (np.abs(x).max() + np.abs(e0).max())
    )


def test_failed_compress_leaves_no_state():
    q = zcoll.GradientQuantizer()
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        q.compress(np.ones(10, np.float64), key="w")
    assert q.residual("w") is None and q._calls == {}


# -- lifetime ---------------------------------------------------------------------------------
def test_garbage_collected_communicator_warns():
    c = zcoll.Communicator()
    with pytest.warns(ResourceWarning, match="without free"):  # noqa: PT031
        del c
        gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = zcoll.Communicator()
        d.free()
        del d
        gc.collect()


def test_cpp_call_alone(comm):
    times = _C.time_allreduce(comm, 16, "float32", "mpi", 5)
    assert len(times) == 5 and all(t > 0 for t in times)


# -- the other ranks: tests/mpi/boundary.py and tests/mpi/overlap.py ------------------------
@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("case", case_names("mpi/boundary.py"))
def test_boundary_on_every_rank(nprocs, case):
    script_job("mpi/boundary.py", nprocs, timeout=180).check(case, min_checks=3)


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("case", case_names("mpi/overlap.py"))
def test_overlap(nprocs, case):
    script_job("mpi/overlap.py", nprocs, timeout=240).check(case, min_checks=3)
