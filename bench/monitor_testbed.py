#!/usr/bin/env python3
"""zcoll monitor on the emulated two-node cluster (root): a slow link injected while a job runs,
timed until the page in a real headless browser shows it; and suggestions drawn from the
history of real runs.

Both modes:

1. zcoll.tools.testbed: nodes 0 and 1 (one rank each, network namespaces, --rate both ways).
2. This process joins node 0's network namespace and serves zcoll monitor on node 0's address
   (10.77.0.1, so both ranks reach it: --public with a token, as the monitor requires off
   loopback); a headless chromium (selenium, Debian's chromium-driver) opens the page.
3. The job is tests/mpi/monitor_job.py: an allreduce of 1 MiB and 4 ms of compute per step, a
   LiveMonitor with --period and --window; with --job ddp (inject only) tests/torch_mpi/
   monitor_ddp_job.py: DDP on the zcoll backend, an MLP with about 1 MiB of gradients, the
   LiveMonitor on the optimizer's hook (its windows through the group's worker).

`inject` (the default): the job runs until told to stop. Once the page shows a healthy verdict,
--injections times: link 1->0 is shaped to --slow with tc, the page is polled until its verdict
says "slow link 1->0" and the bandwidth heatmap outlines that cell (the time from the tc change
is printed, split into its parts: rank 0 sent the verdict, the monitor held it, the page got
the push, the page drew the verdict and the hotspot, on the page's own clock; and when the
poller saw it, which adds selenium's own delay on a busy machine), the link is set back to
--rate and the page polled until it says healthy again. Printed: each injection's delays, their
median and range; exit status 0 when the page drew every one within --limit seconds (default 5).
--screenshot: the page at the first injection.

`history`: link 1->0 is slow (--slow) from the start. --runs short jobs, alternately without and
with int8 compression, publish to a monitor that records them in one history file; then
`zcoll history` lists them, compares the last plain run with the last int8 one and shows the
last; then one more run with the page open, whose suggestions must come from that history ("link
1->0 was the slow link in k of the last n runs", "int8 saved x% of the step"). Exit status 0
when the page showed both.

    python bench/monitor_testbed.py inject --injections 5 --screenshot docs/monitor.png
    python bench/monitor_testbed.py inject --injections 5 --job ddp
    python bench/monitor_testbed.py history --runs 4 --history /tmp/h.sqlite
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLONE_NEWNET = 0x40000000
JOBS = {
    "plain": ROOT / "tests" / "mpi" / "monitor_job.py",
    "ddp": ROOT / "tests" / "torch_mpi" / "monitor_ddp_job.py",
}
SHOWN = ("document.getElementById('verdict').dataset.who === '1->0' && "
         "document.getElementById('heat-bw').dataset.hotspot === '1->0'")  # fmt: skip
HEALTHY = "document.getElementById('verdict').dataset.label === 'healthy'"
SUGGESTIONS = "Array.from(document.querySelectorAll('#suggestions li')).map((e) => e.textContent)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="inject", choices=("inject", "history"))
    p.add_argument("--job", choices=sorted(JOBS), default="plain",
                   help="inject: the plain-communicator job (default) or the DDP one")  # fmt: skip
    p.add_argument("--rate", default="400mbit", help="both links, healthy (default 400mbit)")
    p.add_argument("--slow", default="40mbit", help="link 1->0 when slow (default 40mbit)")
    p.add_argument("--period", type=float, default=0.5, help="the LiveMonitor's period (default 0.5 s)")
    p.add_argument("--window", type=float, default=0.25, help="its telemetry window (default 0.25 s)")
    p.add_argument("--injections", type=int, default=3, help="inject: slow-link injections (default 3)")
    p.add_argument("--limit", type=float, default=5.0, help="inject: seconds the page may take (default 5)")
    p.add_argument("--recover", type=float, default=30.0,
                   help="inject: seconds to wait for 'healthy' after the link is restored (default 30)")  # fmt: skip
    p.add_argument(
        "--runs", type=int, default=4, help="history: recorded runs before the shown one (default 4)"
    )
    p.add_argument("--steps", type=int, default=30, help="history: steps per run (default 30)")
    p.add_argument("--history", help="history: the SQLite file (default: a new temporary one)")
    p.add_argument(
        "--screenshot", help="a PNG of the page (inject: at the first slow link; history: the last run)"
    )
    return p.parse_args(argv)


def join_namespace(name: str) -> None:
    """This thread (and the threads and processes it starts from now on) in namespace `name`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns({name}) failed")
    os.close(fd)


