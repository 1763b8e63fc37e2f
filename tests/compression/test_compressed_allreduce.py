"""Compressed allreduce on 1..4 ranks under mpirun (tests/mpi/compressed_allreduce.py): every
compressor's results bitwise identical on every rank and within its error bound, error feedback,
non-finite inputs. The benchmark's -z rows: tests/bench/test_perf_binaries.py."""

from __future__ import annotations

import pytest
from mpi_util import case_names, script_job

# Fewest checks each case must report, about 90% of what it makes today: a script that silently
# stops checking fails.
MIN_CHECKS = {"identical": 1700, "feedback": 17, "nonfinite": 110}


@pytest.mark.parametrize("case", case_names("mpi/compressed_allreduce.py"))
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_compressed_allreduce(nprocs, case):
    script_job("mpi/compressed_allreduce.py", nprocs, timeout=400).check(case, MIN_CHECKS[case])
