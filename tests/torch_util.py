"""Launcher for the PyTorch tests: scripts under a real mpirun, results reported per case.

A script in tests/torch_mpi/ defines ``case_<name>()`` functions and ends with
``run_cases(globals())`` (from ``torch_mpi/_cases.py``). Each case runs on every rank; when all
ranks finish it, rank 0 prints ``ZCOLL-CASE <name> PASS``. A failing rank prints
``ZCOLL-CASE <name> FAIL`` with its traceback and re-raises, and ``python -m mpi4py`` aborts the
whole job, so a failure never leaves the other ranks hanging. Every launch has a timeout after
which the job's whole process group is killed.

Example (in a test module)::

    RESULTS = CaseResults("collectives.py", ranks=3)
    @pytest.mark.parametrize("case", case_names("collectives.py"))
    def test_collectives(case):
        RESULTS.check(case)
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "torch_mpi"
_CASE = re.compile(r"ZCOLL-CASE (\S+) (PASS|FAIL)")


def mpirun_exe() -> str:
    exe = shutil.which(
        "mpirun", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    )
    if exe is None:
        raise RuntimeError("mpirun not found next to this Python or on PATH (./dev.sh test installs it)")
    return exe


# Launcher variables a developer's shell may hold; a test that wants them passes them explicitly.
_DROP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")


def run(
    cmd: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None
) -> subprocess.CompletedProcess:
    """Runs cmd in its own process group; kills the group on timeout. Output: stdout + stderr."""
    full_env = {k: v for k, v in os.environ.items() if k not in _DROP}
    full_env.update(env or {})
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[torch_util] TIMEOUT after {timeout:.0f} s: killed {' '.join(cmd)}\n"
        return subprocess.CompletedProcess(cmd, -9, out, None)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def mpirun(
    script: str, ranks: int, *args: str, timeout: float = 180, env: Optional[Dict[str, str]] = None
) -> subprocess.CompletedProcess:
    """``mpirun -n ranks python -m mpi4py tests/torch_mpi/<script> args...``."""
    env = dict(env or {})
    env.setdefault("MPIR_CVAR_DEVICE_COLLECTIVES", "none")  # MPICH's own collectives spin when oversubscribed
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [mpirun_exe(), "-n", str(ranks), sys.executable, "-m", "mpi4py", str(SCRIPTS / script), *args]
    return run(cmd, timeout, env)


def case_names(script: str) -> List[str]:
    """The ``case_*`` functions a script defines, in file order (read without importing it)."""
    tree = ast.parse((SCRIPTS / script).read_text())
    return [n.name[5:] for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("case_")]


class CaseResults:
    """Launches a script once (on first use) and answers per case."""

    def __init__(self, script: str, ranks: int, *args: str, timeout: float = 240):
        self.script, self.ranks, self.args, self.timeout = script, ranks, args, timeout
        self._result: Optional[subprocess.CompletedProcess] = None
        self._status: Dict[str, str] = {}

    def result(self) -> subprocess.CompletedProcess:
        if self._result is None:
            self._result = mpirun(self.script, self.ranks, *self.args, timeout=self.timeout)
            for m in _CASE.finditer(self._result.stdout):
                if self._status.get(m.group(1)) != "FAIL":
                    self._status[m.group(1)] = m.group(2)
        return self._result

    def check(self, case: str) -> None:
        res = self.result()
        status = self._status.get(case)
        if status == "PASS":
            return
        what = "failed" if status == "FAIL" else f"was not reached (job exit code {res.returncode})"
        raise AssertionError(f"{self.script} on {self.ranks} ranks: case {case} {what}\n{res.stdout[-6000:]}")
