"""Gradient compressors for ``Communicator.allreduce(x, op, compression=..., key=...)``.

A compressor describes a wire format and keeps, per tensor ``key``, the error-feedback residual
(what compression lost so far, added back to the next call: EF-SGD). The compressor, its
residuals and the communicator are separate objects (the split GRACE uses)::

    import zcoll
    comm = zcoll.Communicator()
    q = zcoll.GradientQuantizer(bits=8)               # int8 codes + a float32 scale per 256
    comm.allreduce(grad, op="avg", compression=q, key="layer1.weight", out=grad)
    print(q.last_stats.wire_bytes, q.last_stats.ratio)

Compressors (C++: csrc/collectives/compression.h; error bounds in docs/algorithms.md):

* ``GradientQuantizer(bits=8|4|1, block=256, stochastic=False, error_feedback=True)``:
  compressed ring; every hop dequantizes, adds its input and requantizes.
* ``TopK(ratio=0.01, error_feedback=True, exact=False)``: blockwise top-k, (index, value) pairs
  per segment, sent while the next segment is selected, added in rank order by every rank
  (dense ring above count/2 pairs); exact=True: the global top-k.
* ``Threshold(value)``: (index, value) pairs, gathered by every rank and added in rank order.
* ``RandomK(ratio, seed=0)``: the same seed-chosen indices on every rank; only values travel.
* ``HalfPrecision("fp16"|"bf16")``: 2-byte floats on the wire, float32 accumulation.

Every rank ends with the same bits. Non-finite input (NaN, Inf) raises ``FloatingPointError``
on every rank after the collective (it travels as NaN in what every rank receives), naming the
key; that key's residual is reset to zero. Each compressor also offers ``compress(x)`` and
``decompress(payload)`` for direct use: one rank's wire format, the same bits a one-rank
allreduce produces.
"""

from __future__ import annotations

import ctypes
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import _C
from ._arrays import DTYPE_CODES, View, as_view, check_writable

COMPRESSIBLE_DTYPES = ("float32", "float16", "bfloat16")
_F32 = DTYPE_CODES["float32"]
_KINDS = {"fp16": 1, "bf16": 2, "quantize": 3, "topk": 4, "randomk": 5, "threshold": 6}
_MASK64 = (1 << 64) - 1


def _mix(*words: int) -> int:
    """splitmix64 over a few integers: a per-call seed that every rank computes alike."""
    z = 0
    for w in words:
        z = (z ^ (w & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
        z ^= z >> 31
    return z


def _f32_view(address: int, n: int) -> np.ndarray:
    if n == 0:
        return np.empty(0, np.float32)
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address))


def _as_f32(v: View) -> np.ndarray:
    """x as float32: a view of its memory when it is float32, a widened copy otherwise."""
    if v.dtype == "float32":
        return _f32_view(v.address, v.count)
    y = np.empty(v.count, np.float32)
    _C.cast(v.address, v.code, y.ctypes.data, _F32, v.count)
    return y


def _check_dtype(v: View, name: str) -> None:
    if v.dtype not in COMPRESSIBLE_DTYPES:
        raise ValueError(f"{name}: compression needs float32, float16 or bfloat16 data, got {v.dtype}")


@dataclass
class CompressionStats:
    """What one compressed call did on this rank.

    wire_bytes: bytes this rank sent (payload and headers); dense_bytes: what an uncompressed
    ring allreduce would have sent; nonfinite: NaN/Inf blocks or values found (the same on every
    rank); pairs / dense_fallback: sparsifiers; error_max_abs / error_l2: this rank's residual
    after the call (what its compression lost), when the compressor measures errors."""

    method: str
    key: Optional[str]
    count: int
    wire_bytes: int = 0
    dense_bytes: int = 0
    nonfinite: int = 0
    pairs: int = 0
    dense_fallback: bool = False
    error_max_abs: Optional[float] = None
    error_l2: Optional[float] = None

    @property
    def ratio(self) -> float:
        """dense_bytes / wire_bytes: how many times fewer bytes than an uncompressed ring."""
        return self.dense_bytes / self.wire_bytes if self.wire_bytes else math.inf


