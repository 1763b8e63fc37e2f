"""The core and the benchmark binaries build against a system MPI found by CMake's FindMPI
(Debian's Open MPI here), not only against the PyPI MPICH wheel, and run correctly on it."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPICXX = shutil.which("mpicxx.openmpi")
MPIRUN = shutil.which("mpirun.openmpi")

pytestmark = pytest.mark.skipif(
    MPICXX is None or MPIRUN is None, reason="no system Open MPI (apt-get install libopenmpi-dev openmpi-bin)"
)


def _clean_env() -> dict:
    """An environment without the venv (its MPICH must not leak into the system-MPI build)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "MPI", "PYTHON"))}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    return env


@pytest.fixture(scope="module")
def system_build(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("sysmpi")
    env = _clean_env()
    cmake = shutil.which("cmake", path=env["PATH"]) or shutil.which("cmake")
    subprocess.run(
        [cmake, "-S", str(ROOT), "-B", str(build), "-DZCOLL_BUILD_PYTHON=OFF", f"-DMPI_CXX_COMPILER={MPICXX}"],
        check=True, env=env, capture_output=True, timeout=300,
    )
    subprocess.run([cmake, "--build", str(build), "-j2"], check=True, env=env, capture_output=True, timeout=900)
    return build


@pytest.mark.parametrize("binary", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_benchmark_correct_on_system_mpi(system_build, binary, ranks):
    exe = system_build / f"zcoll_{binary}_perf"
    out = subprocess.run(
        [MPIRUN, "-n", str(ranks), str(exe), "-b", "4", "-e", "256K", "-f", "16", "-n", "2", "-w", "1", "-c", "1"],
        env=_clean_env(), capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Open MPI" in out.stdout
    assert "Out of bounds values : 0 OK" in out.stdout
