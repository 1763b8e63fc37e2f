"""DDP compression hooks with every zcoll compressor (tests/torch_mpi/compression.py).

These need the compression API being built in parallel: ``comm.allreduce(x, op="avg",
compression=compressor, key=...)`` and ``zcoll.GradientQuantizer``, ``TopK``, ``RandomK``,
``Threshold``, ``HalfPrecision``. Until it lands they fail (AttributeError for the missing
classes, TypeError for the missing ``compression=`` argument); they are kept apart so that the
rest of the PyTorch tests stay green.
"""

import pytest
from torch_util import CaseResults, case_names

ON_THREE = ["int8_quantizer", "topk", "warmup_is_exactly_uncompressed"]
RUNS = {2: CaseResults("compression.py", 2), 3: CaseResults("compression.py", 3, *ON_THREE)}


@pytest.mark.parametrize("case", case_names("compression.py"))
def test_compression_two_ranks(case):
    RUNS[2].check(case)


@pytest.mark.parametrize("case", ON_THREE)
def test_compression_three_ranks(case):
    RUNS[3].check(case)
