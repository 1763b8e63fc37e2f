"""DDP communication hooks over zcoll (zcoll.torch.hooks, bucket_state, momentum) on 2 ranks, a few
cases on 3: every zcoll compressor (tests/torch_mpi/compression.py), and compressed training that
keeps its accuracy (tests/torch_mpi/accuracy.py: error feedback across DDP's bucket rebuild,
momentum correction, checkpoints, refusals). Accuracy on digits: tests/bench/test_accuracy.py."""

import pytest
from mpi_util import case_names, script_job

ON_THREE = ["int8_quantizer", "topk", "warmup_is_exactly_uncompressed"]
# checks each accuracy case makes today (a script that silently stops checking fails)
MIN_CHECKS = {"error_feedback_carries_across_rebuild": 7, "momentum_is_masked_where_sent": 4, "refusals": 6}


@pytest.mark.parametrize("case", case_names("torch_mpi/compression.py"))
def test_compression_two_ranks(case):
    script_job("torch_mpi/compression.py", 2).check(case)


@pytest.mark.parametrize("case", ON_THREE)
def test_compression_three_ranks(case):
    script_job("torch_mpi/compression.py", 3, *ON_THREE).check(case)


@pytest.mark.parametrize("case", case_names("torch_mpi/accuracy.py"))
def test_accuracy_two_ranks(case):
    script_job("torch_mpi/accuracy.py", 2, timeout=300).check(case, min_checks=MIN_CHECKS.get(case, 1))