@dataclass
class Payload:
    """One rank's compressed tensor: numpy arrays in `arrays` (their nbytes sum to `nbytes`)."""

    method: str
    shape: tuple
    dtype: str
    count: int
    arrays: Dict[str, np.ndarray]
    like: Callable[[tuple], Any] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


class Compressor:
    """Base class: error-feedback residuals per key, per-call seeds, the allreduce glue."""

    _kind = 0

    def __init__(self, *, error_feedback: bool, measure_error: bool = False, seed: int = 0):
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.error_feedback = bool(error_feedback)
        self.measure_error = bool(measure_error)
        self.seed = seed
        self.last_stats: Optional[CompressionStats] = None
        self._residuals: Dict[str, Tuple[tuple, np.ndarray]] = {}
        self._calls: Dict[Optional[str], int] = {}

    # -- error-feedback state ---------------------------------------------------------------
    def residual(self, key: str) -> Optional[np.ndarray]:
        """The float32 residual kept for `key` (shaped like its tensor), or None."""
        entry = self._residuals.get(key)
        return entry[1].reshape(entry[0]) if entry else None

    def reset(self, key: Optional[str] = None) -> None:
        """Forgets the residual of `key` (of every key when None)."""
        if key is None:
            self._residuals.clear()
        else:
            self._residuals.pop(key, None)

    def _residual_for(self, key: Optional[str], v: View) -> Optional[np.ndarray]:
        if not self.error_feedback or key is None:
            return None
        if not isinstance(key, str):
            raise TypeError(f"key must be a str naming the tensor, got {type(key).__name__}")
        shape = tuple(v.shape)
        entry = self._residuals.get(key)
        if entry is None:
            entry = (shape, np.zeros(v.count, np.float32))
            self._residuals[key] = entry
        elif entry[0] != shape:
            raise ValueError(
                f"{self!r}: key {key!r} holds a residual for shape {entry[0]}, now called with shape {shape}; "
                f"use one key per tensor, or call reset({key!r}) first"
            )
        return entry[1]

    def _next_seed(self, key: Optional[str]) -> int:
        n = self._calls.get(key, 0)
        self._calls[key] = n + 1
        return _mix(self.seed, zlib.crc32((key or "").encode()), n)

    def _raise_nonfinite(self, key: Optional[str], what: str) -> None:
        if key is not None and key in self._residuals:
            self._residuals[key][1].fill(0.0)
        name = "this tensor" if key is None else f"the tensor with key {key!r}"
        raise FloatingPointError(
            f"zcoll: NaN or Inf reached the {self!r} compressor in {name} ({what}); the result is invalid"
            + ("; its error-feedback residual was reset to zero" if key in self._residuals else "")
            + ". Check the gradients (e.g. skip the step or lower the loss scale) before communicating."
        )

    # -- the collective -----------------------------------------------------------------------
    def _c_kwargs(self, seed: int) -> dict:
        raise NotImplementedError

    def _allreduce(self, comm: Any, v: View, o: View, op: str, key: Optional[str], pipeline: dict) -> None:
        _check_dtype(v, "x")
        if self.error_feedback and key is None:
            raise ValueError(
                f"{self!r} keeps an error-feedback residual per tensor: pass key=... naming the tensor "
                "(e.g. the parameter or bucket name), or create the compressor with error_feedback=False"
            )
        e = self._residual_for(key, v)
        s = _C.allreduce_compressed(
            comm,
            v.address,
            o.address,
            v.count,
            v.code,
            0 if op == "sum" else 4,
            self._kind,
            residual=e.ctypes.data if e is not None and e.size else 0,
            measure_error=self.measure_error,
            **self._c_kwargs(self._next_seed(key)),
            **pipeline,
        )
        measured = self.measure_error
        self.last_stats = CompressionStats(
            method=repr(self),
            key=key,
            count=v.count,
            wire_bytes=s["wire_bytes"],
            dense_bytes=s["dense_bytes"],
            nonfinite=s["nonfinite"],
            pairs=s["pairs"],
            dense_fallback=s["dense_fallback"],
            error_max_abs=s["error_max_abs"] if measured else None,
            error_l2=s["error_l2"] if measured else None,
        )
        if s["nonfinite"]:
            where = (
                f"first sent by rank {s['first_nonfinite_rank']}"
                if s["first_nonfinite_rank"] >= 0
                else (f"{s['nonfinite']} non-finite block(s) in the result")
            )
            self._raise_nonfinite(key, where)

    # -- direct use ---------------------------------------------------------------------------
    def compress(self, x: Any, key: Optional[str] = None) -> Payload:
        """One rank's payload of x. With error feedback and a key, uses and updates that key's
        residual exactly as an allreduce would; otherwise stateless."""
        v = as_view(x, "x")
        _check_dtype(v, "x")
        e = self._residual_for(key, v)
        arrays, problem = self._encode(v, e, self._next_seed(key))
        if problem:
            self._raise_nonfinite(key, problem)
        return Payload(repr(self), tuple(v.shape), v.dtype, v.count, arrays, v.empty)

    def decompress(self, payload: Payload, out: Any = None) -> Any:
        """The tensor a payload stands for, as the kind and dtype compress() was given (into
        `out` when passed: same dtype and size)."""
        if not isinstance(payload, Payload) or payload.method != repr(self):
            raise ValueError(f"not a payload of {self!r}")
        o = as_view(payload.like(payload.shape) if out is None else out, "out")
        check_writable(o, "out")
        if o.dtype != payload.dtype or o.count != payload.count:
            raise ValueError(
                f"out: expected {payload.count} {payload.dtype} elements, got {o.count} {o.dtype}"
            )
        y = _f32_view(o.address, o.count) if o.dtype == "float32" else np.empty(o.count, np.float32)
        self._decode(payload.arrays, y)
        if o.dtype != "float32" and o.count:
            _C.cast(y.ctypes.data, _F32, o.address, o.code, o.count)
        return o.obj

    def _encode(self, v: View, e: Optional[np.ndarray], seed: int) -> Tuple[Dict[str, np.ndarray], str]:
        """(payload arrays, '' or what was non-finite)."""
        raise NotImplementedError

    def _decode(self, arrays: Dict[str, np.ndarray], y: np.ndarray) -> None:
        raise NotImplementedError


