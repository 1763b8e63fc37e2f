"""bench/monitor_overhead.py and bench/monitor_testbed.py as programs: their --help (the runs
themselves are long or need root; their output is quoted in docs/monitor.md)."""

from __future__ import annotations

import sys

import pytest
from mpi_util import ROOT, run


@pytest.mark.parametrize(
    "script,words", [("monitor_overhead.py", "interleaved"), ("monitor_testbed.py", "slow link")]
)
def test_help(script, words):
    rc, out = run([sys.executable, str(ROOT / "bench" / script), "--help"], timeout=60)
    assert rc == 0 and words in out, out
