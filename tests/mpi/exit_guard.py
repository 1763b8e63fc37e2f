"""The exit guard (zcoll.core.communicator._free_all) on 2 ranks whose communicator a failure
broke: both abort the same call (comm.abort), so both raise zcoll.TimeoutError, catch it and end
normally. Then rank 1, per --peer:

    slow   sleeps --sleep s before it ends (alive, running): rank 0's MPI_Finalize waits for it,
           and rank 0 must wait too, then exit 0 (not be killed by the guard at 5 s);
    stop   stops itself (SIGSTOP): rank 0 must end itself with status 75 within the guard's 5 s
           + 1 s settle (the launcher then tears the stopped rank down).

Each rank prints  ZCOLL-RAISED rank=R  after the failure,  ZCOLL-ENDING rank=R t=T  when its
script ends (rank 1 in slow mode: after its sleep),  and rank 1  ZCOLL-STOPPING t=T  in stop mode.

    mpirun -n 2 python exit_guard.py --peer slow --sleep 8
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peer", choices=["slow", "stop"], required=True)
    p.add_argument("--sleep", type=float, default=8.0)
    args = p.parse_args()
    import zcoll

    comm = zcoll.Communicator(timeout=30)
    rank = comm.rank
    comm.abort("the exit guard test breaks this communicator")
    try:
        comm.allreduce(np.ones(4, dtype=np.float32))
    except zcoll.TimeoutError:
        print(f"ZCOLL-RAISED rank={rank}", flush=True)
    if rank == 1 and args.peer == "slow":
        time.sleep(args.sleep)
    if rank == 1 and args.peer == "stop":
        print(f"ZCOLL-STOPPING t={time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    print(f"ZCOLL-ENDING rank={rank} t={time.time():.3f}", flush=True)


if __name__ == "__main__":
    main()
