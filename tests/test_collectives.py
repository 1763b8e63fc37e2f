"""Every collective x algorithm x dtype x op under a real mpirun with 1, 2, 3 and 4 ranks.

The cases, their inputs and references live in tests/mpi/collectives.py (one launch per world
size and collective, all cases batched); a failure lists every failing case by collective,
algorithm, dtype, op, count, root, placement and pipeline setting, prefixed by rank.
"""

from __future__ import annotations

import pytest
from mpi_util import run_script, summary_count

WORLD_SIZES = [1, 2, 3, 4]
# Fewest cases each launch must report (guards against a script that silently checks nothing).
MIN_CASES = {
    "allreduce": 2500,
    "reduce_scatter": 800,
    "reduce": 800,
    "allgather": 250,
    "broadcast": 90,
    "barrier": 3,
}
TORCH_COLLECTIVES = ["allreduce", "reduce_scatter", "reduce", "allgather", "broadcast"]


@pytest.mark.parametrize("collective", list(MIN_CASES))
@pytest.mark.parametrize("nprocs", WORLD_SIZES)
def test_numpy_arrays(nprocs, collective):
    """All dtypes numpy has, every algorithm and op, in place and out of place."""
    out = run_script("collectives.py", nprocs, collective)
    assert summary_count(out, f"collectives numpy {collective}") >= MIN_CASES[collective]


@pytest.mark.parametrize("nprocs", WORLD_SIZES)
def test_torch_tensors(nprocs):
    """bfloat16 (which numpy lacks) and float16 as torch tensors through every collective."""
    out = run_script("collectives.py", nprocs, "--torch", *TORCH_COLLECTIVES, timeout=240)
    assert summary_count(out, f"collectives torch {' '.join(TORCH_COLLECTIVES)}") >= 1500
