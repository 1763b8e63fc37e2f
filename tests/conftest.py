"""bench/ on sys.path (tests read zcoll_*_perf output with bench/perf_table.py, as bench/ does),
and a line in the summary on what the mpirun scripts checked."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def pytest_terminal_summary(terminalreporter):
    from mpi_util import protocol_totals

    jobs, cases, checks = protocol_totals()
    if jobs:
        terminalreporter.write_line(f"mpirun scripts: {jobs} launches, {cases} cases, {checks} checks")
