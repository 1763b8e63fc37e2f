#!/usr/bin/env python3
"""A slow link injected while a job runs on the emulated two-node cluster: how long until
zcoll monitor's page shows it as the verdict and the heatmap's hotspot.

1. zcoll.tools.testbed: nodes 0 and 1 (one rank each, network namespaces, --rate both ways).
2. This process joins node 0's network namespace and serves zcoll monitor on node 0's address
   (10.77.0.1, so both ranks reach it: --public with a token, as the monitor requires off
   loopback); a headless chromium (selenium, Debian's chromium-driver) opens the page.
3. The job (tests/mpi/monitor_job.py: an allreduce of 1 MiB and 4 ms of compute per step, a
   LiveMonitor with --period) runs; after --before seconds of healthy steps the link 1->0 is
   shaped to --slow with tc, and the page is polled until its verdict says "slow link 1->0" and
   the bandwidth heatmap outlines that cell.
4. Printed: the time from the tc change to the page showing both; a screenshot (--screenshot,
   e.g. docs/monitor.png). Exit status 0 when that took under --limit seconds (default 5).

    python bench/monitor_testbed.py --screenshot docs/monitor.png       # root (namespaces, tc)
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLONE_NEWNET = 0x40000000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="400mbit", help="both links before the change (default 400mbit)")
    p.add_argument("--slow", default="40mbit", help="link 1->0 after it (default 40mbit)")
    p.add_argument("--before", type=float, default=8.0, help="seconds of healthy steps first (default 8)")
    p.add_argument(
        "--steps", type=int, default=400, help="the job's steps (default 400: about 10 s after the change)"
    )
    p.add_argument("--period", type=float, default=0.5, help="the LiveMonitor's period (default 0.5 s)")
    p.add_argument("--limit", type=float, default=5.0, help="seconds the page may take (default 5)")
    p.add_argument("--screenshot", help="a PNG of the page once it shows the slow link")
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
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,2000",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    )


SHOWN = ("document.getElementById('verdict').dataset.who === '1->0' && "
         "document.getElementById('heat-bw').dataset.hotspot === '1->0'")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from zcoll.observe import serve
    from zcoll.observe.monitor_state import MonitorState
    from zcoll.tools import monitor_server
    from zcoll.tools.testbed import Refused, Testbed

    token = secrets.token_hex(8)
    try:
        tb = Testbed(nodes=[1, 1], inter=args.rate)
        tb.create()
    except Refused as e:
        print(f"monitor_testbed: {e}", file=sys.stderr)
        return 3
    try:
        print(tb.describe(), flush=True)
        join_namespace(tb.namespace(0))
        state = MonitorState()
        server = serve.serve(
            monitor_server.make_app(state, token=token), tb.ip(0), 0, public=True, token=token
        )
        print(f"monitor: {server.url}/ (in node 0's namespace)", flush=True)
        driver = browser()
        driver.get(f"{server.url}/?token={token}")
        argv = [sys.executable, "-m", "mpi4py", str(ROOT / "tests" / "mpi" / "monitor_job.py"), f"--url={server.url}",
                f"--token={token}", f"--steps={args.steps}", f"--period={args.period}", "publish"]  # fmt: skip
        env = {
            "PYTHONPATH": str(ROOT / "tests"),
            "MPIR_CVAR_DEVICE_COLLECTIVES": "none",
            "OMP_NUM_THREADS": "1",
        }
        result = {}
        job = threading.Thread(
            target=lambda: result.update(done=tb.run(argv, env=env, timeout=600)), daemon=True
        )
        job.start()
        time.sleep(args.before)
        before = state.snapshot()
        print(f"before: verdict {(before['verdict'] or {}).get('text')}; bandwidth MB/s "
              f"{_matrix(before)}", flush=True)  # fmt: skip
        tb.set_rate(1, 0, args.slow)
        changed = time.monotonic()
        print(f"tc: link 1->0 shaped to {args.slow}", flush=True)
        took = None
        while time.monotonic() - changed < 60:
            if driver.execute_script(f"return {SHOWN}"):
                took = time.monotonic() - changed
                break
            time.sleep(0.05)
        after = state.snapshot()
        print(
            f"after: verdict {(after['verdict'] or {}).get('text')}; bandwidth MB/s {_matrix(after)}",
            flush=True,
        )
        if took is None:
            print("the page did not show the slow link within 60 s", flush=True)
        else:
            print(f"the page showed 'slow link 1->0' and the hotspot {took:.2f} s after the tc change "
                  f"(limit {args.limit:g} s)", flush=True)  # fmt: skip
        if args.screenshot:
            time.sleep(1.0)
            driver.save_screenshot(args.screenshot)
            print(f"screenshot: {args.screenshot}", flush=True)
        driver.quit()
        job.join(300)  # the job ends by itself (--steps)
        done = result.get("done")
        print(f"job: exit {done.returncode if done else 'still running'}; the monitor received "
              f"{sum(r['publishes'] for r in after['ranks'].values())} snapshots", flush=True)  # fmt: skip
        server.close()
        return 0 if took is not None and took < args.limit else 1
    finally:
        tb.close()


def _matrix(snap: dict) -> str:
    bw = (snap.get("links") or {}).get("bandwidth") or []
    return " ".join(f"{i}->{j} {v / 1e6:.1f}" for i, row in enumerate(bw) for j, v in enumerate(row) if v)


if __name__ == "__main__":
    sys.exit(main())
