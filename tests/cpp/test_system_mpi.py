"""The core and the benchmark binaries build against a system MPI found by CMake's FindMPI
(Debian's Open MPI here), not only against the PyPI MPICH wheel, and run correctly on it."""

import os
import shutil
from pathlib import Path

import pytest
from mpi_util import ROOT, run
from zcoll.tools import perf_table

MPICXX = shutil.which("mpicxx.openmpi")
MPIRUN = shutil.which("mpirun.openmpi")

pytestmark = pytest.mark.skipif(
    MPICXX is None or MPIRUN is None,
    reason="no system Open MPI: mpicxx.openmpi or mpirun.openmpi not on PATH "
    "(apt-get install libopenmpi-dev openmpi-bin)",
)


def _clean_env() -> dict:
    """The venv left out (its MPICH must not leak into the system-MPI build): its variables unset."""
    env = {k: None for k in os.environ if k.startswith(("VIRTUAL_ENV", "MPI", "PYTHON"))}
    env.update(
        PATH="/usr/local/bin:/usr/bin:/bin",
        MPIR_CVAR_DEVICE_COLLECTIVES=None,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    return env


# Only what the tests run: zcoll_kernels_perf (no MPI at run time) would add ~6.5 s of compiling.
BINARIES = [f"zcoll_{b}_perf" for b in ("allreduce", "reduce_scatter", "allgather", "broadcast")]
# Unoptimised: this build checks FindMPI and results on another MPI, which the optimiser does not
# change, and -O3 compiles the core ~3x longer; the -O3 code is what the rest of the suite runs.
UNOPTIMISED = ["-DCMAKE_BUILD_TYPE=Debug", "-DCMAKE_CXX_FLAGS_DEBUG=-O0"]


@pytest.fixture(scope="module")
def system_build(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("sysmpi")
    cmake = shutil.which("cmake", path="/usr/local/bin:/usr/bin:/bin") or shutil.which("cmake")
    configure = [cmake, "-S", ROOT, "-B", build, "-DZCOLL_BUILD_PYTHON=OFF", f"-DMPI_CXX_COMPILER={MPICXX}"]
    for cmd, timeout in (
        ([*configure, *UNOPTIMISED], 300),
        ([cmake, "--build", build, "-j2", "--target", *BINARIES], 900),
    ):
        rc, out = run(cmd, env=_clean_env(), timeout=timeout)
        assert rc == 0, f"{' '.join(map(str, cmd))} exited {rc}:\n{out[-6000:]}"
    return build


@pytest.mark.parametrize("binary", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_benchmark_correct_on_system_mpi(system_build, binary, ranks):
    exe = system_build / f"zcoll_{binary}_perf"
    rc, out = run(
        [MPIRUN, "-n", ranks, exe, "-b", "4", "-e", "256K", "-f", "16", "-n", "2", "-w", "1", "-c", "1"],
        env=_clean_env(),
        timeout=180,
    )
    assert rc == 0, out
    assert "Open MPI" in out
    table = perf_table.parse(out)
    assert (table.collective, table.ranks) == (binary, ranks), out
    assert table.rows and all(r.wrong == 0 for r in table.rows), out
    assert table.out_of_bounds == 0, out
