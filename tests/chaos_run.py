"""The chaos run: training under `zcoll run` (restart recovery) while ranks are killed (SIGKILL) and
stopped (SIGSTOP) at random times, in the middle of checkpoint writes and in the middle of
recoveries. It must finish, with final parameters bit-identical to a fault-free run's, and no
committed checkpoint may ever be corrupt.

    python tests/chaos_run.py                               # 24 faults on 2 ranks (about 10 min, loaded)
    python tests/chaos_run.py --faults 40 --ranks 3 --seed 7
    python tests/chaos_run.py --plan stop:checkpoint,kill:recovery --steps 150   # the CI test's

1. Reference: the program (tests/mpi/chaos_train.py: an MLP under DDP on the zcoll backend,
   deterministic data, a checkpoint every --checkpoint-every steps) runs once under `zcoll run`
   without a fault: its final parameters' sha256 and its wall time.
2. Chaos: the same command in a fresh checkpoint directory, while this script injects the faults
   of the plan one after another. The plan (--faults, drawn by --seed, or --plan) is a list of
   SIGNAL:WHEN, signal kill or stop (half each), when:
     random      a random rank, a random moment (0.1 to --spread s) after its launch began training;
     checkpoint  a rank the moment it is seen writing a checkpoint (its state says checkpoint);
     recovery    a random rank of a launch that is recovering (from its start, through MPI's
                 start-up and the checkpoint's load, to replaying the steps lost), after a random
                 0 to --spread s.
   At least a quarter of the faults are checkpoint and a quarter recovery ones; the first is never
   a recovery. The ranks say where they are in $ZCOLL_CHAOS_STATE/rank-R.txt (chaos_train.py's
   docstring); the phase each fault landed in is read back after the signal (a killed or stopped
   process writes nothing more), so the table says where faults really landed.
   After each fault the script waits for that launch to end (survivors raise at the process
   group's --timeout, or hydra ends the job), checks the checkpoints, and goes on.
3. Checks: the run finishes (exit 0, CHAOS-DONE); its digest equals the reference's; after every
   launch every committed checkpoint (a manifest in the directory) has all its parts with the size
   and sha256 it lists (a part missing only because a newer save pruned it is not corrupt);
   no launch stalls (no rank's state changes for --stall s: a hang, reported with every rank's
   phase and killed); no process of the run is left; every planned fault was injected.
4. Output (--out, default build/chaos/<time>): table.txt, results.json (totals and every
   fault), run.txt and reference.txt (the jobs' output). Exit status 0 when every check passed.

Seconds lost per fault: from the fault to the moment a later launch is back at the step the run
had reached when the fault hit, or to the next fault if that comes first (the losses of a fault
within a recovery then add up to the run's). Recovery is restart (`zcoll run`).

    python tests/chaos_run.py --recovery shrink [its options]   # in-place recovery instead

runs tests/chaos_shrink.py (ULFM shrink with zcoll.torch.elastic.ElasticLoop on Open MPI: final
quality within a tolerance of a fault-free run's, not bit-identical; its --help says more).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import chaos_shrink
from chaos_table import aligned, by_kind, lost_cells, recovered, verdict, write_results
from mpi_util import ROOT, TESTS_DIR, job_env
from zcoll.core import checkpoint_files
from zcoll.tools.proc import kill_tree, run_tree

TRAIN = TESTS_DIR / "mpi" / "chaos_train.py"
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
WHENS = ("random", "checkpoint", "recovery")
_STATE = re.compile(
    r"launch=(\d+) rank=(\d+) pid=(\d+) phase=(\w+) step=(\d+) t=([\d.]+)"
)  # chaos_train.py's line
_DONE = re.compile(r"CHAOS-DONE digest=([0-9a-f]{64}) steps=(\d+)")


@dataclass
class Fault:
    number: int
    signal: str  # kill | stop
    when: str  # random | checkpoint | recovery
    rank: int = -1
    pid: int = 0
    launch: int = -1
    phase: str = ""  # where it landed, read back after the signal
    step: int = 0  # the victim's step then
    reached: int = 0  # the furthest step of the run then
    t: float = 0.0
    back: float | None = None  # when a later launch was back at `reached`
    lost: float | None = None
    cut: bool = False  # the next fault came before training was back


def make_plan(faults: int, seed: int) -> list[Fault]:
    """faults SIGNAL:WHEN pairs: a quarter each (at least one) checkpoint and recovery, the rest
    random; kill and stop half each (both when there are two or more); shuffled by seed; the first
    never a recovery (there is none to land in yet)."""
    rng = random.Random(seed)
    quarter = max(1, faults // 4)
    whens = ["checkpoint"] * quarter + ["recovery"] * quarter
    whens = (whens + ["random"] * faults)[:faults]
    signals = ["kill", "stop"] * faults
    signals = signals[:faults]
    rng.shuffle(whens)
    rng.shuffle(signals)
    if whens[0] == "recovery":
        other = next((i for i, w in enumerate(whens) if w != "recovery"), None)
        if other is None:
            raise SystemExit("a plan of recovery faults only has nothing to recover from")
        whens[0], whens[other] = whens[other], whens[0]
    return [Fault(i + 1, s, w) for i, (s, w) in enumerate(zip(signals, whens))]


def parse_plan(text: str) -> list[Fault]:
    plan = []
    for i, item in enumerate(t for t in text.split(",") if t.strip()):
        sig, _, when = item.strip().partition(":")
        if sig not in SIGNALS or when not in WHENS:
            raise SystemExit(
                f"--plan: {item!r} is not SIGNAL:WHEN (signal kill|stop, when {'|'.join(WHENS)})"
            )
        plan.append(Fault(i + 1, sig, when))
    if plan and plan[0].when == "recovery":
        raise SystemExit("--plan: the first fault cannot be a recovery one (nothing to recover from yet)")
    return plan


def read_states(directory: Path) -> dict[int, dict]:
    """rank -> its state line's fields (chaos_train.py's docstring, 2.)."""
    states = {}
    for f in directory.glob("rank-*.txt"):
        try:
            m = _STATE.search(f.read_text())
        except OSError:
            continue
        if m:
            states[int(m[2])] = {
                "launch": int(m[1]), "rank": int(m[2]), "pid": int(m[3]), "phase": m[4], "step": int(m[5]),
                "t": float(m[6]),
            }  # fmt: skip
    return states


def process_state(pid: int) -> str:
    """The kernel's one-letter state of pid ('' when gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return "" if s in ("Z", "X") else s