def browser():
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    # node 0's namespace has no way out: no proxy look-up, no background fetches to wait for
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,2000", "--no-proxy-server", "--disable-background-networking",
                "--disable-component-update", "--dns-prefetch-disable"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    )


def poll(driver, script: str, timeout: float) -> tuple[object, float | None]:
    """(value, seconds) of the first truthy value of a JavaScript expression; (None, None) on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        value = driver.execute_script(f"return {script}")
        if value:
            return value, time.monotonic() - start
        time.sleep(0.2)  # each poll takes the page's main thread: not too often
    return None, None


class Bed:
    """The test bed, the monitor on node 0's address and (on demand) the browser."""

    def __init__(self, args: argparse.Namespace, history=None):
        from zcoll.observe import serve
        from zcoll.observe.monitor_state import MonitorState
        from zcoll.tools import monitor_server
        from zcoll.tools.testbed import Testbed

        self.args, self.token = args, secrets.token_hex(8)
        links = {(1, 0): args.slow} if args.mode == "history" else {}
        self.tb = Testbed(nodes=[1, 1], inter=args.rate, links=links)
        self.tb.create()
        print(self.tb.describe(), flush=True)
        join_namespace(self.tb.namespace(0))
        self.state = MonitorState(history)
        self.server = serve.serve(monitor_server.make_app(self.state, token=self.token, history=history),
                                  self.tb.ip(0), 0, public=True, token=self.token)  # fmt: skip
        print(f"monitor: {self.server.url}/ (in node 0's namespace)", flush=True)
        self.driver = None
        self.jobs: list[subprocess.Popen] = []

    def open_page(self):
        self.driver = browser()
        self.driver.get(f"{self.server.url}/?token={self.token}")
        return self.driver

    def job_argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "mpi4py", str(JOBS[self.args.job]), f"--url={self.server.url}", f"--token={self.token}",
                f"--period={self.args.period}", f"--window={self.args.window}", *extra, "publish"]  # fmt: skip

    def env(self) -> dict[str, str]:
        path = [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]  # the caller's zcoll
        return {
            "PYTHONPATH": os.pathsep.join(path),
            "MPIR_CVAR_DEVICE_COLLECTIVES": "none",
            "OMP_NUM_THREADS": "1",
        }

    def run(self, argv: list[str], timeout: float = 600):
        return self.tb.run(argv, env=self.env(), timeout=timeout)

    def start(self, argv: list[str]) -> subprocess.Popen:
        """The job in the background, its output in a temporary file; close() kills what is left."""
        from zcoll.tools.testbed import _job_env

        out = tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(self.tb.mpirun_argv(argv, env=self.env()), env=_job_env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        proc.log = out
        self.jobs.append(proc)
        return proc

    @staticmethod
    def output(proc: subprocess.Popen) -> str:
        proc.log.seek(0)
        return proc.log.read()

    def close(self) -> None:
        from zcoll.tools.proc import kill_tree

        for proc in self.jobs:
            if proc.poll() is None:
                print(f"killing the job still running (mpirun pid {proc.pid})", flush=True)
                kill_tree(proc)
                proc.wait()
        if self.driver is not None:
            self.driver.quit()
        self.server.close()
        self.tb.close()


def _step_ms(state) -> str:
    steps = state.snapshot()["steps"].get("0") or [{}]
    v = steps[-1].get("step_s")
    return f"{v * 1e3:.1f} ms" if v else "-"


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    return f"median {statistics.median(values):.2f} s, range {min(values):.2f}-{max(values):.2f} s (n={len(values)})"


class Watch:
    """When the monitor's state (server side) first held a verdict naming `who`, after arm()."""

    def __init__(self, state):
        self.state, self.who, self.since, self.seen = state, None, 0.0, None
        threading.Thread(target=self._run, daemon=True).start()

    def arm(self, who: str) -> None:
        self.who, self.since, self.seen = who, time.time(), None

    def _run(self) -> None:
        while True:
            v = self.state.verdict or {}
            if self.who is not None and self.seen is None and (v.get("who") or "") == self.who:
                self.seen = time.time()
            time.sleep(0.01)

    def drawn(self, driver) -> float | None:
        """Seconds after arm() at which the page, on its own clock, held the verdict and the hotspot."""
        t = driver.execute_script("return document.getElementById('verdict').dataset.drawnAt")
        return float(t) / 1e3 - self.since if t and float(t) / 1e3 >= self.since else None

    def parts(self, driver) -> str:
        """Rank 0 built the snapshot with the new verdict, the monitor held it, the page received
        the push that brought it and drew it: seconds after arm()."""
        sent = [v["t"] for v in self.state.snapshot()["verdicts"] if (v.get("who") or "") == self.who]
        page = driver.execute_script("return document.getElementById('verdict').dataset")
        cost = driver.execute_script("return document.body.dataset")

        def after(t: float | None) -> str:
            return f"{t - self.since:.2f}" if t and t >= self.since else "-"

        def ms(key: str) -> float | None:
            return float(page[key]) / 1e3 if page.get(key) else None

        return (f"rank 0 sent it after {after(sent[-1] if sent else None)} s, the monitor held it after "
                f"{after(self.seen)} s, the page got the push after {after(ms('pushedAt'))} s and drew the "
                f"verdict and the hotspot after {after(ms('drawnAt'))} s; the page's last draws: verdict "
                f"{cost.get('renderMs', '-')} ms, charts {cost.get('slowMs', '-')} ms")  # fmt: skip


def inject(args: argparse.Namespace, bed: Bed) -> int:
    driver = bed.open_page()
    stop = Path(tempfile.mkdtemp(prefix="zcoll-monitor-")) / "stop"
    job = bed.start(bed.job_argv("--steps=1000000", f"--stop-file={stop}"))
    _, took = poll(driver, HEALTHY, 60)
    if took is None:
        print("the page never said healthy before any injection (60 s)", flush=True)
    time.sleep(2.0)  # a few windows of healthy evidence
    shown, drawn, healthy = [], [], []
    watch = Watch(bed.state)
    for k in range(args.injections):
        print(f"[{k + 1}/{args.injections}] before: verdict {(bed.state.verdict or {}).get('text')}; step "
              f"{_step_ms(bed.state)}", flush=True)  # fmt: skip
        watch.arm("1->0")
        bed.tb.set_rate(1, 0, args.slow)
        _, took = poll(driver, SHOWN, 60)
        print(f"  tc: link 1->0 at {args.slow}: page showed 'slow link 1->0' and the hotspot after "
              + (f"{took:.2f} s" if took is not None else "more than 60 s")
              + f" ({watch.parts(driver)}); step {_step_ms(bed.state)}", flush=True)  # fmt: skip
        if took is not None:
            shown.append(took)
            drawn.append(watch.drawn(driver))
        if k == 0 and args.screenshot:
            time.sleep(1.0)
            driver.save_screenshot(args.screenshot)
            print(f"  screenshot: {args.screenshot}", flush=True)
        bed.tb.set_rate(1, 0, args.rate)
        _, back = poll(driver, HEALTHY, args.recover)
        print(f"  tc: link 1->0 back at {args.rate}: page said healthy after "
              + (f"{back:.2f} s" if back is not None else f"more than {args.recover:g} s"), flush=True)  # fmt: skip
        if back is not None:
            healthy.append(back)
        time.sleep(1.0)
    stop.touch()
    try:
        rc = job.wait(120)
    except subprocess.TimeoutExpired:
        rc = None
    snap = bed.state.snapshot()
    print(f"job: exit {rc if rc is not None else 'still running'}; the monitor received "
          f"{sum(r['publishes'] for r in snap['ranks'].values())} snapshots; verdict changes "
          f"{snap['verdict_changes']}", flush=True)  # fmt: skip
    if rc != 0:
        print(bed.output(job)[-3000:], flush=True)
    drawn = [t for t in drawn if t is not None]
    print(f"slow link 1->0 in the page (verdict and hotspot drawn, the page's clock) after the tc change: "
          f"{_spread(drawn)}; limit {args.limit:g} s", flush=True)  # fmt: skip
    print(
        f"  seen by the poller (selenium through chromedriver, 5 polls a second): {_spread(shown)}",
        flush=True,
    )
    print(f"healthy again after the link was restored (poller): {_spread(healthy)}", flush=True)
    ok = len(drawn) == args.injections and max(drawn) < args.limit and rc == 0
    return 0 if ok else 1


def zcoll_history(path: str, *words: str) -> str:
    cmd = [sys.executable, "-m", "zcoll.tools.cli", "history", *words, "--history", path]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return f"$ zcoll history {' '.join(words)} --history {path}\n{out.stdout}{out.stderr}"


def history(args: argparse.Namespace, bed: Bed, path: str) -> int:
    runs = []
    for k in range(args.runs):
        method = "int8" if k % 2 else "none"
        start = time.monotonic()
        done = bed.run(bed.job_argv(f"--steps={args.steps}", f"--compression={method}"))
        run = bed.state.run
        bed.state.flush()  # the monitor writes its history on a thread of its own
        r = bed.state.history.run(run) if bed.state.history else None
        s = (r or {}).get("summary", {})
        print(f"run {k + 1}/{args.runs} ({method}): exit {done.returncode}, {time.monotonic() - start:.1f} s, "
              f"run {run}: median step {s.get('step_s', 0) * 1e3:.1f} ms, verdict {s.get('verdict')}, "
              f"slow links {s.get('slow_links')}", flush=True)  # fmt: skip
        if done.returncode != 0:
            print(done.output[-3000:], flush=True)
            return 1
        runs.append((method, run))
    time.sleep(0.5)
    plain = [r for m, r in runs if m == "none"]
    int8 = [r for m, r in runs if m == "int8"]
    print(zcoll_history(path), flush=True)
    if plain and int8:
        print(zcoll_history(path, "compare", plain[-1], int8[-1]), flush=True)
    print(zcoll_history(path, "show", runs[-1][1]), flush=True)

    driver = bed.open_page()
    job = bed.start(bed.job_argv(f"--steps={args.steps}"))
    want = ("was the slow link in", "of the step on this model")
    # the page first shows the last recorded run (the new job takes seconds to start): wait for the new one
    head = "document.getElementById('run').textContent"
    new_run = f"{head}.startsWith('run ') && !{[r for _, r in runs]!r}.some((r) => {head}.includes(r))"
    shown, took = poll(driver, f"(() => {{ const s = {SUGGESTIONS}; return {new_run} && {list(want)!r}.every("
                               "(w) => s.some((x) => x.includes(w))) && s; })()", 60)  # fmt: skip
    print(f"the page shows {driver.execute_script(f'return {head}')}", flush=True)
    print("the page's suggestions for the next run"
          + (f" ({took:.2f} s after the page opened):" if took is not None else " (not both within 60 s):"),
          flush=True)  # fmt: skip
    for line in shown or driver.execute_script(f"return {SUGGESTIONS}"):
        print(f"  - {line}", flush=True)
    if args.screenshot:
        poll(driver, SHOWN, 20)
        time.sleep(1.0)
        driver.save_screenshot(args.screenshot)
        print(f"screenshot: {args.screenshot}", flush=True)
    try:
        rc = job.wait(300)
    except subprocess.TimeoutExpired:
        rc = None
    print(
        f"run {args.runs + 1} (none, page open): exit {rc if rc is not None else 'still running'}", flush=True
    )
    return 0 if shown and rc == 0 else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode == "history" and args.job != "plain":
        print(
            "monitor_testbed: history runs the plain job (its --compression); --job ddp is for inject",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through Bed.close: no job left behind
    from zcoll.observe.history import History
    from zcoll.tools.testbed import Refused

    h = path = None
    if args.mode == "history":
        path = args.history or str(Path(tempfile.mkdtemp(prefix="zcoll-history-")) / "history.sqlite")
        h = History(path)
        print(f"history: {path}", flush=True)
    try:
        bed = Bed(args, h)
    except Refused as e:
        print(f"monitor_testbed: {e}", file=sys.stderr)
        return 3
    with contextlib.ExitStack() as stack:
        stack.callback(bed.close)
        return inject(args, bed) if args.mode == "inject" else history(args, bed, path)


if __name__ == "__main__":
    sys.exit(main())
