"""DDP compression hooks with every zcoll compressor (tests/torch_mpi/compression.py): every case
on 2 ranks, a few on 3."""

import pytest
from mpi_util import case_names, script_job

ON_THREE = ["int8_quantizer", "topk", "warmup_is_exactly_uncompressed"]


@pytest.mark.parametrize("case", case_names("torch_mpi/compression.py"))
def test_compression_two_ranks(case):
    script_job("torch_mpi/compression.py", 2).check(case)


@pytest.mark.parametrize("case", ON_THREE)
def test_compression_three_ranks(case):
    script_job("torch_mpi/compression.py", 3, *ON_THREE).check(case)