def check_checkpoints(directory: Path) -> dict:
    """Every committed checkpoint in directory: its parts whole (size and sha256 as listed). A part
    gone while its manifest is gone too was pruned by a newer save, which is not corruption."""
    bad, manifests, temps = [], 0, 0
    if directory.is_dir():
        temps = sum(1 for _ in directory.rglob(".*.tmp-*"))
        for f in sorted(directory.glob("step-*.json")):
            try:
                m = checkpoint_files.read_manifest(f)
            except ValueError as e:
                if f.exists():
                    bad.append(str(e))
                continue
            manifests += 1
            for part in m.parts():
                try:
                    checkpoint_files.read_part(m, part)
                except (OSError, ValueError) as e:
                    if f.exists():
                        bad.append(f"{f.name}: {e}")
    latest = checkpoint_files.latest(directory) if directory.is_dir() else None
    return {
        "manifests": manifests,
        "bad": bad,
        "latest": latest.step if latest else None,
        "temp_files": temps,
    }


def command(args: argparse.Namespace, ckpt: Path, out: Path, restarts: int) -> list[str]:
    return [
        sys.executable, "-m", "zcoll", "run", "-n", str(args.ranks), "--max-restarts", str(restarts),
        "--checkpoint-dir", str(ckpt), "--",
        sys.executable, str(TRAIN), "--steps", str(args.steps), "--checkpoint-every", str(args.checkpoint_every),
        "--hidden", str(args.hidden), "--timeout", str(args.timeout),
        "--startup-deadline", str(args.startup_deadline), "--out", str(out),
    ]  # fmt: skip


def say(text: str) -> None:
    print(text, flush=True)


