"""The "zcoll" torch.distributed backend under a real mpirun: every collective, op and dtype
(tests/torch_mpi/collectives.py, one launch per world size), the ways to start it, and the
errors when it cannot start (tests/torch_mpi/startup.py)."""

import sys

import pytest
from mpi_util import BIN_DIR, TESTS_DIR, case_names, parse_cases, run, script_job, tail

STARTUP = {"plain": 3, "helper": 3, "gloo_local": 2, "gloo_hook": 2}  # case: ranks (torchrun apart)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("case", case_names("torch_mpi/collectives.py"))
def test_collectives(case, ranks):
    script_job("torch_mpi/collectives.py", ranks).check(case)


@pytest.mark.parametrize("case", list(STARTUP))
def test_startup_under_mpirun(case):
    ranks = STARTUP[case]
    same_ranks = [c for c in STARTUP if STARTUP[c] == ranks]
    script_job("torch_mpi/startup.py", ranks, *same_ranks, timeout=120).check(case)


def test_torchrun_is_refused_with_a_clear_error():
    torchrun = BIN_DIR / "torchrun"
    assert torchrun.exists(), "torchrun is installed with torch"
    rc, out = run(
        [torchrun, "--standalone", "--nproc_per_node", "2", TESTS_DIR / "torch_mpi/startup.py", "torchrun"],
        timeout=120,
    )
    reports = parse_cases(out).get("torchrun", [])
    # each torchrun process is an MPI world of its own and reports the case itself
    assert [r.status for r in reports] == ["PASS", "PASS"] and rc == 0, tail(out)


def test_import_zcoll_leaves_torch_and_mpi_alone():
    code = (
        "import sys, zcoll; assert 'torch' not in sys.modules, 'zcoll imported torch'; "
        "import zcoll.torch; assert not zcoll._C.mpi_initialized(), 'zcoll.torch started MPI'; "
        "import torch.distributed as dist; assert dist.Backend.ZCOLL == 'zcoll'; print('IMPORT-OK')"
    )
    rc, out = run([sys.executable, "-c", code], timeout=60)
    assert rc == 0 and "IMPORT-OK" in out, out
