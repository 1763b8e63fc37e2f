"""The dtype walk (tests/torch_mpi/dtype_walk.py): zcoll beside gloo on the same 2 and 3 ranks,
every torch dtype x broadcast, all_gather, all_gather_into_tensor and, with every ReduceOp,
reduce_scatter_tensor, all_reduce and reduce: where gloo succeeds zcoll gives the same bytes
(floating sums on 3 ranks: the exact result; bool SUM: the same truth values, as a logical or),
where gloo raises zcoll raises; and a DDP transformer with a bool causal-mask buffer trains on
zcoll to gloo's parameters. One launch per world size."""

import pytest
from mpi_util import case_names, script_job

SCRIPT = "torch_mpi/dtype_walk.py"
# Fewest checks per case (about 90% of what 2 ranks make), so a walk that stops short fails.
MIN_CHECKS = {
    "broadcast": 200,
    "all_gather": 125,
    "all_gather_into_tensor": 100,
    "reduce_scatter_tensor": 850,
    "all_reduce": 850,
    "reduce": 1600,
    "ddp_bool_buffer": 5,
    "summary": 8,
}


def test_every_case_has_a_minimum():
    assert list(MIN_CHECKS) == case_names(SCRIPT)


@pytest.mark.parametrize("case", list(MIN_CHECKS))
@pytest.mark.parametrize("ranks", [2, 3])
def test_dtype_walk(ranks, case):
    script_job(SCRIPT, ranks, timeout=400).check(case, MIN_CHECKS[case])
