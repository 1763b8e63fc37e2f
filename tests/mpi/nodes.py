"""Which ranks form a node (ZCOLL_NODE_ID, or MPI's shared-memory split), and collectives across
emulated nodes.

    PYTHONPATH=tests mpirun ... python -m mpi4py tests/mpi/nodes.py --nodes=0,0,1,1 [case ...]

--nodes: the node each rank must find itself on (numbered by each node's lowest rank), as the
launch set them up (ZCOLL_NODE_ID per rank, or zcoll.tools.testbed's namespaces).

1. node_map: node_count, node_of(r) for every r, local_ranks and local_size agree with --nodes
   on every rank; node_of refuses a rank out of range.
2. shm_needs_one_node: algorithm="shm" works when all ranks are on one node and raises
   ValueError naming shared memory otherwise, on every rank (before any message); auto works.
3. collectives_across_nodes: ring and tree allreduce, and allgather, give the exact answer and
   the same bits on every rank (float32 values exact in any order).
"""

from __future__ import annotations

from harness import WORLD, Checks, option, run_cases

# isort: split
import numpy as np
import zcoll

comm = zcoll.Communicator()
expected = [int(x) for x in option("nodes", ",".join("0" * WORLD.size)).split(",")]


def case_node_map(ck: Checks):
    ck.check(len(expected) == comm.size, "--nodes", f"{expected} for {comm.size} ranks")
    ck.check(comm.node_count == len(set(expected)), "node_count", f"{comm.node_count}, want {len(set(expected))}")
    got = [comm.node_of(r) for r in range(comm.size)]
    ck.check(got == expected, "node_of", f"{got}, want {expected}")
    mine = [r for r in range(comm.size) if expected[r] == expected[comm.rank]]
    ck.check(list(comm.local_ranks) == mine, "local_ranks", f"{comm.local_ranks}, want {mine}")
    ck.check(comm.local_size == len(mine), "local_size", f"{comm.local_size}")
    ck.raises(ValueError, lambda: comm.node_of(comm.size), "node_of", "not in")


def case_shm_needs_one_node(ck: Checks):
    x = np.full(1000, comm.rank + 1, np.float32)
    want = np.full(1000, comm.size * (comm.size + 1) / 2, np.float32)
    if len(set(expected)) == 1:
        ck.check(np.array_equal(comm.allreduce(x, algorithm="shm"), want), "shm on one node")
    else:
        before = comm.stats()["bytes_sent"]
        ck.raises(ValueError, lambda: comm.allreduce(x, algorithm="shm"), "shm")
        ck.check(comm.stats()["bytes_sent"] == before, "nothing sent before the refusal")
    ck.check(np.array_equal(comm.allreduce(x), want), "auto")


def case_collectives_across_nodes(ck: Checks):
    n = 100_003
    x = (np.arange(n, dtype=np.float32) % 1024) * (comm.rank + 1)
    want = (np.arange(n, dtype=np.float32) % 1024) * (comm.size * (comm.size + 1) / 2)
    for algorithm in ("ring", "tree"):
        y = comm.allreduce(x, algorithm=algorithm)
        ck.check(np.array_equal(y, want), algorithm)
        ck.same_on_all_ranks(algorithm, y.tobytes())
    g = comm.allgather(np.full(3, comm.rank, np.int32))
    ck.check(np.array_equal(g, np.repeat(np.arange(comm.size, dtype=np.int32)[:, None], 3, axis=1)), "allgather")


if __name__ == "__main__":
    run_cases(globals(), teardown=comm.free)
