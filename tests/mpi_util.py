"""Launching MPI jobs from pytest so that nothing hangs and failures are readable.

Every job runs under the venv's `mpirun` with `-prepend-rank` (each output line starts with
`[rank]`), Python scripts as `python -m mpi4py script.py` (an unhandled exception on one rank
aborts the whole job instead of leaving the others waiting), and a timeout after which the
whole process tree is killed. 3 and 4 ranks on 2 cores are oversubscribed: MPICH's own
collectives then busy-spin unless MPIR_CVAR_DEVICE_COLLECTIVES=none, which every job sets.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
MPI_SCRIPTS = TESTS_DIR / "mpi"
BIN_DIR = Path(sys.executable).parent  # the venv's bin/: mpirun and the zcoll_*_perf binaries
DEFAULT_TIMEOUT = 120
MAX_SHOWN = 20000  # characters of output shown in a failure message


def mpi_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["MPIR_CVAR_DEVICE_COLLECTIVES"] = "none"
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env.pop("ZCOLL_CHECK", None)  # a developer's setting must not change what a test checks
    env.update(extra or {})
    return env


def _descendants(pid: int) -> list:
    """Every process below pid (hydra's proxies start their own sessions, so killing mpirun's
    process group alone could leave ranks behind)."""
    children: dict = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    pids = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(cmd: list, env: dict | None = None, timeout: float = DEFAULT_TIMEOUT) -> tuple:
    """Runs cmd in a new session; returns (exit status, stdout+stderr). On timeout kills the
    whole tree and fails the test with the output so far."""
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=mpi_env(env),
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        out, _ = proc.communicate()
        pytest.fail(
            f"timed out after {timeout} s (all processes killed): {' '.join(map(str, cmd))}\n{_tail(out)}",
            pytrace=False,
        )
    return proc.returncode, out


def _tail(out: str) -> str:
    return out if len(out) <= MAX_SHOWN else "...\n" + out[-MAX_SHOWN:]


def mpirun(nprocs: int, *argv, env: dict | None = None, timeout: float = DEFAULT_TIMEOUT) -> tuple:
    """mpirun -n nprocs -prepend-rank argv...; returns (exit status, output)."""
    return run([BIN_DIR / "mpirun", "-n", nprocs, "-prepend-rank", *argv], env=env, timeout=timeout)


def run_script(
    script: str, nprocs: int, *args, env: dict | None = None, timeout: float = DEFAULT_TIMEOUT
) -> str:
    """Runs tests/mpi/<script> on nprocs ranks; fails the test (showing the rank-prefixed output)
    unless every rank exits 0. Returns the output."""
    rc, out = mpirun(
        nprocs, sys.executable, "-m", "mpi4py", MPI_SCRIPTS / script, *args, env=env, timeout=timeout
    )
    if rc != 0:
        pytest.fail(
            f"{script} {' '.join(map(str, args))} on {nprocs} ranks exited {rc}:\n{_tail(out)}", pytrace=False
        )
    return out


def summary_count(out: str, label: str) -> int:
    """The N of the `<label>: N cases` line a script's rank 0 prints at the end."""
    m = re.search(rf"^\[0\] {re.escape(label)}: (\d+) cases", out, re.MULTILINE)
    assert m, f"no '{label}: N cases' summary in the output:\n{_tail(out)}"
    return int(m.group(1))
