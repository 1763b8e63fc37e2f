"""bool, complex32/64/128 and the bitwise ops (band, bor, bxor) through every collective and
algorithm under a real mpirun with 1, 2, 3 and 4 ranks, against numpy (tests/mpi/dtypes.py:
the cases, their inputs and references), one launch per world size."""

from __future__ import annotations

import pytest
from mpi_util import case_names, script_job

WORLD_SIZES = [1, 2, 3, 4]
# Fewest checks each case must report at any world size, about 90% of what it makes today.
MIN_CHECKS = {
    "allreduce": 5400,
    "reduce_scatter": 165,
    "reduce": 165,
    "allgather": 43,
    "broadcast": 43,
    "refused": 100,
    "torch_tensors": 300,
}


def test_every_case_has_a_minimum():
    assert sorted(MIN_CHECKS) == sorted(case_names("mpi/dtypes.py"))


@pytest.mark.parametrize("case", list(MIN_CHECKS))
@pytest.mark.parametrize("nprocs", WORLD_SIZES)
def test_dtypes(nprocs, case):
    script_job("mpi/dtypes.py", nprocs, timeout=300).check(case, MIN_CHECKS[case])
