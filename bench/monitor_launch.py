"""The launch scaffold of the monitor benchmarks (monitor_overhead.py, monitor_breakdown.py).

1. A monitor (zcoll.tools.monitor_server's app over a MonitorState, no history, no page) served
   by this process on a free loopback port.
2. The job: the calling script again with --job under ``mpirun -n RANKS``, pointed at it.
3. What the monitor's side cost meanwhile: this process's CPU seconds (the server's thread, its
   event loop parsing the ranks' POSTs, and this process reading the job's output), and its CPU
   per second idle (the IDLE_SECONDS before the job: what it costs with nothing posted).

Also the CPU clock of one thread (its own clock, ns resolution, any thread of this process) and
the ranks' "<tag> {json}" lines, for the jobs' figures.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

IDLE_SECONDS = 3.0  # the served monitor's CPU with nothing posted, measured before the job
ENV = {"MPIR_CVAR_DEVICE_COLLECTIVES": "none", "OMP_NUM_THREADS": "1"}


def thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds of a live thread of this process; 0 when it has ended."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, TypeError, ProcessLookupError):
        return 0.0


def launch(script: str, argv: list[str], ranks: int, timeout: float) -> dict[str, Any]:
    """Runs `script` --job (with `argv`) under mpirun against a monitor served here: exit code,
    output lines, the MonitorState, the job's wall seconds and this process's CPU seconds."""
    from zcoll.observe import serve
    from zcoll.observe.monitor_state import MonitorState
    from zcoll.tools import monitor_server
    from zcoll.tools.proc import stream

    state = MonitorState()
    server = serve.serve(monitor_server.make_app(state), "127.0.0.1", 0)
    mpirun = str(Path(sys.executable).parent / "mpirun")
    cmd = [mpirun, "-n", str(ranks), sys.executable, "-m", "mpi4py", script, "--job", f"--url={server.url}",
           *[a for a in argv if a != "--job"]]  # fmt: skip
    idle = time.process_time()
    time.sleep(IDLE_SECONDS)
    idle = (time.process_time() - idle) / IDLE_SECONDS
    cpu, wall = time.process_time(), time.monotonic()
    rc, lines = stream(cmd, {**os.environ, **ENV}, timeout)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    server.close()
    return {"rc": rc, "lines": lines, "state": state, "wall_s": wall, "monitor_cpu_s": cpu,
            "monitor_idle_cpu_per_s": idle}  # fmt: skip


def tagged(lines: list[str], tag: str) -> list[dict[str, Any]]:
    """The JSON documents the ranks printed after `tag` (two ranks' lines can arrive as one)."""
    out = []
    for line in lines:
        for chunk in line.split(tag)[1:]:
            out.append(json.JSONDecoder().raw_decode(chunk)[0])
    return out
