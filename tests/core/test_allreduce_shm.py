"""The shm allreduce's single copy (csrc/collectives/allreduce_shm.cc: from 256 KiB other ranks'
buffers read with process_vm_readv, results written into theirs with process_vm_writev) under a
real mpirun on 2, 3 and 4 ranks, against numpy, and the staged path it falls back to
(ZCOLL_SHM_SINGLE_COPY=0) on the same cases. The gather used where writes are refused is tested
in tests/cpp (allreduce.shm_single_copy_gathered). The cases live in tests/mpi/allreduce_shm.py;
every launch has a timeout."""

from __future__ import annotations

import pytest
from mpi_util import case_names, script_job

SCRIPT = "mpi/allreduce_shm.py"
MIN_CHECKS = {
    "exact_against_numpy": 34,
    "single_copy_ran": 2,
    "sizes_around_the_threshold": 10,
    "streamed_results": 10,
}


@pytest.mark.parametrize("case", case_names(SCRIPT))
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_single_copy(nprocs, case):
    script_job(SCRIPT, nprocs, timeout=180).check(case, MIN_CHECKS[case])


@pytest.mark.parametrize("case", case_names(SCRIPT))
def test_staged_fallback(case):
    script_job(SCRIPT, 2, env={"ZCOLL_SHM_SINGLE_COPY": "0"}, timeout=180).check(case, MIN_CHECKS[case])
