"""bench/smpi_scale.py as a program: --help, and the CI smoke test of the SimGrid SMPI build, one
64-rank simulation (8 nodes x 8 ranks on a non-blocking switch) of every allreduce algorithm
(--quick), which fails when an algorithm is missing or the ring's bus bandwidth at 4 MiB is not
60-100% of the simulated link. The SMPI build (build/pytest-smpi, only zcoll_allreduce_perf,
unoptimised) is made here, incrementally when present; docs/scale.md has the full sweep."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from mpi_util import run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "smpi_scale.py"
# Not build/smpi, the optimised tree of docs/scale.md's sweeps: this one is unoptimised. The
# simulation runs with smpi/simulate-computation:no (bench/smpi_scale.py), so the host code's speed
# changes no simulated time, and -O0 compiles the core in about 2/3 of -O3's CPU time.
BUILD = ROOT / "build" / "pytest-smpi"
UNOPTIMISED = ["-DCMAKE_BUILD_TYPE=Debug", "-DCMAKE_CXX_FLAGS_DEBUG=-O0"]


def test_help():
    rc, out = run([sys.executable, SCRIPT, "--help"], timeout=60)
    assert rc == 0, out
    for flag in (
        "--quick",
        "--diagnose",
        "--report",
        "--scales",
        "--platforms",
        "--selectors",
        "--split-from",
    ):
        assert flag in out, f"{flag} missing from --help:\n{out}"


@pytest.fixture(scope="module")
def smpi_binary() -> Path:
    if shutil.which("smpirun") is None:
        pytest.skip("SimGrid's SMPI is not installed: apt-get install libsimgrid-dev (.ci/run installs it)")
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (BUILD / "Makefile").exists() else []
    rc, out = run(["cmake", "-S", ROOT, "-B", BUILD, *gen, "-DZCOLL_SMPI=ON", *UNOPTIMISED], timeout=300)
    assert rc == 0, out
    rc, out = run(["cmake", "--build", BUILD, "--target", "zcoll_allreduce_perf"], timeout=1200)
    assert rc == 0, out[-4000:]
    return BUILD / "zcoll_allreduce_perf"


def test_quick_simulation_of_64_ranks(smpi_binary):
    rc, out = run([sys.executable, SCRIPT, "--quick", "--binary", smpi_binary], timeout=600)
    assert rc == 0, out
    assert "64 ranks simulated" in out, out
    for algorithm in ("ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical"):
        assert algorithm in out, out


def test_report_two_tier_model_against_recorded_simulations(tmp_path):
    """--report on the recorded sweep (docs/scale.csv): the two-tier cost model (per-tier alpha
    and beta, contention counted from the platform's routes) must stay within a median 10% of
    the simulated times, and below the one-tier formulas' error; auto's table must be there, with
    the platform's probe within 10% of the best in at least as many cells as without."""
    rc, out = run(
        [sys.executable, SCRIPT, "--report", "--plots", tmp_path, "--csv", ROOT / "docs" / "scale.csv"],
        timeout=300,
    )
    assert rc == 0, out
    medians = {}
    for line in out.splitlines():
        if line.startswith(("one-tier:", "two-tier:")):
            medians[line.split(":")[0]] = float(line.rsplit(" ", 1)[1].rstrip("%"))
    assert set(medians) == {"one-tier", "two-tier"}, out
    assert medians["two-tier"] <= 10, out
    assert medians["two-tier"] < medians["one-tier"] / 4, out
    counts = {}
    for line in out.splitlines():
        if line.startswith("auto ") and " within 10% of the best in " in line:
            within, _, cells, _ = line.rsplit(" ", 4)[1:]
            counts["probe" if "probe (" in line else "none"] = (int(within), int(cells))
    assert set(counts) == {"none", "probe"}, out
    # auto given the platform's probe (its node/link ratio and ring gain) is never further behind
    assert counts["probe"][1] == counts["none"][1] and counts["probe"][0] >= counts["none"][0], counts
