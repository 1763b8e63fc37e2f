"""The one launcher of the tests: every subprocess a test starts, MPI job or not, goes through run().

1. run(cmd): a new session, stdin closed, stdout + stderr in one stream, and a timeout after
   which the whole process tree is killed (hydra's proxies start sessions of their own, so the
   tree is walked through /proc, not only the process group) and the test fails with the tail.
   The environment: the test's, minus ZCOLL_* settings and torch launcher variables (a
   developer's shell must not change what a test checks), plus MPIR_CVAR_DEVICE_COLLECTIVES=none
   (3 and 4 ranks on 2 cores are oversubscribed: MPICH's own collectives then busy-spin) and
   OMP_NUM_THREADS=1, unless the test's `env` says otherwise; a value of None unsets a variable.
   tests/ leads PYTHONPATH, so that the scripts in tests/mpi and tests/torch_mpi import the
   helpers here (harness, numerics, ...) as pytest's modules do (pyproject.toml's `pythonpath`).
2. mpirun(n, argv...): the venv's `mpirun -n n -prepend-rank` (each line starts with `[rank]`).
   python_mpirun(n, script, args...): a Python program as `python -m mpi4py`, so that an
   exception on one rank aborts the job instead of leaving the others waiting.
3. Scripts in tests/mpi and tests/torch_mpi speak the protocol of tests/harness.py. script_job()
   launches one (script, ranks, args, env) once, when a test first asks for one of its cases;
   check(case) passes when the case was reported PASS with at least min_checks checks. It fails
   with the case's failure lines (and the output tail, if the case raised), or, for a case never
   reached, with the job's exit status and the tail of its rank-prefixed output; when every case
   passed but the job then failed (teardown, MPI_Finalize) or exited unlike its summary line,
   every case fails. Example:

       @pytest.mark.parametrize("case", case_names("torch_mpi/ddp.py"))
       def test_ddp(case):
           script_job("torch_mpi/ddp.py", 2).check(case)
"""

from __future__ import annotations

import ast
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

import pytest
from zcoll.tools.perf_table import split_ranks
from zcoll.tools.proc import Finished, run_tree

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent
BIN_DIR = Path(sys.executable).parent  # the venv's bin/: mpirun and the zcoll_*_perf binaries
DEFAULT_TIMEOUT = 120
MAX_SHOWN = 20000  # characters of output shown in a failure message
JOB_DEFAULTS = {"MPIR_CVAR_DEVICE_COLLECTIVES": "none", "OMP_NUM_THREADS": "1"}
# Launcher variables a developer's shell may hold; a test that wants them passes them explicitly.
DROPPED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")


def job_env(extra: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZCOLL_") and k not in DROPPED}
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), *filter(None, [env.get("PYTHONPATH")])])
    env.update(JOB_DEFAULTS)
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


def tail(out: str) -> str:
    return out if len(out) <= MAX_SHOWN else "...\n" + out[-MAX_SHOWN:]


def _start(cmd: list, env, timeout: float, cwd) -> tuple:
    """(Finished, timed_out). On timeout the whole tree is killed first (zcoll.tools.proc)."""
    return run_tree(cmd, job_env(env), timeout, cwd)


def run(cmd: list, env: Optional[dict] = None, timeout: float = DEFAULT_TIMEOUT, cwd=None) -> Finished:
    """Runs cmd (see the module docstring); returns (exit status, output). On timeout kills the
    whole tree and fails the test with the output so far."""
    finished, timed_out = _start(cmd, env, timeout, cwd)
    if timed_out:
        what = " ".join(map(str, cmd))
        pytest.fail(
            f"timed out after {timeout} s (all processes killed): {what}\n{tail(finished.output)}",
            pytrace=False,
        )
    return finished


# Open MPI's launcher (./dev.sh test --engine openmpi): its rank tags instead of hydra's
# -prepend-rank (zcoll.tools.perf_table.split_ranks reads both), and more ranks than cores.
OPEN_MPI = (BIN_DIR / "ompi_info").exists()
# mpirun's options for rank-tagged output (and, on Open MPI, more ranks than cores)
TAG_FLAGS = ("--oversubscribe", "--output", "tag") if OPEN_MPI else ("-prepend-rank",)


def mpirun_argv(nprocs: int, *argv) -> list:
    return [BIN_DIR / "mpirun", *TAG_FLAGS, "-n", nprocs, *argv]


def mpirun(nprocs: int, *argv, env: Optional[dict] = None, timeout: float = DEFAULT_TIMEOUT) -> Finished:
    """mpirun -n nprocs -prepend-rank argv...; returns (exit status, output)."""
    return run(mpirun_argv(nprocs, *argv), env=env, timeout=timeout)


def python_mpirun(
    nprocs: int, script, *args, env: Optional[dict] = None, timeout: float = DEFAULT_TIMEOUT
) -> Finished:
    """A Python program on nprocs ranks under `python -m mpi4py` (one failing rank aborts all)."""
    return mpirun(nprocs, sys.executable, "-m", "mpi4py", script, *args, env=env, timeout=timeout)


# -- the result protocol (tests/harness.py) ----------------------------------------------------------
_CASE = re.compile(r"^ZCOLL-CASE (\S+) (PASS|FAIL) checks=(\d+)(.*)$", re.MULTILINE)
_SUMMARY = re.compile(r"^ZCOLL-SUMMARY passed=(\d+) failed=(\d+) ranks=(\d+)$", re.MULTILINE)


class CaseReport(NamedTuple):
    rank: Optional[int]  # the rank that printed the line (0, or the one that raised); None: no -prepend-rank
    status: str  # PASS or FAIL
    checks: int  # the fewest checks any rank made
    rest: str  # seconds=..., or what was raised