class Chaos:
    """Runs one `zcoll run` job and injects the plan's faults into it (module docstring, 2.)."""

    def __init__(self, args: argparse.Namespace, plan: list[Fault], work: Path) -> None:
        self.args, self.plan, self.work = args, plan, work
        self.rng = random.Random(args.seed + 1)
        self.state_dir, self.ckpt = work / "state", work / "ckpt"
        self.state_dir.mkdir(parents=True)
        self.next = 0  # index of the next fault of the plan
        self.target: float | None = None  # when the armed fault fires
        self.armed_launch = -1
        self.ending: tuple[int, list[int]] | None = None  # (launch, pids) waited for after a fault
        self.reached = 0  # furthest step seen
        self.seen: dict[int, str] = {}  # rank -> its last state line, to see change
        self.last_change = time.time()
        self.pids: set[int] = set()
        self.scans: list[dict] = []
        self.problems: list[str] = []
        self.started = time.time()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, log: Path) -> int:
        cmd = command(self.args, self.ckpt, self.work / "final.txt", len(self.plan) + 5)
        env = job_env({"ZCOLL_CHAOS_STATE": str(self.state_dir)})
        self.started = time.time()
        with open(log, "w") as out:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
            try:
                while proc.poll() is None:
                    if not self.step(time.time()):
                        kill_tree(proc)
                        break
                    time.sleep(0.003)
            finally:
                if proc.poll() is None:
                    kill_tree(proc)
                proc.wait()
        self.scans.append(check_checkpoints(self.ckpt))
        self.account(time.time(), self.states())
        self.leftovers()
        return proc.returncode

    def states(self) -> dict[int, dict]:
        return read_states(self.state_dir)

    def step(self, now: float) -> bool:
        """One look at the ranks; False when the run stalled (a hang)."""
        st = self.states()
        for r, s in st.items():
            key = f"{s['launch']} {s['pid']} {s['phase']} {s['step']}"
            if self.seen.get(r) != key:
                self.seen[r], self.last_change = key, now
                self.pids.add(s["pid"])
        self.account(now, st)
        if self.ending is not None:
            launch, pids = self.ending
            if all(not process_state(p) for p in pids):
                self.ending = None
                self.scans.append(check_checkpoints(self.ckpt))
                scan = self.scans[-1]
                say(f"    launch {launch} ended; checkpoints: {scan['manifests']} committed, newest step "
                    f"{scan['latest']}, {len(scan['bad'])} corrupt, {scan['temp_files']} temp files of cut writes")  # fmt: skip
        elif self.next < len(self.plan):
            self.maybe_fire(now, st)
        if now - self.last_change > self.args.stall:
            phases = ", ".join(
                f"rank {r}: launch {s['launch']} {s['phase']} step {s['step']} pid {s['pid']} "
                f"({process_state(s['pid']) or 'gone'})"
                for r, s in sorted(st.items())
            )
            self.problems.append(f"hang: no rank's state changed for {self.args.stall:.0f} s ({phases})")
            say(f"HANG: {self.problems[-1]}")
            return False
        return True

    # -- faults -----------------------------------------------------------------------------------
    def current(self, st: dict[int, dict]) -> tuple[int, dict[int, dict]]:
        """The newest launch and its ranks' states (only those that have written one)."""
        launch = max((s["launch"] for s in st.values()), default=-1)
        return launch, {r: s for r, s in st.items() if s["launch"] == launch and process_state(s["pid"])}

    def recovering(self, s: dict) -> bool:
        return s["phase"] in ("start", "load") or (s["phase"] != "done" and s["step"] < self.reached)

    def maybe_fire(self, now: float, st: dict[int, dict]) -> None:
        f = self.plan[self.next]
        launch, mine = self.current(st)
        last = self.plan[self.next - 1].launch if self.next else -1
        if launch < 0 or launch <= last or any(s["phase"] == "done" for s in mine.values()):
            return
        if f.when == "checkpoint":
            writing = [r for r, s in mine.items() if s["phase"] == "checkpoint"]
            if writing:
                self.fire(f, self.rng.choice(writing), mine, now)
            return
        if f.when == "random":
            ready = len(mine) == self.args.ranks and all(
                s["phase"] in ("train", "checkpoint") for s in mine.values()
            )
        else:
            ready = bool(mine) and any(self.recovering(s) for s in mine.values())
        if self.armed_launch != launch:
            if not ready:
                return
            self.armed_launch, low = launch, 0.1 if f.when == "random" else 0.0
            self.target = now + self.rng.uniform(low, self.args.spread)
        if now >= self.target:
            pool = [r for r, s in mine.items() if f.when == "random" or self.recovering(s)] or list(mine)
            self.fire(f, self.rng.choice(pool), mine, now)

    def fire(self, f: Fault, rank: int, mine: dict[int, dict], now: float) -> None:
        s = mine[rank]
        try:
            os.kill(s["pid"], SIGNALS[f.signal])
        except ProcessLookupError:
            return  # it ended meanwhile; the next look picks again
        f.t, f.rank, f.pid, f.launch, f.reached = time.time(), rank, s["pid"], s["launch"], self.reached
        after = read_states(self.state_dir).get(rank, s)  # what it wrote last: where the signal landed
        f.phase, f.step = (
            (after["phase"], after["step"]) if after["pid"] == s["pid"] else (s["phase"], s["step"])
        )
        if f.phase == "train" and f.step < f.reached:
            f.phase = "replay"  # training again the steps the last fault lost
        self.next += 1
        self.armed_launch, self.target = -1, None
        self.ending = (f.launch, [x["pid"] for x in mine.values()])
        say(f"[fault {f.number}/{len(self.plan)}, {f.t - self.started:.1f} s] SIG{f.signal.upper()} rank {rank} "
            f"(pid {f.pid}, launch {f.launch}) {f.when}: landed in {f.phase} at step {f.step} "
            f"(run at step {f.reached})")  # fmt: skip

    def account(self, now: float, st: dict[int, dict]) -> None:
        """Steps reached, and when each fault's training was back where it was."""
        for s in st.values():
            if s["phase"] in ("train", "checkpoint", "done"):
                self.reached = max(self.reached, s["step"])
        for i, f in enumerate(self.plan[: self.next]):
            if f.back is not None or f.cut:
                continue
            back = [s["t"] for s in st.values() if s["launch"] > f.launch and s["step"] >= f.reached
                    and s["phase"] in ("train", "checkpoint", "done")]  # fmt: skip
            if back:
                f.back, f.lost = min(back), min(back) - f.t
                say(f"    fault {f.number}: training back at step {f.reached} after {f.lost:.1f} s")
            elif i + 1 < self.next:
                f.cut, f.lost = True, self.plan[i + 1].t - f.t

    def leftovers(self) -> None:
        """Processes of the run still there after it ended: killed, and a problem."""
        left = [p for p in self.pids if process_state(p)]
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:
            self.problems.append(f"processes left after the run: {left}")


