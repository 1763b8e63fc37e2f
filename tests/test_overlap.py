"""Overlapping input and output on every collective (tests/mpi/overlap.py): refused with a
ValueError on every rank before any traffic, or run in place where the collective names that
position; numpy, torch, and the two mixed. On 2 ranks and on 3 (uneven reduce_scatter blocks)."""

import pytest
from mpi_util import case_names, script_job


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("case", case_names("mpi/overlap.py"))
def test_overlap(nprocs, case):
    script_job("mpi/overlap.py", nprocs, timeout=240).check(case, min_checks=3)
