"""Runs a script's ``case_*`` functions on every rank and reports each (see tests/torch_util.py)."""

import sys
import traceback

from mpi4py import MPI


def run_cases(namespace: dict) -> None:
    only = set(sys.argv[1:])
    world = MPI.COMM_WORLD
    for name, fn in list(namespace.items()):
        if not (name.startswith("case_") and callable(fn)) or (only and name[5:] not in only):
            continue
        try:
            fn()
        except BaseException:
            print(f"ZCOLL-CASE {name[5:]} FAIL on rank {world.rank}:\n{traceback.format_exc()}", flush=True)
            raise  # python -m mpi4py aborts the job
        world.Barrier()
        if world.rank == 0:
            print(f"ZCOLL-CASE {name[5:]} PASS", flush=True)
