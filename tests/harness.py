"""The rank side of the test protocol, for the scripts in tests/mpi and tests/torch_mpi.

A script defines ``case_<name>(ck)`` functions and ends with ``run_cases(globals())``; it runs as
``mpirun -n P python -m mpi4py script.py [--option ...] [case ...]`` (positional arguments pick
cases, default all; options are the script's own, read with ``option()``).

1. Each case runs on every rank with a fresh ``Checks`` (``ck``): any number of ``ck.check``,
   ``ck.raises`` and ``ck.same_on_all_ranks``; a failed check prints a line and the case goes on.
2. At its end the ranks agree: digests registered with ``same_on_all_ranks`` must be identical on
   every rank, and the case passes when no rank recorded a failure and every rank made at least
   one check (a case that checks nothing fails).
3. Rank 0 prints one line per case and a summary, which tests/mpi_util.py reads:

       ZCOLL-FAIL <case> rank <r>: <what>: <message>      each failed check, from its rank
       ZCOLL-CASE <case> PASS|FAIL checks=<fewest on any rank> seconds=<s>
       ZCOLL-SUMMARY passed=<n> failed=<n> ranks=<p>

   and the job exits 0 when every case passed, 1 otherwise.
4. An exception escaping a case is printed by its rank (``ZCOLL-CASE <case> FAIL ... raised``, then
   the traceback) and re-raised: the other ranks may be waiting in a collective, so
   ``python -m mpi4py`` aborts the job, and the cases after it count as not reached.

Use mpi4py's upper-case (buffer) collectives on arrays: the lower-case ones pickle.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import sys
import time
import traceback
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

WORLD = MPI.COMM_WORLD
MAX_REPORTED = 40  # failure lines printed per rank and case


class Checks:
    """The checks of one case on this rank."""

    def __init__(self, case: str):
        self.case = case
        self.checks = 0
        self.failures = 0
        self._digests: list = []

    def check(self, ok, what=None, message: str = "") -> bool:
        """One check: reports `what: message` unless ok (what defaults to the caller's file:line
        and source line). Returns bool(ok), to guard what follows."""
        self.checks += 1
        ok = bool(ok)
        if not ok:
            self._report(what if what is not None else _caller(), message)
        return ok

    def fail(self, what, message: str = "") -> None:
        """A check that failed (for outcomes found by other means than a condition)."""
        self.check(False, what, message)

    def raises(self, exc_type, fn: Callable, *substrings: str, what=None) -> Optional[BaseException]:
        """One check: fn() raises exc_type whose message contains every substring. Returns the
        exception (None when the check failed)."""
        what = what if what is not None else _caller()
        try:
            fn()
        except exc_type as e:
            missing = [s for s in substrings if s not in str(e)]
            ok = self.check(not missing, what, f"{type(e).__name__} message lacks {missing}: {e}")
            return e if ok else None
        except Exception as e:  # noqa: BLE001 - the wrong exception is this check's failure
            self.fail(what, f"expected {exc_type.__name__}, got {type(e).__name__}: {e}")
            return None
        self.fail(what, f"expected {exc_type.__name__}, nothing was raised")
        return None

    def same_on_all_ranks(self, what, data: bytes) -> None:
        """One check: data (e.g. a result's bytes) is identical on every rank; compared when the
        case ends, in one exchange for all of the case's digests."""
        self.checks += 1
        self._digests.append((str(what), hashlib.blake2b(data, digest_size=16).digest()))

    def _report(self, what, message: str) -> None:
        self.failures += 1
        if self.failures <= MAX_REPORTED:
            text = f"{what}: {message}" if message else str(what)
            say(f"ZCOLL-FAIL {self.case} rank {WORLD.rank}: {' | '.join(text.splitlines())}")
        elif self.failures == MAX_REPORTED + 1:
            say(f"ZCOLL-FAIL {self.case} rank {WORLD.rank}: (further failures not shown)")

    def _compare_digests(self) -> None:
        """Collective. A difference counts as a failure on rank 0, which names the ranks."""
        counts = np.empty(WORLD.size, dtype=np.int64)
        WORLD.Allgather(np.array([len(self._digests)], dtype=np.int64), counts)
        if len(set(counts.tolist())) != 1:
            if WORLD.rank == 0:
                self.fail("same_on_all_ranks", f"ranks registered different numbers of results: {counts}")
            return
        if not self._digests:
            return
        mine = np.frombuffer(b"".join(d for _, d in self._digests), dtype=np.uint8)
        every = np.empty((WORLD.size, mine.size), dtype=np.uint8)
        WORLD.Allgather(mine, every)
        per_result = every.reshape(WORLD.size, len(self._digests), 16)
        differ = (per_result != per_result[0]).any(axis=2)  # [rank, result]
        if WORLD.rank == 0:
            for i in np.flatnonzero(differ.any(axis=0)):
                ranks = ", ".join(map(str, np.flatnonzero(differ[:, i])))
                self.fail(self._digests[i][0], f"result bits differ between rank 0 and ranks {ranks}")


def say(line: str) -> None:
    """One line in one write: hydra marks every chunk it reads with the rank, so a line written in
    pieces (print() under PYTHONUNBUFFERED=1) would carry markers in its middle."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _caller() -> str:
    """file:line and source of the innermost call from outside this file (for failure lines)."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename == __file__:
        frame = frame.f_back
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}: {line}"


