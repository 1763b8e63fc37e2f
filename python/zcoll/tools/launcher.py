"""`zcoll run`: runs an MPI job under the real launcher and restarts it from its last checkpoint
when it fails, on fewer ranks when a node is gone (elastic by restart, as torchrun does it).

    zcoll run -n 4 [--max-restarts 3] [--min-ranks 3] [--checkpoint-dir ckpt] [--hosts FILE]
              [--health-check CMD] [--launcher auto|mpirun|srun] [-L ARG ...] -- python train.py ...

1. Launch: hydra's ``mpirun`` from this environment (or ``srun`` under Slurm) with ``-n P`` and
   the program; the job's environment gains ZCOLL_RESTART=k (0 on the first launch, k on the k-th
   restart) and ZCOLL_CHECKPOINT_DIR (when given). Its output passes through untouched.
2. Watch: exit status 0 ends the run. Anything else (a rank that raised, was killed, or timed out
   in a collective: every MPI job then exits non-zero) is a failure, and the job is launched again
   while restarts are left. The program resumes itself from the newest complete checkpoint
   (``zcoll.torch.checkpoint.load``); ``zcoll run`` says which one that is.
3. Ranks: before every launch, the capacity: the slots of the --hosts file (hydra's format,
   ``host[:slots]`` per line, read again every time: a removed line is a node gone) on the hosts
   that pass --health-check (``CMD HOST``, exit 0 within 60 s; without --hosts HOST is localhost
   and a failure stops the run). The job runs on min(-n, capacity) ranks when that is at least
   --min-ranks (default -n: no shrinking), with the healthy hosts only; otherwise `zcoll run`
   stops. A node that comes back is used again (up to -n ranks).
4. SIGINT or SIGTERM to `zcoll run` goes to the launcher and ends the run without a restart.
5. At the end, a summary: every launch with its ranks, exit status, seconds and the checkpoint it
   started from. The exit status is 0, or that of the last launch.
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from .. import _C
from ..core import checkpoint_files

HEALTH_CHECK_TIMEOUT = 60.0


def say(message: str) -> None:
    print(f"zcoll run: {message}", file=sys.stderr, flush=True)


# -- capacity: hosts and health checks ---------------------------------------------------------------
@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def read_hosts(path: Path) -> List[Host]:
    """A hydra host file: ``host[:slots]`` per line (slots default 1), ``#`` comments."""
    hosts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, _, slots = text.partition(":")
        if not name or (slots and not slots.isdigit()) or slots == "0":
            raise ValueError(f"{path}:{number}: expected host[:slots] with slots >= 1, got {line!r}")
        hosts.append(Host(name, int(slots) if slots else 1))
    return hosts


def healthy(hosts: Sequence[Host], check: Optional[str], env: dict) -> Tuple[List[Host], List[str]]:
    """(hosts that pass `check`, a reason for each one left out)."""
    if not check:
        return list(hosts), []
    ok, dropped = [], []
    for h in hosts:
        try:
            rc = subprocess.run(
                [*shlex.split(check), h.name],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                timeout=HEALTH_CHECK_TIMEOUT,
            ).returncode
            why = None if rc == 0 else f"{h.name} failed its health check (exit {rc})"
        except subprocess.TimeoutExpired:
            why = f"{h.name}: health check still running after {HEALTH_CHECK_TIMEOUT:.0f} s"
        except OSError as e:
            why = f"{h.name}: health check could not run: {e}"
        if why:
            dropped.append(why)
        else:
            ok.append(h)
    return ok, dropped


@dataclass
class Plan:
    """One launch: how many ranks, on which hosts (None: the launcher's default placement)."""

    ranks: int
    hosts: Optional[List[Host]]
    notes: List[str] = field(default_factory=list)  # why hosts were left out


def plan(requested: int, min_ranks: int, hosts_file: Optional[Path], check: Optional[str], env: dict) -> Plan:
    """The ranks and hosts of the next launch (module docstring, 3.); ranks 0 when fewer than
    min_ranks can run."""
    if hosts_file is None:
        ok, notes = healthy([Host("localhost", requested)], check, env)
        return Plan(requested if ok else 0, None, notes)
    try:
        listed = read_hosts(hosts_file)
    except (OSError, ValueError) as e:
        return Plan(0, [], [f"cannot use the hosts file: {e}"])
    ok, notes = healthy(listed, check, env)
    capacity = sum(h.slots for h in ok)
    ranks = min(requested, capacity)
    return Plan(ranks if ranks >= min_ranks else 0, ok, notes)


