"""A line in the summary on what the mpirun scripts checked. (tests/ is on the module path through
pyproject.toml's `pythonpath`, so every test imports the helpers here: mpi_util, harness, ...)"""

from mpi_util import protocol_totals


def pytest_terminal_summary(terminalreporter):
    jobs, cases, checks = protocol_totals()
    if jobs:
        terminalreporter.write_line(f"mpirun scripts: {jobs} launches, {cases} cases, {checks} checks")
