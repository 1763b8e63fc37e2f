"""zcoll.torch._launch: the ways to start the "zcoll" backend under mpirun
(tests/torch_mpi/startup.py) and the process-local store that fails fast on a missing key.
Under torchrun: tests/torch/test_torchrun.py."""

import pytest
import zcoll.torch
from mpi_util import script_job

STARTUP = {"plain": 3, "helper": 3, "gloo_local": 2, "gloo_hook": 2}  # case: ranks


@pytest.mark.parametrize("case", list(STARTUP))
def test_startup_under_mpirun(case):
    ranks = STARTUP[case]
    same_ranks = [c for c in STARTUP if STARTUP[c] == ranks]
    script_job("torch_mpi/startup.py", ranks, *same_ranks, timeout=120).check(case)


def test_process_local_store_fails_fast_on_missing_keys():
    s = zcoll.torch.ProcessLocalStore()
    s.set("a", b"1")
    assert s.get("a") == b"1" and s.add("n", 2) == 2 and s.add("n", 3) == 5 and s.check(["a"])
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        s.get("missing")
    with pytest.raises(RuntimeError, match="never set"):
        s.wait(["missing"])
