"""Launcher for the compression tests: scripts under a real `mpirun`, with a timeout.

Every job runs the venv's `mpirun -prepend-rank` (output lines start with `[rank]`), Python
scripts as `python -m mpi4py script.py` (an unhandled exception on one rank aborts the whole job
instead of leaving the others waiting), MPICH's collectives set to not busy-spin (3 and 4 ranks
share 2 cores here), and a timeout after which the whole process tree is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
MPI_SCRIPTS = TESTS_DIR / "mpi"
BIN_DIR = Path(sys.executable).parent  # the venv's bin/: mpirun and zcoll_allreduce_perf


def _env() -> dict:
    env = dict(os.environ)
    env["MPIR_CVAR_DEVICE_COLLECTIVES"] = "none"
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env.pop("ZCOLL_CHECK", None)
    return env


def _descendants(pid: int) -> list:
    children: dict = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run(cmd: list, timeout: float = 120) -> tuple:
    """(exit status, stdout+stderr); on timeout the whole tree is killed and the status is -9."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate()
        return -9, f"TIMEOUT after {timeout} s\n{out}"


def mpirun(nprocs: int, *args: str, timeout: float = 120) -> tuple:
    return run([str(BIN_DIR / "mpirun"), "-prepend-rank", "-n", str(nprocs), *map(str, args)], timeout)


def mpirun_script(nprocs: int, script: str, *args: str, timeout: float = 180) -> str:
    """Runs tests/mpi/<script> on nprocs ranks; asserts it exits 0 and returns its output."""
    rc, out = mpirun(nprocs, sys.executable, "-m", "mpi4py", MPI_SCRIPTS / script, *args, timeout=timeout)
    assert rc == 0, f"{script} on {nprocs} ranks exited {rc}:\n{out[-20000:]}"
    return out
