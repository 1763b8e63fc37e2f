"""zcoll.compression.error_bounds: a compressed result is held to its compressor's documented
error bound plus one rounding to the output dtype (the soak's and tests/mpi/compressed_allreduce.py's
check)."""

import numpy as np
import pytest
import zcoll
from zcoll.compression.error_bounds import beyond_bound, error_bound


@pytest.mark.parametrize(
    "comp",
    [
        zcoll.GradientQuantizer(8, error_feedback=False),
        zcoll.TopK(0.1, error_feedback=False),
        zcoll.HalfPrecision("bf16"),
        zcoll.Threshold(0.5, error_feedback=False),
    ],
    ids=repr,
)
def test_checker_holds_compressed_results_to_the_bound(comp):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(1000) for _ in range(3)]
    exact = np.sum(xs, axis=0)
    assert beyond_bound(exact, xs, comp, "sum", "float32") is None
    bound = error_bound(comp, xs, exact, "sum")
    off = exact.copy()
    off[500] += 2 * bound[500] + 1e-3
    assert "1 of 1000 elements beyond the error bound; at 500" in beyond_bound(
        off, xs, comp, "sum", "float32"
    )


def test_checker_allows_rounding_to_a_float16_subnormal():
    """A float16 result is rounded by up to half a subnormal spacing (2^-25) below the normal
    range, whatever its relative error (the soak once flagged 1.07e-8 rounded to 0)."""
    comp = zcoll.HalfPrecision("bf16")
    xs = [np.array([1.07e-8, 3.0e-7])]
    y = np.array(xs[0], np.float16).astype(np.float64)  # 0 and the nearest multiple of 2^-24
    assert beyond_bound(y, xs, comp, "sum", "float16") is None
    off = y.copy()
    off[1] += 2.0**-23  # two subnormal steps away: beyond
    assert "1 of 2 elements beyond the error bound; at 1" in beyond_bound(off, xs, comp, "sum", "float16")
