"""Counts above 2^31 elements (tests/mpi/large_counts.py): every collective and every allreduce
algorithm on 2^31 + 5 int8 elements (MPI's int counts end at 2^31 - 1), 2 ranks, one job per
case so that a job holds one 2 GiB buffer per rank; every element checked.

These need about 2.2 GiB per rank and take 20-40 s each on the shared 2-core machine (the
collective 7-10 s, filling and checking 2 GiB the rest), so they are marked `large_count` and
left out of a plain run (pyproject's addopts): run all twelve with
`./dev.sh test -m large_count tests/core/test_large_counts.py` (about 6 minutes). Three stay in every
run (about 1.5 minutes): `auto` (what users get) and `mpi` (MPI_Allreduce in chunks of 2^30
elements), in place and out of place. Without enough free memory they skip, saying how much
they need.

The sparse compressors index with uint32: at 2^32 elements they refuse, which is cheap to check
(the arrays are never touched, so no memory is used) and runs here always.
"""

from pathlib import Path

import numpy as np
import pytest
import zcoll
from mpi_util import case_names, script_job

SCRIPT = "mpi/large_counts.py"
EVERY_RUN = {"allreduce_auto", "allreduce_mpi", "allreduce_mpi_out_of_place"}
NEEDS_GIB = 6.0  # two ranks of 2 GiB and their scratch, with room for the rest of the machine


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


@pytest.mark.parametrize(
    "case",
    [c if c in EVERY_RUN else pytest.param(c, marks=pytest.mark.large_count) for c in case_names(SCRIPT)],
)
def test_count_above_int_max(case):
    if available_gib() < NEEDS_GIB:
        pytest.skip(
            f"needs {NEEDS_GIB} GiB of free memory for two ranks of 2^31 + 5 elements; "
            f"this machine has {available_gib():.1f} GiB available"
        )
    script_job(SCRIPT, 2, case, timeout=600).check(case, min_checks=2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: zcoll.TopK(0.01, error_feedback=False),
        lambda: zcoll.Threshold(1.0, error_feedback=False),
        lambda: zcoll.RandomK(0.01, error_feedback=False),
    ],
    ids=["topk", "threshold", "randomk"],
)
def test_sparse_compressors_refuse_2_to_the_32(make):
    c = make()
    x = np.empty(2**32, np.float16)  # 8 GiB of address space; refused before any of it is touched
    with zcoll.Communicator() as comm, pytest.raises(ValueError, match="uint32"):
        comm.allreduce(x, out=x, compression=c)
    with pytest.raises(ValueError, match="uint32"):
        c.compress(x)
