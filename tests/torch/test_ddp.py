"""DDP on the zcoll backend (tests/torch_mpi/ddp.py): hooks and the built-in path against a
single-process reference, identical parameters on every rank, gradient accumulation equal to
the large-batch step and N times fewer bytes."""

import pytest
from mpi_util import case_names, script_job

ON_THREE = ["ddp_builtin_allreduce", "ddp_allreduce_hook", "gradient_accumulation_adam_equals_large_batch"]


@pytest.mark.parametrize("case", case_names("torch_mpi/ddp.py"))
def test_ddp_two_ranks(case):
    script_job("torch_mpi/ddp.py", 2).check(case)


@pytest.mark.parametrize("case", ON_THREE)
def test_ddp_three_ranks(case):
    script_job("torch_mpi/ddp.py", 3, *ON_THREE).check(case)
