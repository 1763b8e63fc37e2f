"""Communicator._last_failure after a real failure on 3 ranks: ranks 0 and 1 allreduce while
rank 2, per --victim:

    hang   sleeps outside zcoll (alive, running): the others time out (--timeout) naming it
           missing and alive, not lost;
    exit   ends its process (os._exit(1); run under mpirun's keep-going option): the others
           raise RankLostError naming it missing and lost, not alive.

Ranks 0 and 1 print  ZCOLL-LAST rank=R before=<json> after=<json> raised=<json>  where before
and after are comm._last_failure before and after the failure and raised the exception's
attributes (missing, lost, seq, collective), then end normally.

    mpirun -n 3 python last_failure.py --victim hang --timeout 2
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--victim", choices=["hang", "exit"], required=True)
    p.add_argument("--timeout", type=float, default=2.0)
    args = p.parse_args()
    import zcoll

    comm = zcoll.Communicator(timeout=args.timeout if args.victim == "hang" else 600)
    x = np.ones(1024, dtype=np.float32)
    comm.allreduce(x)  # one call that every rank makes: seq 1
    if comm.rank == 2:
        if args.victim == "exit":
            os._exit(1)
        time.sleep(args.timeout + 6)
        return
    before = comm._last_failure
    try:
        comm.allreduce(x)
        raise SystemExit("the allreduce without rank 2 completed")
    except zcoll.TimeoutError as e:
        raised = {"missing": list(e.missing), "lost": list(e.lost), "seq": e.seq, "collective": e.collective,
                  "type": type(e).__name__}  # fmt: skip
    print(f"ZCOLL-LAST rank={comm.rank} before={json.dumps(before)} after={json.dumps(comm._last_failure)} "
          f"raised={json.dumps(raised)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
