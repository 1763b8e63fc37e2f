"""Running a command under a deadline that kills its whole process tree, for tests and scripts.

run_tree(cmd, env, timeout) starts cmd in a new session with stdin closed and stdout + stderr in
one stream, and returns (Finished(returncode, output), timed_out). On timeout every process below
it is killed first: hydra's proxies (and `ip netns exec`) start sessions of their own, so the tree
is walked through /proc rather than trusting the process group. tests/mpi_util.py builds the
test launcher on it; bench/testbed.py runs jobs in its emulated cluster with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Sequence


class Finished(NamedTuple):
    returncode: int
    output: str  # stdout and stderr, interleaved as written


def descendants(pid: int) -> list:
    """Every process below pid, found through /proc (hydra's proxies call setsid)."""
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


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to proc's process group and to every process below it."""
    pids = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_tree(cmd: Sequence, env: Optional[Mapping[str, str]], timeout: float, cwd=None) -> tuple:
    """(Finished, timed_out). env None: this process's environment. On timeout (and on an
    exception such as KeyboardInterrupt while waiting) the whole tree is killed first."""
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return Finished(proc.returncode, out), False
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, _ = proc.communicate()
        return Finished(proc.returncode, out), True
    except BaseException:
        kill_tree(proc)
        proc.communicate()
        raise
