"""A communicator whose ranks zcoll puts on one node (ZCOLL_NODE_ID) while MPI holds them in
separate shared-memory domains (MPICH's MPIR_CVAR_NOLOCAL=1): no shared arena, with the reason in
comm.shm_unavailable, and collectives that work without it (MPI_Win_allocate_shared used to fail
in the first allreduce). Each rank prints

    ZCOLL-SHM rank=R domain=D node_count=N reason=<comm.shm_unavailable> ok=<bool> shm_algorithm=<what
    algorithm 'shm' did: raised <type> or ran>

    mpirun -n 2 env ZCOLL_NODE_ID=a MPIR_CVAR_NOLOCAL=1 python shm_fallback.py
"""

from __future__ import annotations

import numpy as np


def main() -> None:
    from mpi4py import MPI

    import zcoll

    domain = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    comm = zcoll.Communicator()
    p, r = comm.size, comm.rank
    ok = True
    for n in (1, 1000, 1 << 18):  # past the shm algorithm's sizes, where auto would pick it
        x = np.arange(n, dtype=np.float32) + r
        y = comm.allreduce(x)
        ok &= bool(np.array_equal(y, np.arange(n, dtype=np.float32) * p + p * (p - 1) / 2))
    try:
        comm.allreduce(np.ones(8, np.float32), algorithm="shm")
        shm = "ran"
    except Exception as e:  # the algorithm is unavailable: which error says so
        shm = f"raised {type(e).__name__}"
    print(f"ZCOLL-SHM rank={r} domain={domain.Get_size()} node_count={comm.node_count} "
          f"reason={comm.shm_unavailable} ok={ok} shm_algorithm={shm}", flush=True)  # fmt: skip
    comm.free()
    domain.Free()


if __name__ == "__main__":
    main()
