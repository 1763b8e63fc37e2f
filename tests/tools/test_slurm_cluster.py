"""scripts/slurm_cluster.sh: a real Slurm (Debian's slurmctld + slurmd, munge) started on this
machine; `srun -n 2 --mpi=pmi2` runs tests/torch_mpi/launchers.py with the zcoll torch backend
(Slurm's pmi2 plugin serves MPICH its PMI), every case passes and its results are bitwise those of
the mpirun launch (tests/torch/test_torchrun.py's, shared in one session). Skips, with the reason,
without root or without the packages (.ci/run installs them)."""

import os
import re
import shutil

import pytest
from mpi_util import OPEN_MPI, ROOT, run, script_job, tail

CLUSTER = ROOT / "scripts" / "slurm_cluster.sh"
SCRIPT = "torch_mpi/launchers.py"
CASES = ("collectives", "torch_ops", "nodes")
NEEDED = ("slurmctld", "slurmd", "munged", "srun", "sinfo")
_DIGEST = re.compile(r"ZCOLL-DIGEST (\S+) ([0-9a-f]{64})")


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory):
    """A one-node Slurm cluster of this module's own (started, then stopped)."""
    if os.geteuid() != 0:
        pytest.skip("Slurm's daemons need root (slurmd starts tasks as their user)")
    absent = [b for b in NEEDED if shutil.which(b) is None]
    if absent:
        pytest.skip(f"no {', '.join(absent)}: apt-get install -y slurmctld slurmd munge slurm-client")
    where = {"ZCOLL_SLURM_DIR": str(tmp_path_factory.mktemp("slurm")), "ZCOLL_SLURM_PORT": "16917"}
    started = run(["bash", CLUSTER, "start", "1", "2"], env=where, timeout=120)
    try:
        assert started.returncode == 0, f"the cluster did not start:\n{tail(started.output)}"
        yield os.path.join(where["ZCOLL_SLURM_DIR"], "slurm.conf")
    finally:
        run(["bash", CLUSTER, "stop"], env=where, timeout=60)


# Slurm's plugin that serves the engine's start-up: PMI-2 for MPICH, PMIx for Open MPI (which has
# no PMI-2 client: under --mpi=pmi2 each task would be a job of one rank)
SRUN_MPI = "--mpi=pmix" if OPEN_MPI else "--mpi=pmi2"


def srun_launcher(argv: list) -> list:
    """srun of argv on 2 tasks, each line marked with its rank as mpirun -prepend-rank does."""
    srun = ["srun", "-N", "1", "-n", "2", "--overcommit", SRUN_MPI, "--label", *map(str, argv)]
    return ["bash", "-o", "pipefail", "-c", r'"$@" 2>&1 | sed -uE "s/^ *([0-9]+): /[\1] /"', "srun", *srun]


def digests(job) -> dict:
    return dict(_DIGEST.findall(job.finished.output))


@pytest.mark.parametrize("case", CASES)
def test_srun_matches_mpirun(slurm_conf, case):
    under_srun = script_job(SCRIPT, 2, env={"SLURM_CONF": slurm_conf}, timeout=300, launcher=srun_launcher)
    under_mpirun = script_job(SCRIPT, 2, timeout=300)
    under_srun.check(case)
    under_mpirun.check(case)
    got, want = digests(under_srun).get(case), digests(under_mpirun).get(case)
    assert got and got == want, f"srun's results differ from mpirun's ({got} vs {want})"
