"""ZCOLL_NODE_ID on one machine, without namespaces: per-rank values, set in MPMD segments through
env(1) (the same on hydra and Open MPI), decide which ranks form a node (tests/mpi/nodes.py checks
the node map, the shm path and collectives across nodes)."""

import sys

import pytest
from mpi_util import BIN_DIR, TAG_FLAGS, case_names, run, script_job

SCRIPT = "mpi/nodes.py"


def per_rank_ids(ids):
    """A launcher giving rank r ZCOLL_NODE_ID=ids[r] (unset for None), one MPMD segment per rank."""

    def launch(argv):
        cmd = [BIN_DIR / "mpirun", *TAG_FLAGS]
        for r, node_id in enumerate(ids):
            cmd += [":"] if r else []
            cmd += ["-n", "1", *(["env", f"ZCOLL_NODE_ID={node_id}"] if node_id is not None else []), *argv]
        return cmd

    return launch


SPLIT = per_rank_ids(["rack1/a", "rack1/b", "rack1/a", "rack1/b"])  # ranks 0,2 and 1,3
SAME = per_rank_ids(["x", "x", "x"])
MIXED = per_rank_ids([None, "solo", None])  # unset: MPI's grouping (here: one machine)


@pytest.mark.parametrize("case", case_names(SCRIPT))
def test_ids_split_one_machine(case):
    script_job(SCRIPT, 4, "--nodes=0,1,0,1", launcher=SPLIT).check(case)


@pytest.mark.parametrize("case", case_names(SCRIPT))
def test_equal_ids_are_one_node(case):
    script_job(SCRIPT, 3, "--nodes=0,0,0", launcher=SAME).check(case)


@pytest.mark.parametrize("case", case_names(SCRIPT))
def test_unset_ids_follow_mpi(case):
    script_job(SCRIPT, 3, "--nodes=0,1,0", launcher=MIXED).check(case)


def test_without_ids_one_machine_is_one_node():
    script_job(SCRIPT, 2, "--nodes=0,0").check("node_map")


def test_info_lists_node_id():
    rc, out = run([sys.executable, "-m", "zcoll", "info"], env={"ZCOLL_NODE_ID": "rack2-n7"}, timeout=60)
    assert rc == 0, out
    line = next(l for l in out.splitlines() if "ZCOLL_NODE_ID" in l)
    assert "rack2-n7" in line and "(environment)" in line, out
