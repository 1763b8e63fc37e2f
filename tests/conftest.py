"""Lines in the summary: what the mpirun scripts checked, why tests skipped (one line per reason
with its count, which `-rs`'s line per test would bury), and with `--file-durations=N` the N
test files that took longest. (tests/ is on the module path through pyproject.toml's
`pythonpath`, so every test imports the helpers here: mpi_util, harness, ...)"""

from collections import Counter, defaultdict

from mpi_util import protocol_totals

REASON_CHARS = 150

_skips: Counter = Counter()
_file_seconds: defaultdict = defaultdict(float)


def pytest_addoption(parser):
    parser.addoption(
        "--file-durations",
        type=int,
        default=0,
        metavar="N",
        help="list the N test files that took longest (setup, call and teardown summed; 0: none)",
    )


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = " ".join(reason.removeprefix("Skipped: ").split())
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."


def pytest_runtest_logreport(report):
    _file_seconds[report.nodeid.split("::")[0]] += report.duration
    if report.skipped and not hasattr(report, "wasxfail"):
        _skips[_skip_reason(report)] += 1


def pytest_terminal_summary(terminalreporter, config):
    jobs, cases, checks = protocol_totals()
    if jobs:
        terminalreporter.write_line(f"mpirun scripts: {jobs} launches, {cases} cases, {checks} checks")
    if _skips:
        terminalreporter.write_line(f"skipped {sum(_skips.values())}, by reason:")
        # every reason, so a CI log shows that no test skipped for a missing torch or MPI
        for reason, n in _skips.most_common():
            terminalreporter.write_line(f"{n:5d}  {reason}")
    shown = config.getoption("file_durations")
    if shown and _file_seconds:
        terminalreporter.write_line(f"slowest {shown} test files (seconds):")
        for path, seconds in sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:shown]:
            terminalreporter.write_line(f"{seconds:8.1f}  {path}")
