"""PyTorch's own distributed test suite (distributed_test.py of torch 2.13) against the zcoll
backend, at 3 ranks under mpirun, each MPI process one rank (tests/torch_mpi/dist_suite.py).

One pytest item per torch test: passes when the test passed on every rank; skips when torch
skipped it (its reason: CUDA, NCCL, ...); an xfail when it fails and tests/torch_dist_policy.py
lists it in EXCLUDED with the reason. Any other failure fails, and so does a test in EXCLUDED
that passes (remove it from the list) or a test in MUST_RUN that skipped.
"""

import re
from typing import Dict

import pytest
import torch_dist_policy as policy
from mpi_util import script_job
from zcoll.tools.perf_table import split_ranks

pytest.importorskip("expecttest", reason="torch's test utilities need expecttest: pip install expecttest")

RANKS = 3
SCRIPT = "torch_mpi/dist_suite.py"
NAMES = policy.test_names()
# At least this many tests pass; a drop fails the summary.
MIN_PASSED = 122  # 122 of 285 at 3 ranks on a CPU-only torch 2.13 (4 excluded, 159 skipped by torch)
_SKIP = re.compile(r"^ZCOLL-TORCH-SKIP (\S+) rank (\d+): (.*)$", re.MULTILINE)


def _job():
    return script_job(SCRIPT, RANKS, timeout=900)


def _skips(job) -> Dict[str, str]:
    """test name -> the skip reason torch gave (on rank 0, else the first rank that skipped);
    read once per job."""
    if getattr(job, "torch_skips", None) is None:
        found: Dict[str, str] = {}
        ranks = split_ranks(job.finished.output)
        for _, text in sorted(ranks.items(), key=lambda kv: (kv[0] is None, kv[0])):
            for m in _SKIP.finditer(text):
                found.setdefault(m.group(1), m.group(3))
        job.torch_skips = found
    return job.torch_skips


@pytest.mark.parametrize("name", NAMES)
def test_torch_distributed(name):
    job = _job()
    job.launch()
    skipped = _skips(job).get(name)
    if name in policy.EXCLUDED:
        if _passed(job, name) and skipped is None:
            pytest.fail(f"{name} passes now: remove it from EXCLUDED in tests/torch_dist_policy.py")
        pytest.xfail(policy.EXCLUDED[name])
    job.check(name)
    if skipped is not None:
        if name in policy.MUST_RUN:
            pytest.fail(f"{name} must run on zcoll, but torch skipped it: {skipped}")
        pytest.skip(f"torch skips it: {skipped}")


def _passed(job, name: str) -> bool:
    reports = job.cases.get(name)
    return bool(reports) and all(r.status == "PASS" for r in reports)


def test_torch_distributed_summary():
    """Enough passes, every MUST_RUN test among them, the exclusion list naming real tests."""
    job = _job()
    job.launch()
    skips = _skips(job)
    passed = [n for n in NAMES if _passed(job, n) and n not in skips]
    unknown = sorted(set(policy.EXCLUDED) - set(NAMES))
    assert not unknown, f"EXCLUDED names tests torch does not have: {unknown}"
    missing = [n for n in policy.MUST_RUN if n not in passed]
    assert not missing, f"tests that must pass on zcoll did not: {missing}"
    assert len(passed) >= MIN_PASSED, f"{len(passed)} of torch's tests passed, expected at least {MIN_PASSED}"