class GradientQuantizer(Compressor):
    """Blockwise quantization: int8 (bits=8), int4 (bits=4) or 1-bit sign (bits=1), one float32
    scale per `block` elements. Wire bytes per element: 1, 1/2 or 1/8, plus 4/block.

    stochastic: unbiased stochastic rounding (8 and 4 bits). Error bound of the allreduce (op
    sum, p ranks): p * A / (2Q) per element, A = sum over ranks of max |input| over the block
    (Q = 127 or 7; 1/Q for stochastic, p * A for sign)."""

    _kind = _KINDS["quantize"]

    def __init__(
        self,
        bits: int = 8,
        block: int = 256,
        stochastic: bool = False,
        error_feedback: bool = True,
        *,
        measure_error: bool = False,
        seed: int = 0,
    ):
        if bits not in (1, 4, 8):
            raise ValueError(f"bits must be 8, 4 or 1 (sign), got {bits!r}")
        if not isinstance(block, int) or block <= 0:
            raise ValueError(f"block must be a positive integer, got {block!r}")
        if bits == 4 and block % 2:
            raise ValueError(f"bits=4 needs an even block, got {block}")
        if bits == 1 and block % 8:
            raise ValueError(f"bits=1 needs a block that is a multiple of 8, got {block}")
        if bits == 1 and stochastic:
            raise ValueError("stochastic rounding is for bits=8 and 4; sign quantization (bits=1) has none")
        super().__init__(error_feedback=error_feedback, measure_error=measure_error, seed=seed)
        self.bits, self.block, self.stochastic = bits, block, bool(stochastic)

    def __repr__(self) -> str:
        return (
            f"GradientQuantizer(bits={self.bits}, block={self.block}, stochastic={self.stochastic}, "
            f"error_feedback={self.error_feedback})"
        )

    def _rounding(self) -> str:
        return "stochastic" if self.stochastic else "nearest"

    def _c_kwargs(self, seed: int) -> dict:
        return {"bits": self.bits, "block": self.block, "stochastic": self.stochastic, "seed": seed}

    def _encode(self, v, e, seed):
        _, code_bytes, _, _ = _C.quant_layout(v.count, self.bits, self.block)
        codes = np.empty(code_bytes, np.uint8)
        scales = np.empty(_C.num_blocks(v.count, self.block), np.float32)
        args = (codes.ctypes.data, scales.ctypes.data, self.bits, self.block, self._rounding(), seed, 0)
        if e is not None:
            bad, _ = _C.quantize_ef(v.address, v.code, e.ctypes.data, v.count, *args)
        else:
            bad, _ = _C.quantize(v.address, v.code, v.count, *args)
        return {"codes": codes, "scales": scales}, f"{bad} block(s) hold NaN or Inf" if bad else ""

    def _decode(self, arrays, y):
        _C.dequantize(
            arrays["codes"].ctypes.data,
            arrays["scales"].ctypes.data,
            y.size,
            y.ctypes.data,
            self.bits,
            self.block,
        )


