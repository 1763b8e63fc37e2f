"""Shared by the scripts in tests/mpi (run as `mpirun -n P python -m mpi4py script.py ...`).

`Checker` records failing cases instead of stopping at the first, so that one run reports all
of them (each line names the case); `finish()` agrees on the outcome across ranks and exits 1
everywhere if any rank failed. Only mpi4py's upper-case (buffer) collectives are used: the
lower-case ones pickle and hang on arrays.
"""

from __future__ import annotations

import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: numerics

import numpy as np
from mpi4py import MPI

WORLD = MPI.COMM_WORLD
MAX_REPORTED = 40  # failure lines printed per rank


class Checker:
    def __init__(self, label: str):
        self.label = label
        self.cases = 0
        self.failures = 0
        self._digests: list = []

    def case(self) -> None:
        self.cases += 1

    def fail(self, case, message: str) -> None:
        self.failures += 1
        if self.failures <= MAX_REPORTED:
            print(f"FAIL rank {WORLD.rank}: {case}: {message}", flush=True)

    def check(self, ok: bool, case, message: str) -> bool:
        if not ok:
            self.fail(case, message)
        return ok

    def raises(self, exc_type, fn, case, match: str = "") -> None:
        """fn() must raise exc_type whose message contains every word of `match`."""
        try:
            fn()
        except exc_type as e:
            missing = [w for w in match.split() if w not in str(e)]
            self.check(not missing, case, f"{type(e).__name__} message lacks {missing}: {e}")
            return
        except Exception as e:  # noqa: BLE001
            self.fail(case, f"expected {exc_type.__name__}, got {type(e).__name__}: {e}")
            return
        self.fail(case, f"expected {exc_type.__name__}, nothing was raised")

    def same_on_all_ranks(self, case, data: bytes) -> None:
        """Registers data whose bytes must be identical on every rank (checked in finish())."""
        self._digests.append((str(case), hashlib.blake2b(data, digest_size=16).digest()))

    def finish(self) -> None:
        self._check_digests()
        counts = np.array([self.failures, self.cases], dtype=np.int64)
        totals = np.empty((WORLD.size, 2), dtype=np.int64)
        WORLD.Allgather(counts, totals)
        if WORLD.rank == 0:
            print(
                f"{self.label}: {int(totals[:, 1].min())} cases on each of {WORLD.size} ranks, "
                f"{int(totals[:, 0].sum())} failures",
                flush=True,
            )
        if len(set(totals[:, 1].tolist())) != 1:
            if WORLD.rank == 0:
                print(f"FAIL: ranks ran different numbers of cases: {totals[:, 1].tolist()}", flush=True)
            sys.exit(1)
        if totals[:, 0].any():
            sys.exit(1)

    def _check_digests(self) -> None:
        n = np.array([len(self._digests)], dtype=np.int64)
        ns = np.empty(WORLD.size, dtype=np.int64)
        WORLD.Allgather(n, ns)
        if len(set(ns.tolist())) != 1:
            self.fail(
                "cross-rank comparison", f"ranks registered different numbers of results: {ns.tolist()}"
            )
            return
        if not self._digests:
            return
        mine = np.frombuffer(b"".join(d for _, d in self._digests), dtype=np.uint8)
        every = np.empty((WORLD.size, mine.size), dtype=np.uint8)
        WORLD.Allgather(mine, every)
        per_case = every.reshape(WORLD.size, len(self._digests), 16)
        differ = (per_case != per_case[0]).any(axis=2).any(axis=0)
        for i in np.flatnonzero(differ):
            ranks = [r for r in range(WORLD.size) if (per_case[r, i] != per_case[0, i]).any()]
            self.fail(self._digests[i][0], f"result bits differ between rank 0 and ranks {ranks}")


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by a tuple of small non-negative ints (e.g. rank, count, dtype code)."""
    return np.random.default_rng([int(k) for k in key])
