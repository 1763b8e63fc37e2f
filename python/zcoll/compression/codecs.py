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
``decompress(payload)`` for direct use: one rank's wire format, computed by the collective's own
C++ encode and selection (csrc/collectives/payload.h), so the same bits a one-rank allreduce
produces.

A compressor's parameters live in one C++ ``CompressionOptions`` (validated when it is built);
this module keeps the per-key state (error-feedback residuals, per-call seeds) and the results.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import _C
from ..core.communicator import new_like

_MASK64 = (1 << 64) - 1
# Attributes that never appear in a compressor's repr: setting them keeps the cached name.
_UNNAMED = frozenset({"last_stats", "norm_sample", "_name", "_residuals", "_calls"})


@functools.lru_cache(maxsize=4096)
def _key_crc(key: str | None) -> int:
    return zlib.crc32((key or "").encode())


@dataclass
class CompressionStats:
    """What one compressed call did on this rank.

    wire_bytes: bytes this rank sent (payload and headers); dense_bytes: what an uncompressed
    ring allreduce would have sent; nonfinite: NaN/Inf blocks or values found (the same on every
    rank); pairs / dense_fallback: sparsifiers; error_max_abs / error_l2: this rank's residual
    after the call (what its compression lost), when the compressor measures errors;
    input_squares / residual_squares: sums of squares of `norm_sample` elements of this rank's
    input before the call and of its residual after it (0 without one), when the compressor's
    norm_sample is set (16 runs, one at the start of each sixteenth; all elements up to
    norm_sample)."""

    method: str
    key: str | None
    count: int
    wire_bytes: int = 0
    dense_bytes: int = 0
    nonfinite: int = 0
    pairs: int = 0
    dense_fallback: bool = False
    error_max_abs: float | None = None
    error_l2: float | None = None
    input_squares: float | None = None
    residual_squares: float | None = None

    @property
    def ratio(self) -> float:
        """dense_bytes / wire_bytes: how many times fewer bytes than an uncompressed ring."""
        return self.dense_bytes / self.wire_bytes if self.wire_bytes else math.inf


@dataclass
class Payload:
    """One rank's compressed tensor: numpy arrays in `arrays` (their nbytes sum to `nbytes`),
    views of the bytes in `wire` (the C++ payload, which decompress() decodes)."""

    method: str
    shape: tuple
    dtype: str
    count: int
    arrays: dict[str, np.ndarray]
    like: Callable[[tuple], Any] = field(repr=False)
    wire: Any = field(repr=False, default=None)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