class _Sparsifier(Compressor):
    """(uint32 index, float32 value) payloads; decoding scatters them into zeros."""

    def _check_ratio(self, ratio: float) -> float:
        if not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
        return float(ratio)

    def _select(self, x32: np.ndarray, e: Optional[np.ndarray], seed: int) -> Tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _encode(self, v, e, seed):
        x32 = _as_f32(v)
        if e is not None and not isinstance(self, TopK):  # top-k fuses r = g + e itself
            e += x32
            idx, val = self._select(e, None, seed)
            e[idx] = 0.0
        else:
            idx, val = self._select(x32, e, seed)
        bad = not np.isfinite(val).all()
        return {"indices": idx, "values": val}, "selected values are NaN or Inf" if bad else ""

    def _decode(self, arrays, y):
        y.fill(0.0)
        idx, val = arrays["indices"], arrays["values"]
        _C.scatter_add(y.ctypes.data, y.size, idx.ctypes.data, val.ctypes.data, idx.size)


class TopK(_Sparsifier):
    """Blockwise top-k: the tensor is cut into ``_C.topk_segments(n)`` near-equal segments (8 up
    to 32 MiB of float32, about 4 MiB each beyond, at least 64 KiB each; one below 128 KiB) and
    each keeps its k_j = round(ratio * len_j) (at least 1) elements of largest magnitude, as in
    several DGC implementations. Fixed per-segment counts let the allreduce send a segment while
    it selects the next, so the selection hides behind the transfer. This is not the global
    top-k: a segment full of large values keeps only its k_j of them (error feedback sends the
    rest later).

    exact=True: the global top-k, k = round(ratio * n) over the whole tensor (one segment); the
    allreduce then selects everything before it sends (slower on a slow link).

    Steps of one allreduce: 1. select segment j (error feedback fused: r = x + e, pick, e = r
    minus what was picked); 2. send its (index, value) pairs to every rank while selecting j+1;
    3. add every rank's pairs of segment j in rank order (identical bits on every rank)."""

    _kind = _KINDS["topk"]

    def __init__(
        self,
        ratio: float = 0.01,
        error_feedback: bool = True,
        exact: bool = False,
        *,
        measure_error: bool = False,
        seed: int = 0,
    ):
        super().__init__(error_feedback=error_feedback, measure_error=measure_error, seed=seed)
        self.ratio, self.exact = self._check_ratio(ratio), bool(exact)

    def __repr__(self) -> str:
        return f"TopK(ratio={self.ratio}, error_feedback={self.error_feedback}, exact={self.exact})"

    def _c_kwargs(self, seed: int) -> dict:
        return {"ratio": self.ratio, "exact_topk": self.exact, "seed": seed}

    def segments(self, n: int) -> list:
        """[(begin, end, k_j)] of the segments a tensor of n elements is selected in."""
        if n == 0:
            return []
        s = _C.topk_segments(n, self.exact)
        bounds = [n * j // s for j in range(s + 1)]
        return [(b, e, _C.sparse_k(e - b, self.ratio)) for b, e in zip(bounds, bounds[1:])]

    def _select(self, x32, e, seed):
        segs = self.segments(x32.size)
        k = sum(kj for _, _, kj in segs)
        idx, val = np.empty(k, np.uint32), np.empty(k, np.float32)
        at = 0
        for b, end, kj in segs:
            out = (idx[at:].ctypes.data, val[at:].ctypes.data, "sampled", seed)
            if e is not None:
                _C.topk_ef(x32[b:].ctypes.data, e[b:].ctypes.data, end - b, kj, *out)
            else:
                _C.topk(x32[b:].ctypes.data, end - b, kj, *out)
            idx[at : at + kj] += b
            at += kj
        return idx, val


class RandomK(_Sparsifier):
    """k = round(ratio * n) indices drawn uniformly from a per-call seed that every rank
    computes alike, so only the k values travel (summed by a ring). Values are not rescaled."""

    _kind = _KINDS["randomk"]

    def __init__(
        self, ratio: float = 0.01, seed: int = 0, error_feedback: bool = True, *, measure_error: bool = False
    ):
        super().__init__(error_feedback=error_feedback, measure_error=measure_error, seed=seed)
        self.ratio = self._check_ratio(ratio)

    def __repr__(self) -> str:
        return f"RandomK(ratio={self.ratio}, seed={self.seed}, error_feedback={self.error_feedback})"

    def _c_kwargs(self, seed: int) -> dict:
        return {"ratio": self.ratio, "seed": seed}

    def _select(self, x32, e, seed):
        n = x32.size
        k = _C.sparse_k(n, self.ratio) if n else 0
        idx, val = np.empty(k, np.uint32), np.empty(k, np.float32)
        if k:
            _C.randomk(x32.ctypes.data, n, k, seed, idx.ctypes.data, val.ctypes.data)
        return idx, val


class Threshold(_Sparsifier):
    """Every element with |x| > value (value >= 0). The count varies per rank and call."""

    _kind = _KINDS["threshold"]

    def __init__(self, value: float, error_feedback: bool = True, *, measure_error: bool = False):
        if not isinstance(value, (int, float)) or not value >= 0.0 or math.isinf(value):
            raise ValueError(f"threshold value must be a finite number >= 0, got {value!r}")
        super().__init__(error_feedback=error_feedback, measure_error=measure_error)
        self.value = float(value)

    def __repr__(self) -> str:
        return f"Threshold(value={self.value}, error_feedback={self.error_feedback})"

    def _c_kwargs(self, seed: int) -> dict:
        return {"threshold": self.value, "seed": seed}

    def _select(self, x32, e, seed):
        n = x32.size
        idx, val = np.empty(n, np.uint32), np.empty(n, np.float32)
        m = _C.threshold(x32.ctypes.data, n, self.value, idx.ctypes.data, val.ctypes.data, n) if n else 0
        return idx[:m].copy(), val[:m].copy()


class HalfPrecision(Compressor):
    """float16 ("fp16") or bfloat16 ("bf16") on the wire, float32 accumulation at every hop.
    Values beyond float16's range become Inf and raise FloatingPointError."""

    def __init__(self, fmt: str = "fp16", error_feedback: bool = False, *, measure_error: bool = False):
        if fmt not in ("fp16", "bf16"):
            raise ValueError(f"HalfPrecision format must be 'fp16' or 'bf16', got {fmt!r}")
        super().__init__(error_feedback=error_feedback, measure_error=measure_error)
        self.fmt = fmt
        self._kind = _KINDS[fmt]
        self._wire = DTYPE_CODES["float16" if fmt == "fp16" else "bfloat16"]

    def __repr__(self) -> str:
        return f"HalfPrecision({self.fmt!r}, error_feedback={self.error_feedback})"

    def _c_kwargs(self, seed: int) -> dict:
        return {}

    def _encode(self, v, e, seed):
        data = np.empty(v.count, np.uint16)
        if v.count:
            x32 = _as_f32(v)
            if e is not None:
                e += x32
                _C.cast(e.ctypes.data, _F32, data.ctypes.data, self._wire, v.count)
                back = np.empty(v.count, np.float32)
                _C.cast(data.ctypes.data, self._wire, back.ctypes.data, _F32, v.count)
                e -= back
            else:
                _C.cast(x32.ctypes.data, _F32, data.ctypes.data, self._wire, v.count)
        exp = 0x7C00 if self.fmt == "fp16" else 0x7F80
        bad = ((data & exp) == exp).any()
        return {"data": data}, f"values are NaN or Inf in {self.fmt}" if bad else ""

    def _decode(self, arrays, y):
        if y.size:
            _C.cast(arrays["data"].ctypes.data, self._wire, y.ctypes.data, _F32, y.size)
