"""The documented per-element error bound of zcoll's compressors (docs/algorithms.md,
csrc/compression/compression.h), and the check of a compressed result against it.

1. ``error_bound(comp, xs, exact, op)``: the bound on |result - exact| per element, for the
   inputs of every rank.
2. ``beyond_bound(y, xs, comp, op, dtype)``: None when a result in the output dtype lies within
   that bound plus one rounding to the dtype, else which elements do not.

One copy, used by bench/soak.py's checker and by tests/mpi/compressed_allreduce.py.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .codecs import GradientQuantizer, HalfPrecision, Threshold, TopK

MANTISSA = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}  # bits, implicit one included
# half the spacing of the subnormals: the absolute rounding error below the normal range
HALF_SUBNORMAL = {"float16": 2.0**-25, "bfloat16": 2.0**-134, "float32": 2.0**-150, "float64": 2.0**-1075}


def error_bound(comp: Any, xs: list, exact: np.ndarray, op: str) -> np.ndarray:
    """The compressor's documented bound on |result - exact|, per element, for the inputs `xs`
    of every rank (float64) whose exact reduction is `exact`; op "sum" or "avg"."""
    p, n = len(xs), exact.size
    if n == 0:
        return exact
    M = np.sum([np.abs(x) for x in xs], axis=0)
    if isinstance(comp, GradientQuantizer):
        nb = -(-n // comp.block)
        A = np.zeros(n)
        for x in xs:
            pad = np.zeros(nb * comp.block)
            pad[:n] = np.abs(x)
            A += np.repeat(pad.reshape(nb, comp.block).max(axis=1), comp.block)[:n]
        q = 127 if comp.bits == 8 else 7
        k = 1.0 if comp.bits == 1 else (1.0 if comp.stochastic else 0.5) / q
        b = p * A * k + p * M * 2.0**-20 + p * 2.0**-149
    elif isinstance(comp, HalfPrecision):
        u = 2.0**-11 if comp.fmt == "fp16" else 2.0**-8
        b = M * ((1 + u) ** p - 1) + p * M * 2.0**-20 + (p * 2.0**-25 if comp.fmt == "fp16" else 0)
    else:
        if isinstance(comp, TopK):  # per segment: sum over ranks of its k_j-th largest |x|
            A = np.zeros(n)
            for lo, hi, k in comp.segments(n):
                A[lo:hi] = sum(np.partition(np.abs(x[lo:hi]), hi - lo - k)[hi - lo - k] for x in xs)
        elif isinstance(comp, Threshold):
            A = p * comp.value
        else:
            A = M
        b = A + p * M * 2.0**-23
    return b / p if op == "avg" else b


def beyond_bound(y: np.ndarray, xs: list, comp: Any, op: str, dtype: str) -> Optional[str]:
    """None when y (as float64) is within the compressor's bound of the exact sum (avg: mean) of
    xs, plus one rounding to the output dtype; else what is not."""
    exact = np.sum(xs, axis=0) / (len(xs) if op == "avg" else 1) if y.size else np.zeros(0)
    err = np.abs(y - exact)
    # the final rounding to the output dtype acts on the computed value, which the compression
    # error may have moved above |exact|: half an ulp of the larger of the two, and no less than
    # half a subnormal's spacing (a float16 result of 1e-8 is rounded by up to 3e-8; the soak
    # once flagged a bf16 + error feedback average of float16 there: 1.07e-8 against 0.97e-8)
    rounding = np.maximum(
        np.maximum(np.abs(exact), np.abs(y)) * 2.0 ** -MANTISSA[dtype], HALF_SUBNORMAL[dtype]
    )
    allowed = error_bound(comp, xs, exact, op) + rounding
    bad = np.flatnonzero(~(err <= allowed))
    if bad.size:
        i = bad[0]
        return f"{bad.size} of {y.size} elements beyond the error bound; at {i}: {err[i]!r} > {allowed[i]!r}"
    return None
