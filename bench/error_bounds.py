"""The documented per-element error bound of zcoll's compressors (docs/algorithms.md,
csrc/compression/compression.h): one copy, used by bench/soak.py's checker and by
tests/mpi/compressed_allreduce.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import zcoll


def error_bound(comp: Any, xs: list, exact: np.ndarray, op: str) -> np.ndarray:
    """The compressor's documented bound on |result - exact|, per element, for the inputs `xs`
    of every rank (float64) whose exact reduction is `exact`; op "sum" or "avg"."""
    p, n = len(xs), exact.size
    if n == 0:
        return exact
    M = np.sum([np.abs(x) for x in xs], axis=0)
    if isinstance(comp, zcoll.GradientQuantizer):
        nb = -(-n // comp.block)
        A = np.zeros(n)
        for x in xs:
            pad = np.zeros(nb * comp.block)
            pad[:n] = np.abs(x)
            A += np.repeat(pad.reshape(nb, comp.block).max(axis=1), comp.block)[:n]
        q = 127 if comp.bits == 8 else 7
        k = 1.0 if comp.bits == 1 else (1.0 if comp.stochastic else 0.5) / q
        b = p * A * k + p * M * 2.0**-20 + p * 2.0**-149
    elif isinstance(comp, zcoll.HalfPrecision):
        u = 2.0**-11 if comp.fmt == "fp16" else 2.0**-8
        b = M * ((1 + u) ** p - 1) + p * M * 2.0**-20 + (p * 2.0**-25 if comp.fmt == "fp16" else 0)
    else:
        if isinstance(comp, zcoll.TopK):  # per segment: sum over ranks of its k_j-th largest |x|
            A = np.zeros(n)
            for lo, hi, k in comp.segments(n):
                A[lo:hi] = sum(np.partition(np.abs(x[lo:hi]), hi - lo - k)[hi - lo - k] for x in xs)
        elif isinstance(comp, zcoll.Threshold):
            A = p * comp.value
        else:
            A = M
        b = A + p * M * 2.0**-23
    return b / p if op == "avg" else b
