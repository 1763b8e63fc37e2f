"""The "zcoll" torch.distributed backend (zcoll.torch.backend) under a real mpirun: every
collective, op and dtype (tests/torch_mpi/collectives.py, one launch per world size), and that
importing zcoll leaves torch and MPI alone. The ways to start it: test_launch.py; torch's own
distributed tests: test_dist_suite.py."""

import sys

import pytest
from mpi_util import case_names, run, script_job


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("case", case_names("torch_mpi/collectives.py"))
def test_collectives(case, ranks):
    script_job("torch_mpi/collectives.py", ranks).check(case)


def test_import_zcoll_leaves_torch_and_mpi_alone():
    code = (
        "import sys, zcoll; assert 'torch' not in sys.modules, 'zcoll imported torch'; "
        "import zcoll.torch; assert not zcoll._C.mpi_initialized(), 'zcoll.torch started MPI'; "
        "import torch.distributed as dist; assert dist.Backend.ZCOLL == 'zcoll'; print('IMPORT-OK')"
    )
    rc, out = run([sys.executable, "-c", code], timeout=60)
    assert rc == 0 and "IMPORT-OK" in out, out
