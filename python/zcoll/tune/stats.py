"""Timings over ranks and their robust middle: what every decision of ``auto`` is made from, so
that every rank makes it from the same numbers."""

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np


def interquartile_mean(times: Sequence[float]) -> float:
    """The mean of the middle half of a bucket's trial calls: what it predicts is a sum of calls
    over a check interval. A first-ready bucket's calls are bimodal on shared cores (0.4-0.8
    or 2.5-4 ms for the transformer on 2 ranks, as the rest of the backward pass runs or not),
    and the median of 8 of them lands in either mode (predicted 0.58 ms, measured ~2 ms a call);
    the middle half's mean weighs both modes and still drops a pause's outlier."""
    t = np.sort(np.asarray(times, dtype=np.float64))
    cut = t.size // 4
    return float(t[cut : t.size - cut].mean())


def over_ranks(comm: Any, lists: Sequence[Sequence[float]], op: str) -> List[List[float]]:
    """Element by element, the least ("min") or greatest ("max") over ranks of lists of timings
    (one allreduce; the lists may be ragged or empty: padding takes no part)."""
    width = max([len(x) for x in lists] + [0])
    width = int(comm.allreduce(np.array([width], np.float64), op="max")[0])
    pad = 1e300 if op == "min" else -1e300
    grid = np.full((len(lists), width), pad)
    for i, x in enumerate(lists):
        grid[i, : len(x)] = x
    grid = comm.allreduce(grid.reshape(-1), op=op).reshape(len(lists), width)
    return [[float(v) for v in row if abs(v) < 1e299] for row in grid]


def as_array(x: Any) -> np.ndarray:
    """A float32 numpy view of a CPU tensor or array (the same memory)."""
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)