# -- the launcher's command line --------------------------------------------------------------------
def find_launcher(kind: str) -> Tuple[str, str]:
    """(kind, path): auto picks srun inside a Slurm allocation, else mpirun; mpirun is the one
    beside this Python (the venv's hydra) before any on PATH."""
    if kind == "auto":
        kind = "srun" if "SLURM_JOB_ID" in os.environ and shutil.which("srun") else "mpirun"
    if kind == "mpirun":
        beside = Path(sys.executable).parent / "mpirun"
        path = str(beside) if beside.exists() else shutil.which("mpirun")
    else:
        path = shutil.which("srun")
    if not path:
        raise SystemExit(f"zcoll run: no {kind} found (on PATH or beside {sys.executable})")
    return kind, path


@functools.cache
def mpirun_is_open_mpi(path: str) -> bool:
    """Open MPI's mpirun takes `--hostfile`, hydra's `-f` (their formats: write_hostfile)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out


def launch_argv(
    kind: str, path: str, p: Plan, hostfile: Optional[Path], extra: Sequence[str], program: Sequence[str]
) -> List[str]:
    argv = [path, "-n", str(p.ranks)]
    if p.hosts is not None:
        if kind == "mpirun" and mpirun_is_open_mpi(path):
            argv += ["--hostfile", str(hostfile), *open_mpi_binding(extra)]
        elif kind == "mpirun":
            argv += ["-f", str(hostfile)]
        else:
            argv += [f"--nodelist={','.join(h.name for h in p.hosts)}"]
    return [*argv, *extra, *program]


def open_mpi_binding(extra: Sequence[str]) -> List[str]:
    """prterun takes a host file's slots as the cores it may bind to, one rank per core, and
    refuses a job whose slots outnumber a host's cores ("binding ... more cpus than are
    available"); hydra binds nothing unless asked. So: no binding, as hydra, unless the
    launcher arguments choose one themselves."""
    if any(a.lstrip("-").startswith("bind-to") for a in extra):
        return []
    return ["--bind-to", "none"]


def write_hostfile(hosts: Sequence[Host], folder: Path, open_mpi: bool = False) -> Path:
    """hydra: `host:slots`. Open MPI: the name once per slot, which it adds up, where `slots=n`
    lines for two names of one node (localhost, 127.0.0.1) are refused as a double definition."""
    path = folder / "hosts"
    if open_mpi:
        path.write_text("".join(f"{h.name}\n" * h.slots for h in hosts))
    else:
        path.write_text("".join(f"{h.name}:{h.slots}\n" for h in hosts))
    return path


# -- one launch -----------------------------------------------------------------------------------
@dataclass
class Launch:
    number: int
    ranks: int
    resumed_from: str
    returncode: int = 0
    seconds: float = 0.0


def describe_exit(rc: int) -> str:
    if rc < 0:
        return f"the launcher was killed by {signal.Signals(-rc).name}"
    if rc in (int(signal.SIGKILL), int(signal.SIGTERM), int(signal.SIGSEGV), int(signal.SIGABRT)):
        return f"exit {rc} (hydra reports a rank ended by {signal.Signals(rc).name} this way)"
    return f"exit {rc}"


def run_once(argv: List[str], env: dict) -> Tuple[int, Optional[int]]:
    """Runs the launcher to its end; (its exit status, the signal that interrupted us or None).
    SIGINT / SIGTERM received meanwhile are passed on to it."""
    proc = subprocess.Popen(argv, env=env)
    received: List[int] = []

    def forward(signum, _frame):
        received.append(signum)
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return rc, (received[0] if received else None)


def checkpoint_text(directory: Optional[Path]) -> str:
    if directory is None:
        return "-"
    m = checkpoint_files.newest_under(directory)
    if m is None:
        return "none yet"
    where = os.path.relpath(m.path, directory)
    return f"step {m.step} ({where}, saved by {m.world_size} ranks)"


# -- the command ------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--ranks", type=int, required=True, help="ranks to run (the most; see --min-ranks)")
    p.add_argument(
        "--max-restarts", type=int, default=3, help="launches after the first one, at most (default 3)"
    )
    p.add_argument(
        "--min-ranks",
        type=int,
        default=None,
        help="relaunch on fewer ranks, down to this many, when hosts are gone (default: -n, never fewer)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="passed to the job as ZCOLL_CHECKPOINT_DIR (default: that variable's value, if set)",
    )
    p.add_argument(
        "--hosts",
        type=Path,
        default=None,
        help="host file (hydra's host[:slots] lines), read before every launch",
    )
    p.add_argument(
        "--health-check",
        default=None,
        metavar="CMD",
        help="run as `CMD HOST` for every host before every launch; hosts where it fails are left out",
    )
    p.add_argument(
        "--launcher",
        choices=["auto", "mpirun", "srun"],
        default="auto",
        help="default: srun under Slurm, else mpirun",
    )
    p.add_argument(
        "-L",
        "--launcher-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for the launcher, e.g. -L=-prepend-rank (repeatable)",
    )
    p.add_argument("program", nargs=argparse.REMAINDER, help="-- the program and its arguments")


def run(args: argparse.Namespace) -> int:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise SystemExit("zcoll run: no program given; usage: zcoll run -n 4 -- python train.py")
    min_ranks = args.ranks if args.min_ranks is None else args.min_ranks
    if not 1 <= min_ranks <= args.ranks or args.max_restarts < 0:
        raise SystemExit(
            f"zcoll run: need 1 <= --min-ranks ({min_ranks}) <= -n ({args.ranks}) and --max-restarts >= 0"
        )
    ckpt = args.checkpoint_dir or _C.env_get("ZCOLL_CHECKPOINT_DIR") or None
    ckpt_dir = Path(ckpt).resolve() if ckpt else None
    kind, path = find_launcher(args.launcher)
    env = dict(os.environ)
    if ckpt_dir is not None:
        env["ZCOLL_CHECKPOINT_DIR"] = str(ckpt_dir)

    launches: List[Launch] = []
    changes: List[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zcoll-run-") as scratch:
        for number in range(args.max_restarts + 1):
            env["ZCOLL_RESTART"] = str(number)
            p = plan(args.ranks, min_ranks, args.hosts, args.health_check, env)
            for note in p.notes:
                say(note)
            if p.ranks == 0:
                say(f"fewer than --min-ranks {min_ranks} ranks can run; giving up")
                break
            last_ranks = launches[-1].ranks if launches else args.ranks
            if p.ranks != last_ranks:
                change = f"ranks {last_ranks} -> {p.ranks} at launch {number}"
                say(change)
                changes.append(change + "".join(f"; {note}" for note in p.notes))
            hostfile = None
            if p.hosts is not None and kind == "mpirun":
                hostfile = write_hostfile(p.hosts, Path(scratch), mpirun_is_open_mpi(path))
            argv = launch_argv(kind, path, p, hostfile, args.launcher_arg, program)
            launch = Launch(number, p.ranks, checkpoint_text(ckpt_dir))
            what = "launch" if number == 0 else f"restart {number} of {args.max_restarts}"
            say(f"{what} on {p.ranks} ranks, checkpoint: {launch.resumed_from}: {shlex.join(argv)}")
            t0 = time.monotonic()
            launch.returncode, interrupted = run_once(argv, env)
            launch.seconds = time.monotonic() - t0
            launches.append(launch)
            if launch.returncode == 0:
                break
            say(f"launch {number} failed after {launch.seconds:.1f} s: {describe_exit(launch.returncode)}")
            if interrupted is not None:
                say(f"stopped by {signal.Signals(interrupted).name}; not restarting")
                break
            if number == args.max_restarts:
                say(f"no restarts left (--max-restarts {args.max_restarts})")
    summarise(launches, changes, time.monotonic() - start)
    return launches[-1].returncode if launches else 1


def summarise(launches: List[Launch], changes: List[str], seconds: float) -> None:
    ok = bool(launches) and launches[-1].returncode == 0
    restarts = max(len(launches) - 1, 0)
    say(
        f"{'finished' if ok else 'FAILED'} after {restarts} restart{'s' * (restarts != 1)} in {seconds:.1f} s"
    )
    rows = [("launch", "ranks", "exit", "seconds", "started from checkpoint")]
    rows += [
        (str(l.number), str(l.ranks), str(l.returncode), f"{l.seconds:.1f}", l.resumed_from) for l in launches
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        say("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    for c in changes:
        say(f"  {c}")