def parse_cases(output: str) -> Dict[str, List[CaseReport]]:
    """Every ZCOLL-CASE line by case name (a case run by several processes that are each their own
    MPI world, as under torchrun, has one line from each)."""
    found: Dict[str, List[CaseReport]] = {}
    for rank, text in split_ranks(output).items():
        for m in _CASE.finditer(text):
            found.setdefault(m.group(1), []).append(
                CaseReport(rank, m.group(2), int(m.group(3)), m.group(4).strip())
            )
    return found


def case_lines(output: str, case: str) -> List[str]:
    """The ZCOLL-CASE and ZCOLL-FAIL lines of one case, from every rank."""
    pattern = re.compile(rf"^ZCOLL-(CASE|FAIL) {re.escape(case)} .*$", re.MULTILINE)
    return [
        f"[{rank}] {m.group(0)}" if rank is not None else m.group(0)
        for rank, text in split_ranks(output).items()
        for m in pattern.finditer(text)
    ]


def case_names(script: str) -> List[str]:
    """The `case_*` functions of tests/<script>, in file order (read without running it)."""
    tree = ast.parse((TESTS_DIR / script).read_text())
    return [n.name[5:] for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("case_")]


class ScriptJob:
    """One launch of a protocol script; check(case) answers per case. Made by script_job()."""

    def __init__(
        self,
        script: str,
        ranks: int,
        args: tuple,
        env: Optional[dict],
        timeout: float,
        launcher: Optional[Callable[[list], list]] = None,
    ):
        self.script, self.ranks, self.args, self.env, self.timeout = script, ranks, args, env, timeout
        self.launcher = launcher or (lambda argv: mpirun_argv(ranks, *argv))
        self.finished: Optional[Finished] = None
        self.timed_out = False
        self.seconds = 0.0
        self.cases: Dict[str, List[CaseReport]] = {}

    def describe(self) -> str:
        return f"{' '.join([self.script, *self.args])} on {self.ranks} ranks"

    def launch(self) -> Finished:
        if self.finished is None:
            start = time.monotonic()
            argv = [sys.executable, "-m", "mpi4py", TESTS_DIR / self.script, *self.args]
            cmd = self.launcher(argv)
            self.finished, self.timed_out = _start(cmd, self.env, self.timeout, None)
            self.seconds = time.monotonic() - start
            self.cases = parse_cases(self.finished.output)
        return self.finished

    def ended_cleanly(self) -> Optional[str]:
        """None when the job printed its summary and exited as it says; else what went wrong."""
        rc, out = self.finished
        if self.timed_out:
            return f"the job timed out after {self.timeout} s (all its processes killed)"
        summary = _SUMMARY.search(split_ranks(out).get(0, ""))
        if summary is None:
            return f"the job exited {rc} without its summary line"
        if (rc == 0) != (int(summary.group(2)) == 0):
            return f"the job exited {rc} after its summary `{summary.group(0)}`"
        return None

    def check(self, case: str, min_checks: int = 1) -> None:
        rc, out = self.launch()
        reports = self.cases.get(case)
        where = f"{self.describe()} (job took {self.seconds:.0f} s)"
        if not reports:
            problem = self.ended_cleanly() or f"the job exited {rc}"
            pytest.fail(f"{where}: case {case} was not reached; {problem}:\n{tail(out)}", pytrace=False)
        failed = [r for r in reports if r.status != "PASS"]
        if failed:
            lines = case_lines(out, case)
            raised = any("raised" in r.rest for r in failed)
            shown = "\n".join(lines) + (f"\n\noutput:\n{tail(out)}" if raised else "")
            pytest.fail(f"{where}: case {case} failed:\n{shown}", pytrace=False)
        fewest = min(r.checks for r in reports)
        if fewest < min_checks:
            message = f"{where}: case {case} made {fewest} checks, expected at least {min_checks}"
            pytest.fail(message, pytrace=False)
        problem = self.ended_cleanly()
        if problem and all(c in self.cases for c in self.expected_cases()):
            # every case reported, so nothing else fails for what went wrong after them
            pytest.fail(f"{where}: case {case} passed, but then {problem}:\n{tail(out)}", pytrace=False)

    def expected_cases(self) -> List[str]:
        """The cases the job runs: those named on its command line, else all of the script's."""
        return [a for a in self.args if not a.startswith("--")] or case_names(self.script)


_JOBS: Dict[tuple, ScriptJob] = {}


def protocol_totals() -> tuple:
    """(jobs launched, cases reported, checks made) over this session's script jobs; checks count
    the fewest any rank made in each case."""
    launched = [j for j in _JOBS.values() if j.finished is not None]
    reports = [r[0] for j in launched for r in j.cases.values()]
    return len(launched), len(reports), sum(r.checks for r in reports)


def script_job(
    script: str,
    ranks: int,
    *args,
    env: Optional[dict] = None,
    timeout: float = 240,
    launcher: Optional[Callable[[list], list]] = None,
) -> ScriptJob:
    """The launch of tests/<script> with these ranks, args and env, made once per test session.
    launcher(argv) -> command: how to start the ranks (default `mpirun -n ranks -prepend-rank`;
    e.g. an MPMD command with per-rank settings, or zcoll.tools.testbed's namespaces)."""
    key = (script, ranks, tuple(map(str, args)), tuple(sorted((env or {}).items())), launcher)
    if key not in _JOBS:
        _JOBS[key] = ScriptJob(script, ranks, tuple(map(str, args)), env, timeout, launcher)
    return _JOBS[key]