class Compressor:
    """Base class: the C++ options, error-feedback residuals per key, per-call seeds, and the
    glue to the collective and to the payload functions."""

    def __init__(self, options: Any, *, error_feedback: bool, seed: int = 0):
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self._options = options
        self.error_feedback = bool(error_feedback)
        self.measure_error = options.measure_error
        self.norm_sample = 0  # > 0: last_stats carries input_squares / residual_squares (the guard's)
        self.seed = seed
        self.last_stats: CompressionStats | None = None
        self._residuals: dict[str, tuple[tuple, np.ndarray]] = {}
        self._calls: dict[str | None, int] = {}

    # -- error-feedback state ---------------------------------------------------------------
    def residual(self, key: str) -> np.ndarray | None:
        """The float32 residual kept for `key` (shaped like its tensor), or None."""
        entry = self._residuals.get(key)
        return entry[1].reshape(entry[0]) if entry else None

    def reset(self, key: str | None = None) -> None:
        """Forgets the residual of `key` (of every key when None)."""
        if key is None:
            self._residuals.clear()
        else:
            self._residuals.pop(key, None)

    def state_dict(self) -> dict[str, Any]:
        """This rank's state, for checkpoints: ``{"residuals": {key: float32 array shaped like its
        tensor}, "calls": {key: calls so far}}`` (the call counts drive the per-call seeds of
        stochastic rounding and random-k). Copies; numpy only."""
        return {
            "residuals": {k: e.reshape(shape).copy() for k, (shape, e) in self._residuals.items()},
            "calls": dict(self._calls),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replaces the residuals and call counts with those of :meth:`state_dict` (arrays or
        CPU tensors), so the next call computes exactly what it would have before the save."""
        residuals = {}
        for key, r in state["residuals"].items():
            a = np.array(r.numpy() if hasattr(r, "numpy") else r, dtype=np.float32, copy=True)  # or a tensor
            residuals[key] = (tuple(a.shape), a.reshape(-1))
        self._residuals = residuals
        self._calls = {k: int(n) for k, n in state["calls"].items()}

    def set_residual(self, key: str, values: Any) -> None:
        """Makes `values` (a float32 copy, shaped like the tensor `key` names) the residual of
        `key`, e.g. when the tensors behind the keys change (DDP rebuilding its buckets)."""
        if not isinstance(key, str):
            raise TypeError(f"key must be a str naming the tensor, got {type(key).__name__}")
        a = np.array(values, dtype=np.float32, copy=True)
        self._residuals[key] = (tuple(a.shape), a.reshape(-1))

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name not in _UNNAMED:
            self.__dict__.pop("_name", None)

    def _method(self) -> str:
        """repr(self), kept until an attribute it may show is set: payloads carry it, and after
        a selection has emptied the caches formatting it costs microseconds per call."""
        name = self.__dict__.get("_name")
        if name is None:
            name = self._name = repr(self)
        return name

    def _state(self, key: str | None, x: Any) -> tuple[np.ndarray | None, int, int, tuple | None]:
        """(residual or None, this call's seed, calls so far, residual entry): _commit(key,
        calls, entry) records the call (a new key's residual, the call count behind the seeds)
        once the C++ call has succeeded."""
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be a str naming the tensor, got {type(key).__name__}")
        calls = self._calls.get(key, 0)
        # splitmix64 chained over (seed, key, call): every rank computes it alike (C++: 1.6 us less)
        seed = _C.call_seed(self.seed & _MASK64, _key_crc(key), calls & _MASK64)
        entry = None
        if self.error_feedback and key is not None:
            _, shape, count = _C.describe(x, "x")
            entry = self._residuals.get(key)
            if entry is None:
                entry = (shape, np.zeros(count, np.float32))
            elif entry[0] != shape:
                raise ValueError(
                    f"{self!r}: key {key!r} holds a residual for shape {entry[0]}, now called with shape "
                    f"{shape}; use one key per tensor, or call reset({key!r}) first"
                )
        return (entry[1] if entry is not None else None), seed, calls, entry

    def _commit(self, key: str | None, calls: int, entry: tuple | None) -> None:
        self._calls[key] = calls + 1
        if entry is not None:
            self._residuals.setdefault(key, entry)

    def _raise_nonfinite(self, key: str | None, what: str) -> None:
        if key is not None and key in self._residuals:
            self._residuals[key][1].fill(0.0)
        name = "this tensor" if key is None else f"the tensor with key {key!r}"
        raise FloatingPointError(
            f"zcoll: NaN or Inf reached the {self!r} compressor in {name} ({what}); the result is invalid"
            + ("; its error-feedback residual was reset to zero" if key in self._residuals else "")
            + ". Check the gradients (e.g. skip the step or lower the loss scale) before communicating."
        )

    # -- the collective -----------------------------------------------------------------------
    def _allreduce(self, comm: Any, x: Any, out: Any, op: Any, algorithm: Any, key: str | None) -> None:
        if self.error_feedback and key is None:
            raise ValueError(
                f"{self!r} keeps an error-feedback residual per tensor: pass key=... naming the tensor "
                "(e.g. the parameter or bucket name), or create the compressor with error_feedback=False"
            )
        e, seed, calls, entry = self._state(key, x)
        s = _C.allreduce_compressed(comm, x, out, op, algorithm, self._options, seed, e, self.norm_sample)
        self._commit(key, calls, entry)
        measured, sampled = self.measure_error, self.norm_sample > 0
        self.last_stats = CompressionStats(
            method=self._method(),
            key=key,
            count=s["count"],
            wire_bytes=s["wire_bytes"],
            dense_bytes=s["dense_bytes"],
            nonfinite=s["nonfinite"],
            pairs=s["pairs"],
            dense_fallback=s["dense_fallback"],
            error_max_abs=s["error_max_abs"] if measured else None,
            error_l2=s["error_l2"] if measured else None,
            input_squares=s["input_squares"] if sampled else None,
            residual_squares=s["residual_squares"] if sampled else None,
        )
        if s["nonfinite"]:
            where = (
                f"first sent by rank {s['first_nonfinite_rank']}"
                if s["first_nonfinite_rank"] >= 0
                else (f"{s['nonfinite']} non-finite block(s) in the result")
            )
            self._raise_nonfinite(key, where)

    # -- direct use ---------------------------------------------------------------------------
    def compress(self, x: Any, key: str | None = None, out: Payload | None = None) -> Payload:
        """One rank's payload of x. With error feedback and a key, uses and updates that key's
        residual exactly as an allreduce would; otherwise stateless.

        out: a payload this compressor made from a tensor of the same size and dtype, overwritten
        in place and returned (its arrays keep their memory: nothing is allocated). For the
        fixed-size payloads: quantizers, half precision, top-k (ValueError otherwise)."""
        if out is not None and (
            not isinstance(out, Payload) or out.method != self._method() or out.wire is None
        ):
            raise ValueError(f"out: not a payload of {self!r}")
        e, seed, calls, entry = self._state(key, x)
        wire = _C.encode_payload(x, self._options, seed, e, None if out is None else out.wire)
        self._commit(key, calls, entry)
        if wire.nonfinite:
            self._raise_nonfinite(key, f"{wire.nonfinite} non-finite block(s) or value(s) in the payload")
        if out is not None:
            out.shape, out.like = wire.shape, lambda s, _x=x: new_like(_x, s)
            return out
        arrays = {name: np.frombuffer(wire, np.dtype(t), n, offset) for name, t, offset, n in wire.layout}
        return Payload(
            self._method(), wire.shape, wire.dtype, wire.count, arrays, lambda s, _x=x: new_like(_x, s), wire
        )

    def decompress(self, payload: Payload, out: Any = None) -> Any:
        """The tensor a payload stands for, as the kind and dtype compress() was given (into
        `out` when passed: same dtype and size)."""
        if not isinstance(payload, Payload) or payload.method != self._method() or payload.wire is None:
            raise ValueError(f"not a payload of {self!r}")
        if out is None:
            out = payload.like(payload.shape)
        _C.decode_payload(payload.wire, out)
        return out


class GradientQuantizer(Compressor):
    """Blockwise quantization: int8 (bits=8), int4 (bits=4) or 1-bit sign (bits=1), one float32
    scale per `block` elements. Wire bytes per element: 1, 1/2 or 1/8, plus 4/block.

    stochastic: unbiased stochastic rounding (8 and 4 bits). Error bound of the allreduce (op
    sum, p ranks): p * A / (2Q) per element, A = sum over ranks of max |input| over the block
    (Q = 127 or 7; 1/Q for stochastic, p * A for sign)."""

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
        o = _C.CompressionOptions(
            "quantize", bits=bits, block=block, stochastic=stochastic, measure_error=measure_error
        )
        super().__init__(o, error_feedback=error_feedback, seed=seed)
        self.bits, self.block, self.stochastic = o.bits, o.block, o.stochastic

    def __repr__(self) -> str:
        return (
            f"GradientQuantizer(bits={self.bits}, block={self.block}, stochastic={self.stochastic}, "
            f"error_feedback={self.error_feedback})"
        )


class TopK(Compressor):
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

    def __init__(
        self,
        ratio: float = 0.01,
        error_feedback: bool = True,
        exact: bool = False,
        *,
        measure_error: bool = False,
        seed: int = 0,
    ):
        o = _C.CompressionOptions("topk", ratio=ratio, exact_topk=exact, measure_error=measure_error)
        super().__init__(o, error_feedback=error_feedback, seed=seed)
        self.ratio, self.exact = o.ratio, o.exact_topk

    def __repr__(self) -> str:
        return f"TopK(ratio={self.ratio}, error_feedback={self.error_feedback}, exact={self.exact})"

    def segments(self, n: int) -> list:
        """[(begin, end, k_j)] of the segments a tensor of n elements is selected in."""
        if n == 0:
            return []
        s = _C.topk_segments(n, self.exact)
        bounds = [n * j // s for j in range(s + 1)]
        return [(b, e, _C.sparse_k(e - b, self.ratio)) for b, e in zip(bounds, bounds[1:])]


class RandomK(Compressor):
    """k = round(ratio * n) indices drawn uniformly from a per-call seed that every rank
    computes alike, so only the k values travel (summed by a ring). Values are not rescaled."""

    def __init__(
        self, ratio: float = 0.01, seed: int = 0, error_feedback: bool = True, *, measure_error: bool = False
    ):
        o = _C.CompressionOptions("randomk", ratio=ratio, measure_error=measure_error)
        super().__init__(o, error_feedback=error_feedback, seed=seed)
        self.ratio = o.ratio

    def __repr__(self) -> str:
        return f"RandomK(ratio={self.ratio}, seed={self.seed}, error_feedback={self.error_feedback})"


class Threshold(Compressor):
    """Every element with |x| > value (value >= 0). The count varies per rank and call."""

    def __init__(self, value: float, error_feedback: bool = True, *, measure_error: bool = False):
        o = _C.CompressionOptions("threshold", threshold=value, measure_error=measure_error)
        super().__init__(o, error_feedback=error_feedback)
        self.value = float(value)

    def __repr__(self) -> str:
        return f"Threshold(value={self.value}, error_feedback={self.error_feedback})"


class HalfPrecision(Compressor):
    """float16 ("fp16") or bfloat16 ("bf16") on the wire, float32 accumulation at every hop.
    Values beyond float16's range become Inf and raise FloatingPointError."""

    def __init__(self, fmt: str = "fp16", error_feedback: bool = False, *, measure_error: bool = False):
        if fmt not in ("fp16", "bf16"):
            raise ValueError(f"HalfPrecision format must be 'fp16' or 'bf16', got {fmt!r}")
        super().__init__(
            _C.CompressionOptions(fmt, measure_error=measure_error), error_feedback=error_feedback
        )
        self.fmt = fmt

    def __repr__(self) -> str:
        return f"HalfPrecision({self.fmt!r}, error_feedback={self.error_feedback})"
