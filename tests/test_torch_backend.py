"""The "zcoll" torch.distributed backend under a real mpirun: every collective, op and dtype
(tests/torch_mpi/collectives.py, one launch per world size), the ways to start it, and the
errors when it cannot start."""

import shutil
import sys
from pathlib import Path

import pytest
from torch_util import SCRIPTS, CaseResults, case_names, mpirun, run

COLLECTIVES = {n: CaseResults("collectives.py", n) for n in (2, 3)}


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("case", case_names("collectives.py"))
def test_collectives(case, ranks):
    COLLECTIVES[ranks].check(case)


@pytest.mark.parametrize("mode,ranks", [("plain", 3), ("helper", 3), ("gloo_local", 2), ("gloo_hook", 2)])
def test_startup_under_mpirun(mode, ranks):
    res = mpirun("startup.py", ranks, mode, timeout=120)
    assert res.stdout.count(f"STARTUP-OK {mode}") == ranks, res.stdout[-5000:]


def test_torchrun_is_refused_with_a_clear_error():
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun is installed with torch"
    res = run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(SCRIPTS / "startup.py"), "torchrun"],
        timeout=120,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert res.stdout.count("STARTUP-OK torchrun") == 2, res.stdout[-5000:]


def test_import_zcoll_leaves_torch_and_mpi_alone():
    code = (
        "import sys, zcoll; assert 'torch' not in sys.modules, 'zcoll imported torch'; "
        "import zcoll.torch; assert not zcoll._C.mpi_initialized(), 'zcoll.torch started MPI'; "
        "import torch.distributed as dist; assert dist.Backend.ZCOLL == 'zcoll'; print('IMPORT-OK')"
    )
    res = run([sys.executable, "-c", code], timeout=60)
    assert "IMPORT-OK" in res.stdout, res.stdout