# -- the reference, the table, the command line ----------------------------------------------------
def reference(args: argparse.Namespace, work: Path) -> tuple[str | None, float, int]:
    """The fault-free run: (digest, seconds, exit status)."""
    work.mkdir(parents=True)
    start = time.time()
    cmd = command(args, work / "ckpt", work / "final.txt", 0)
    finished, timed_out = run_tree(cmd, job_env(), args.stall * 3)
    (work / "reference.txt").write_text(finished.output)
    rc = -1 if timed_out else finished.returncode
    return final_digest(work / "final.txt"), time.time() - start, rc


def final_digest(path: Path) -> str | None:
    m = re.search(r"digest=([0-9a-f]{64})", path.read_text()) if path.exists() else None
    return m[1] if m else None


def table(faults: list[Fault], restarts: int | None) -> str:
    """Faults by signal and when: where they landed, recovered (training back at its step), the
    seconds lost (median, max)."""
    rows = [("signal", "when", "faults", "landed in", "recovered", "lost s: median", "max")]
    for (sig, when), fs in by_kind(faults).items():
        landed: dict[str, int] = {}
        for f in fs:
            landed[f.phase] = landed.get(f.phase, 0) + 1
        where = ", ".join(f"{p} {n}" for p, n in sorted(landed.items()))
        rows.append((sig, when, str(len(fs)), where, recovered(fs), *lost_cells(fs, 1)))
    rows.append(("all", "", str(len(faults)), "", recovered(faults), *lost_cells(faults, 1)))
    lines = aligned(rows)
    lines.append(
        f"recoveries: {restarts if restarts is not None else '?'} restarts by `zcoll run` (restart recovery)"
    )
    return "\n".join(lines)


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", type=int, default=24, help="faults to inject, drawn by --seed (default 24)")
    p.add_argument(
        "--plan",
        default=None,
        help="the faults instead: SIGNAL:WHEN,... (kill|stop : random|checkpoint|recovery)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ranks", type=int, default=2, help="ranks of the job (default 2)")
    p.add_argument(
        "--steps",
        type=int,
        default=2000,
        help="training steps (default 2000: a fault-free run of about a minute)",
    )
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints (default 20)")
    p.add_argument("--hidden", type=int, default=256, help="the model's hidden width (default 256)")
    p.add_argument(
        "--timeout", type=float, default=3.0, help="the process group's timeout, seconds (default 3)"
    )
    p.add_argument(
        "--startup-deadline", type=float, default=30.0, help="chaos_train.py's start-up guard (default 30 s)"
    )
    p.add_argument(
        "--spread",
        type=float,
        default=2.0,
        help="random and recovery faults land up to this many s in (default 2)",
    )
    p.add_argument(
        "--stall",
        type=float,
        default=None,
        help="seconds without progress that make a hang (default: start-up deadline + 4 timeouts + 30)",
    )
    p.add_argument("--out", type=Path, default=None, help="where the results go (default build/chaos/<time>)")
    p.add_argument(
        "--recovery",
        choices=("restart", "shrink"),
        default="restart",
        help="shrink (first argument): the in-place chaos run, tests/chaos_shrink.py, with its own options",
    )
    args = p.parse_args(argv)
    if args.stall is None:
        args.stall = args.startup_deadline + 4 * args.timeout + 30
    if args.ranks < 2 or args.faults < 1:
        p.error("need --ranks >= 2 and --faults >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["--recovery", "shrink"]:
        return chaos_shrink.main(argv[2:])
    args = options(argv)
    plan = parse_plan(args.plan) if args.plan else make_plan(args.faults, args.seed)
    out = args.out or ROOT / "build" / "chaos" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    say(
        f"plan ({len(plan)} faults, seed {args.seed}): --plan {','.join(f'{f.signal}:{f.when}' for f in plan)}"
    )
    want, plain_s, rc = reference(args, out / "reference")
    say(f"fault-free run: {plain_s:.1f} s, exit {rc}, digest {want}")
    chaos = Chaos(args, plan, out / "chaos")
    start = time.time()
    rc = chaos.run(out / "run.txt")
    seconds = time.time() - start
    text = (out / "run.txt").read_text(errors="replace")
    got = final_digest(out / "chaos" / "final.txt")
    m = re.search(r"finished after (\d+) restarts?", text)
    restarts = int(m[1]) if m else None
    problems = list(chaos.problems)
    injected = [f for f in plan if f.pid]
    if len(injected) < len(plan):
        problems.append(
            f"only {len(injected)} of {len(plan)} faults injected (the training ended first: more --steps)"
        )
    if rc != 0 or not _DONE.search(text):
        problems.append(f"the run did not finish: `zcoll run` exit {rc}")
    if want is None or got != want:
        problems.append(f"final parameters differ: digest {got}, fault-free {want}")
    bad = [b for scan in chaos.scans for b in scan["bad"]]
    problems += [f"corrupt checkpoint: {b}" for b in bad]
    lines = [table(injected, restarts), ""]
    lines.append(f"checkpoints: checked after each of {len(chaos.scans)} launch ends; {len(bad)} corrupt; "
                 f"temp files of cut writes seen: {max((s['temp_files'] for s in chaos.scans), default=0)}")  # fmt: skip
    lines.append(
        f"final parameters: sha256 {got}: "
        + ("identical to the fault-free run's" if got == want else f"DIFFERENT from {want}")
    )
    lost = sum(f.lost or 0 for f in injected)
    lines.append(f"wall: fault-free {plain_s:.1f} s, with {len(injected)} faults {seconds:.1f} s "
                 f"({seconds - plain_s:.1f} s more; per-fault losses sum to {lost:.1f} s)")  # fmt: skip
    lines += ["", verdict(problems)]
    results = {
        "plan": len(plan), "faults": len(injected), "restarts": restarts, "identical": got == want and got is not None,
        "digest": got, "reference_digest": want, "corrupt": len(bad), "scans": len(chaos.scans),
        "hangs": sum(p.startswith("hang") for p in problems), "problems": problems, "seconds": seconds,
        "reference_seconds": plain_s, "fault_list": [asdict(f) for f in plan],
    }  # fmt: skip
    write_results(out, "\n".join(lines), results)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
