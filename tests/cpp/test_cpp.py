"""The C++ tests (tests/cpp): every algorithm of every collective on 1..8 thread-ranks over the
in-process transport, against plain-loop references. The pip build compiles them into
`zcoll_cpp_tests` beside the benchmark binaries; here each test group runs as one pytest test
(under a timeout that kills the process), failing with the program's output. Where the pip build's
tree is at hand (build/<wheel tag>, as `./dev.sh` leaves it), a group runs through its CTest test
(`cpp.<group>`), so CI (`./dev.sh test`) runs the CTest target; elsewhere the installed program.

Without pytest: `zcoll_cpp_tests [PATTERN...]`, or `ctest` in a CMake build directory
(see CMakeLists.txt).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from mpi_util import BIN_DIR, OPEN_MPI, ROOT, run

BINARY = BIN_DIR / "zcoll_cpp_tests"
TIMEOUT = 300  # seconds per group; the whole program takes 20-60 s on 2 busy cores
# ctest -V prefixes each line of a test's output with the test's number
SUMMARY = re.compile(
    r"^(?:\d+: )?zcoll_cpp_tests: (\d+) tests, (\d+) checks, (\d+) failed checks in (\d+) tests", re.M
)
# the tree of the engine this environment runs (./dev.sh --engine openmpi builds in build/ompi-*)
_BUILD_GLOB = "build/ompi-cp*" if OPEN_MPI else "build/cp*"
CTEST_DIR = next((d for d in sorted(ROOT.glob(_BUILD_GLOB)) if (d / "CTestTestfile.cmake").exists()), None)


def group_command(group: str) -> list:
    """The group's CTest test in the pip build's tree, or the installed program."""
    if CTEST_DIR is not None and shutil.which("ctest"):
        return ["ctest", "--test-dir", str(CTEST_DIR), "-R", f"^cpp\\.{group}$", "-V", "--no-tests=error",
                "--timeout", str(TIMEOUT)]  # fmt: skip
    return [str(BINARY), f"{group}.*"]


def groups() -> list:
    """The test groups the installed program has (the part of each test name before the dot)."""
    if not BINARY.exists():
        return ["(zcoll_cpp_tests missing)"]
    listed = subprocess.run([BINARY, "--list"], capture_output=True, text=True, timeout=60, check=True).stdout
    return sorted({name.split(".")[0] for name in listed.split()})


@pytest.mark.parametrize("group", groups())
def test_cpp_group(group):
    assert BINARY.exists(), (
        f"{BINARY} is not installed: the pip build builds it (ZCOLL_BUILD_CPP_TESTS in pyproject.toml)"
    )
    command = group_command(group)
    rc, out = run(command, timeout=TIMEOUT + 30)
    assert rc == 0, f"{' '.join(command)} exited {rc}:\n{out}"
    m = SUMMARY.search(out)
    assert m, f"no summary line in the output:\n{out}"
    tests, checks, failed_checks, failed_tests = map(int, m.groups())
    assert tests >= 1 and checks >= tests and failed_checks == 0 and failed_tests == 0, out


def test_failures_are_reported():
    """A failing check exits 1 naming file:line, the expression, both values and the context; a
    rank's exception names the rank; a pattern matching nothing fails (a typo is no success)."""
    assert BINARY.exists()
    rc, out = run([BINARY, "selftest.*"], timeout=60)
    assert rc == 1, out
    assert re.search(r"test_selftest\.cc:\d+: CHECK\(one == 2\) failed: 1 vs 2", out), out
    assert re.search(r"test_selftest\.cc:\d+: CHECK_THROWS\(.*\) failed: no exception", out), out
    assert re.search(r"test_selftest\.cc:\d+: the context: CHECK\(one == 3\) failed", out), out
    assert re.search(r"test_selftest\.cc:\d+: on 3 ranks: rank 1 of 3: rank 1 fails on purpose", out), out
    assert "selftest." not in subprocess.run([BINARY, "--list"], capture_output=True, text=True).stdout
    rc, out = run([BINARY, "no_such_group.*"], timeout=60)
    assert rc == 1 and "no test matches" in out, out