def option(name: str, default: Optional[str] = None) -> Optional[str]:
    """The value of `--name=value` on the command line; `--name` alone gives ""."""
    for arg in sys.argv[1:]:
        if arg == f"--{name}":
            return ""
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return default


def _run_case(name: str, fn: Callable) -> bool:
    ck = Checks(name)
    start = time.monotonic()
    try:
        fn(ck)
    except BaseException as e:
        say(
            f"ZCOLL-CASE {name} FAIL checks={ck.checks} raised {type(e).__name__} on rank {WORLD.rank}: "
            f"{' | '.join(str(e).splitlines())}\n{traceback.format_exc()}"
        )
        raise
    ck._compare_digests()
    every = np.empty((WORLD.size, 2), dtype=np.int64)
    WORLD.Allgather(np.array([ck.failures, ck.checks], dtype=np.int64), every)
    silent = np.flatnonzero(every[:, 1] == 0)
    passed = not every[:, 0].any() and not silent.size
    if WORLD.rank == 0:
        if silent.size:
            say(f"ZCOLL-FAIL {name} rank 0: ranks {', '.join(map(str, silent))} made no check")
        say(
            f"ZCOLL-CASE {name} {'PASS' if passed else 'FAIL'} checks={int(every[:, 1].min())} "
            f"seconds={time.monotonic() - start:.2f}"
        )
    return passed


def run_cases(namespace: dict, teardown: Optional[Callable] = None) -> None:
    """Runs the selected `case_*` functions of namespace in file order, then teardown(), prints
    the summary and exits (0: every case passed)."""
    cases = {n[5:]: f for n, f in namespace.items() if n.startswith("case_") and callable(f)}
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
    unknown = [w for w in wanted if w not in cases]
    if unknown:
        if WORLD.rank == 0:
            say(f"unknown cases {unknown}; this script has {list(cases)}")
        sys.exit(2)
    failed = sum(not _run_case(name, cases[name]) for name in wanted or cases)
    if teardown is not None:
        teardown()
    WORLD.Barrier()
    if WORLD.rank == 0:
        say(f"ZCOLL-SUMMARY passed={len(wanted or cases) - failed} failed={failed} ranks={WORLD.size}")
    sys.exit(1 if failed else 0)


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by a tuple of small non-negative ints (e.g. rank, count, dtype code)."""
    return np.random.default_rng([int(k) for k in key])
