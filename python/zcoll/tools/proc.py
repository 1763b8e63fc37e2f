"""Running a command under a deadline that kills its whole process tree, and saying how it died.

1. run_tree(cmd, env, timeout) starts cmd in a new session with stdin closed and stdout + stderr
   in one stream, and returns (Finished(returncode, output), timed_out). On timeout every process
   below it is killed first: hydra's proxies (and `ip netns exec`) start sessions of their own, so
   the tree is walked through /proc rather than trusting the process group.
2. stream(cmd, env, timeout) does the same while echoing the output as it comes (a benchmark's
   jobs), and returns (exit status, lines).
3. failure_reason(lines, where) says in one line how a job died (a watchdog's thread dump, a C++
   exception, a Python error, the deadline); blamed(progress, labels) names what the ranks were
   doing then, from the progress files they write.

tests/mpi_util.py builds the test launcher on it; zcoll.tools.testbed runs jobs in its emulated
cluster with it; bench/ddp_step.py runs its training jobs with it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple


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


def stream(
    cmd: Sequence, env: Optional[Dict[str, str]], timeout: float, deadline: str = "deadline"
) -> Tuple[int, List[str]]:
    """Runs cmd, echoing its output indented; returns (exit status, lines). Past `timeout` (or on
    Ctrl-C) the whole process tree is killed, and a last line `(job killed after N s: <deadline>)`
    says so (`deadline`: what set it, e.g. a command-line flag)."""
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        kill_tree(proc)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    lines: List[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            print(f"    {lines[-1]}", flush=True)
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            kill_tree(proc)
            proc.wait()
    if expired.is_set():
        lines.append(f"(job killed after {timeout:.0f} s: {deadline})")
    return rc, lines


# -- how a job died ----------------------------------------------------------------------------------
def _watchdog_frames(lines: List[str]) -> List[str]:
    """file:line function of each thread's innermost frame in the first faulthandler dump
    (threading.py's waits left out)."""
    first = next(i for i, ln in enumerate(lines) if ln.startswith("Timeout ("))
    frames: List[str] = []
    for prev, ln in zip(lines[first:], lines[first + 1 :]):
        m = re.match(r'\s*File "(.+)", line (\d+) in (\S+)', ln)
        if m and "thread" in prev.lower() and "threading.py" not in m.group(1):
            frames.append(f"{Path(m.group(1)).name}:{m.group(2)} {m.group(3)}")
        if ln.startswith("Timeout (") and frames:
            break
    return frames


def failure_reason(lines: List[str], where: str) -> str:
    """One line saying how a job died: the watchdog's timeout (with where the threads were
    waiting: the innermost frame of each thread in the first dump), the deadline of stream(), a
    C++ exception, a Python error."""
    if any(ln.startswith("Timeout (") for ln in lines):  # faulthandler.dump_traceback_later fired
        frames = _watchdog_frames(lines)
        waiting = f"; threads in {', '.join(dict.fromkeys(frames))}" if frames else ""
        return f"hung ({where}): no progress, ended by the watchdog{waiting}"
    if lines and lines[-1].startswith("(job killed after "):
        return f"hung ({where}): {lines[-1].strip('()')}"
    for marker in ("what():", "Error:", "Error"):
        hits = [ln for ln in lines if marker in ln]
        if hits:
            return f"crashed ({where}): {hits[-1].split(']: ', 1)[-1].strip()[:200]}"
    return f"failed ({where}): exit without a message"


def blamed(progress: Path, labels: List[str]) -> Optional[Tuple[str, str]]:
    """(label, phase) most ranks were at when the job died, from their progress files: each rank
    keeps a file rank<r> in `progress` holding "<phase> <label> ..."; labels not in `labels`
    (a job that finished writes "done -") blame no one."""
    seen = []
    for f in sorted(Path(progress).glob("rank*")):
        words = f.read_text().split()
        if len(words) >= 2 and words[1] in labels:
            seen.append((words[1], words[0]))
    return max(set(seen), key=seen.count) if seen else None
