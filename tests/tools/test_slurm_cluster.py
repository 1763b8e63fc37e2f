"""scripts/slurm_cluster.sh: a real Slurm (Debian's slurmctld + slurmd, munge) started on this
machine; `srun -n 2 --mpi=pmi2` runs tests/torch_mpi/launchers.py with the zcoll torch backend
(Slurm's pmi2 plugin serves MPICH its PMI; on Open MPI `--mpi=pmix`), every case passes and its
results are bitwise those of the mpirun launch (tests/torch/test_torchrun.py's, shared in one
session). Skips, with the reason, without root or without the packages (.ci/run installs them).
On Open MPI with Slurm 22.05 the node map is lost under srun (lost_node_map): the results that
do not depend on it are compared, and the case xfails with the reason."""

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


# Open MPI under srun --mpi=pmix: the wheel's PMIx 5 client finds none of the node-level keys
# (PMIX_LOCAL_PEERS, PMIX_LOCAL_SIZE) that Debian 12's Slurm 22.05 serves through its PMIx 4.2
# plugin (a PMIx 4.2 client reads them there: local size 2, peers 0,1), so Open MPI takes every
# rank for a node of its own: MPI_Comm_split_type(SHARED) and zcoll find 2 nodes, shm is left
# out and auto/hierarchical plan for 2 nodes. ZCOLL_NODE_ID cannot mend it: zcoll's arena is an
# MPI shared window, which Open MPI then refuses (MPI_ERR_RMA_SHARED).
_NODES = re.compile(r"ZCOLL-NODES mpi=(\d+) zcoll=(\d+) local_size=(\d+)")
# the algorithms whose plan and reduction order do not depend on which ranks share a node
NODE_MAP_FREE = ("ring", "tree", "recursive_doubling", "halving_doubling")


def lost_node_map(job) -> bool:
    """True when the 2 tasks srun started on one node each saw a node of their own."""
    found = _NODES.search(job.finished.output)
    return bool(OPEN_MPI and found and found.groups() == ("2", "2", "1"))


@pytest.mark.parametrize("case", CASES)
def test_srun_matches_mpirun(slurm_conf, case):
    under_srun = script_job(SCRIPT, 2, env={"SLURM_CONF": slurm_conf}, timeout=300, launcher=srun_launcher)
    under_mpirun = script_job(SCRIPT, 2, timeout=300)
    under_mpirun.check(case)
    under_srun.launch()
    got, want = digests(under_srun), digests(under_mpirun)
    if case == "torch_ops" or not lost_node_map(under_srun):
        under_srun.check(case)
        assert got.get(case) and got[case] == want[case], (
            f"srun's results differ from mpirun's ({got.get(case)} vs {want[case]})"
        )
        return
    # the node map lost (above): what does not depend on it must still be bitwise mpirun's
    if case == "collectives":
        under_srun.check(case)  # every algorithm's sums, on every rank alike
        for alg in NODE_MAP_FREE:
            key = f"{case}/{alg}"
            assert got.get(key) and got[key] == want[key], f"{alg}: srun {got.get(key)} vs mpirun {want[key]}"
    else:  # nodes: its exact int32 sums; its node counts are what the lost map breaks
        assert under_srun.ended_cleanly() is None, under_srun.ended_cleanly()
        assert got.get(case) and got[case] == want[case], f"srun {got.get(case)} vs mpirun {want[case]}"
    pytest.xfail(
        "Open MPI under srun --mpi=pmix sees every rank as a node of its own (the wheel's PMIx 5 "
        "client reads no PMIX_LOCAL_PEERS from Slurm 22.05's PMIx 4.2 plugin): node-map-free "
        "results match mpirun's, the node counts and shm/auto/hierarchical cannot"
    )
