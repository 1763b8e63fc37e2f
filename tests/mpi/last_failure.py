"""Communicator._last_failure after a real failure on 3 ranks: ranks 0 and 1 allreduce while
rank 2, per --victim:

    hang   sleeps outside zcoll (alive, running): the others time out (--timeout) naming it
           missing and alive, not lost;
    exit   ends its process (os._exit(1); run under mpirun's keep-going option) once ranks 0 and 1
           have left the first allreduce (each touches --sync-dir/left-R; an exit before that
           would fail their first call instead): the others raise RankLostError naming it
           missing and lost, not alive.

Ranks 0 and 1 print  ZCOLL-LAST rank=R before=<json> after=<json> raised=<json>  where before
and after are comm._last_failure before and after the failure and raised the exception's
attributes (missing, lost, seq, collective), then end normally.

    mpirun -n 3 python last_failure.py --victim hang --timeout 2
    mpirun -n 3 -disable-auto-cleanup python last_failure.py --victim exit --sync-dir /tmp/lf
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _wait_for_files(paths: list[Path], limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise SystemExit(f"rank 2: {paths} did not appear within {limit_s} s")
        time.sleep(0.01)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--victim", choices=["hang", "exit"], required=True)
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--sync-dir", type=Path, default=Path("."), help="a directory all 3 ranks see")
    args = p.parse_args()
    import zcoll

    comm = zcoll.Communicator(timeout=args.timeout if args.victim == "hang" else 600)
    x = np.ones(1024, dtype=np.float32)
    comm.allreduce(x)  # one call that every rank makes: seq 1
    if comm.rank == 2:
        if args.victim == "exit":
            _wait_for_files([args.sync_dir / f"left-{r}" for r in (0, 1)])
            os._exit(1)
        time.sleep(args.timeout + 6)
        return
    (args.sync_dir / f"left-{comm.rank}").touch()
    before = comm._last_failure
    try:
        comm.allreduce(x)
        raise SystemExit("the allreduce without rank 2 completed")
    except zcoll.TimeoutError as e:
        raised = {"missing": list(e.missing), "lost": list(e.lost), "seq": e.seq, "collective": e.collective,
                  "type": type(e).__name__}  # fmt: skip
    record = (f"ZCOLL-LAST rank={comm.rank} before={json.dumps(before)} after={json.dumps(comm._last_failure)} "
              f"raised={json.dumps(raised)}\n")  # fmt: skip
    sys.stdout.write(record)  # one write, so the launcher's merged output keeps the line whole
    sys.stdout.flush()


if __name__ == "__main__":
    main()
