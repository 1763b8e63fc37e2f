"""Compressed training that keeps its accuracy (tests/torch_mpi/accuracy.py) on 2 ranks: error
feedback across DDP's bucket rebuild, momentum correction, checkpoints, digits accuracy."""

import sys

import pytest
from mpi_util import ROOT, case_names, run, script_job

# checks each case makes today (a script that silently stops checking fails)
MIN_CHECKS = {"error_feedback_carries_across_rebuild": 7, "momentum_is_masked_where_sent": 4, "refusals": 6}


@pytest.mark.parametrize("case", case_names("torch_mpi/accuracy.py"))
def test_accuracy_two_ranks(case):
    script_job("torch_mpi/accuracy.py", 2, timeout=300).check(case, min_checks=MIN_CHECKS.get(case, 1))


def test_accuracy_bench_help():
    rc, out = run([sys.executable, ROOT / "bench/accuracy.py", "--help"], timeout=60)
    assert rc == 0 and "usage:" in out and "--warmup" in out, out
