"""`zcoll monitor` (a live page of a running job, or of a finished one from its files) and
`zcoll history` (the runs the monitor recorded)."""

from __future__ import annotations

import argparse
import datetime
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ..observe import history as history_mod
from ..observe import monitor_files, serve
from ..observe.monitor_state import MonitorState
from . import monitor_server

MONITOR_HELP = """\
A web page of a running zcoll job, updated live (server push): the p x p link heatmap (bandwidth
and latency per message, from the engine's link telemetry), each rank's arrival delay, the step
timeline (compute, exposed communication, overlap), the current verdict (healthy, slow rank k,
slow link i->j, slow node k) and its history, compression per bucket with the guard's figures,
the collectives per op / algorithm / size, and suggestions (from the verdict, the step report
and the earlier runs in the history file). Prometheus scrapes /metrics.

The job publishes to it, every rank, in the background (docs/monitor.md):

    mon = zcoll.observe.live.LiveMonitor(comm_or_ddp_model, "http://127.0.0.1:8765")
    ... mon.step() once per training step (or mon.attach(optimizer)) ...; mon.close()

With DIR (a finished run): its step traces, probe.json, metrics logs and flight-recorder dumps,
shown the same way without live updates.

Listens on 127.0.0.1 only, unless --public (which needs --token)."""


def add_monitor_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "directory", nargs="?", help="a finished run's directory (traces, probe.json, *.jsonl, dumps)"
    )
    p.add_argument("--host", default=serve.LOOPBACK, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free one, printed)")
    p.add_argument(
        "--public", action="store_true", help="allow an address other than loopback (needs --token)"
    )
    p.add_argument(
        "--token", help="a secret every request must carry (Bearer header, or ?token= in the browser)"
    )
    p.add_argument("--history", default=str(history_mod.default_path()),
                   help=f"the run history, SQLite (default {history_mod.DEFAULT_PATH})")  # fmt: skip
    p.add_argument("--no-history", action="store_true", help="record nothing, suggest nothing from history")
    p.add_argument("--warmup", type=int, default=3, help="with DIR: first traced steps left out (default 3)")
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop after this many seconds (default 0: until Ctrl-C or SIGTERM); for scripts")  # fmt: skip


def monitor(args: argparse.Namespace) -> int:
    """`zcoll monitor` (see MONITOR_HELP)."""
    try:
        serve.require()
        monitor_server.plotly_js()
    except (ImportError, FileNotFoundError) as e:
        print(f"zcoll monitor: {e}", file=sys.stderr)
        return 2
    history = None
    state = MonitorState()
    if not args.no_history and not args.directory:
        try:
            history = history_mod.History(args.history)
        except history_mod.HistoryError as e:
            print(f"{e}\nzcoll monitor: going on without a history", file=sys.stderr)
            state.history_error = str(e)
    state.history = history
    if args.directory:
        try:
            state.load(monitor_files.load(args.directory, warmup=args.warmup))
        except (ValueError, OSError) as e:
            print(f"zcoll monitor: {e}", file=sys.stderr)
            return 2
    try:
        server = serve.serve(monitor_server.make_app(state, args.token, history), args.host, args.port,
                             public=args.public, token=args.token)  # fmt: skip
    except (OSError, PermissionError, RuntimeError) as e:
        print(e if str(e).startswith("zcoll") else f"zcoll monitor: {e}", file=sys.stderr)
        return 2
    print(f"zcoll monitor: {server.url}/" + (" (token required)" if args.token else ""), flush=True)
    if history is not None:
        print(f"history: {history.path}", flush=True)
    if not args.directory:
        print(f'publish from every rank: zcoll.observe.live.LiveMonitor(comm, "{server.url}")', flush=True)
    _wait_for_signal(args.duration)
    server.close()
    if history is not None:
        state.flush(10.0)  # the writes still queued (a locked file: SQLite's 5 s wait, twice)
        history.close()
    return 0


def _wait_for_signal(duration: float) -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait(duration if duration > 0 else None)


# -- zcoll history ---------------------------------------------------------------------------------
HISTORY_HELP = """\
The runs `zcoll monitor` recorded (one SQLite file, written as the runs go: a killed run keeps
what was written). `list` (the default): the latest runs; `show RUN`: one run's set-up, summary,
verdict changes and faults, and the suggestions its predecessors give; `compare A B`: two runs
side by side. RUN may be a unique prefix of a run id."""


def add_history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", default="list", choices=("list", "show", "compare"))
    p.add_argument("runs", nargs="*", help="run ids (or unique prefixes): one for show, two for compare")
    p.add_argument("--history", default=str(history_mod.default_path()),
                   help=f"the history file (default {history_mod.DEFAULT_PATH})")  # fmt: skip
    p.add_argument("-n", type=int, default=20, help="runs listed (default 20)")


def history(args: argparse.Namespace) -> int:
    """`zcoll history` (see HISTORY_HELP)."""
    if not Path(args.history).is_file():
        print(
            f"zcoll history: no history at {args.history} (zcoll monitor writes it; --history FILE)",
            file=sys.stderr,
        )
        return 2
    try:
        h = history_mod.History(args.history)
        if args.action == "list":
            print(_list(h.runs(limit=args.n)))
            return 0
        want = 1 if args.action == "show" else 2
        if len(args.runs) != want:
            print(f"zcoll history {args.action}: give {want} run id(s)", file=sys.stderr)
            return 2
        runs = [h.run(r) for r in args.runs]
        missing = [name for name, r in zip(args.runs, runs) if r is None]
        if missing:
            print(f"zcoll history: no single run matches {', '.join(missing)}", file=sys.stderr)
            return 2
        print(_show(h, runs[0]) if want == 1 else _compare(runs[0], runs[1]))
        return 0
    except history_mod.HistoryError as e:
        print(e, file=sys.stderr)
        return 2


def _when(t: float | None) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _ms(v: Any) -> str:
    return f"{v * 1e3:.1f}" if isinstance(v, (int, float)) else "-"


def _list(runs: list[dict[str, Any]]) -> str:
    lines = [(f"{'run':<26} {'started':<19} {'status':<9} {'ranks':>5} {'step ms':>8} {'exposed':>8} "
             f"{'verdict':<12} compression")]  # fmt: skip
    for r in runs:
        s = r["summary"]
        lines.append(
            f"{r['id']:<26} {_when(r['started']):<19} {r['status']:<9} {r['ranks'] or 0:>5} {_ms(s.get('step_s')):>8} "
            f"{_ms(s.get('exposed_s')):>8} {s.get('verdict') or '-':<12} "
            + ",".join(r["setup"].get("compression", ["none"]))
        )
    return "\n".join(lines) if runs else "no runs recorded yet"


def _show(h: history_mod.History, r: dict[str, Any]) -> str:
    s, setup = r["summary"], r["setup"]
    lines = [
        (
            f"run {r['id']}: {r['status']}, {r['ranks']} ranks on {setup.get('host_count', '?')} hosts "
            f"(fingerprint {r['hosts'] or '-'}), {_when(r['started'])} .. {_when(r['ended'] or r['updated'])}"
        ),
        f"  labels: {setup.get('labels') or {}}",
        f"  algorithms: {', '.join(setup.get('algorithms', [])) or '-'}; compression: "
        + ", ".join(setup.get("compression", ["none"])),
        f"  steps {s.get('steps', 0)}: median step {_ms(s.get('step_s'))} ms, compute {_ms(s.get('compute_s'))}, "
        f"communication {_ms(s.get('communication_s'))}, exposed {_ms(s.get('exposed_s'))} ms, overlap "
        + (f"{s['overlap']:.0%}" if isinstance(s.get("overlap"), (int, float)) else "-"),
        (
            f"  verdict windows: {s.get('verdicts') or {}}; slow links: {s.get('slow_links') or {}}; "
            f"slow ranks: {s.get('slow_ranks') or {}}"
        ),
    ]
    for e in h.events(r["id"]):
        lines.append(f"  {_when(e['t'])} {e['kind']}: {e.get('text') or e.get('what') or e.get('label', '')}")
    for x in history_mod.suggestions(h, r["hosts"], setup.get("labels"), r["ranks"]):  # this run among them
        lines.append(f"  suggestion: {x['text']}")
    return "\n".join(lines)


def _compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    rows = [("status", "status"), ("ranks", "ranks")]
    lines = [f"{'':<22} {a['id']:>26} {b['id']:>26}"]
    lines += [f"{label:<22} {a[k]!s:>26} {b[k]!s:>26}" for label, k in rows]
    for label, key in (("step ms", "step_s"), ("compute ms", "compute_s"), ("communication ms", "communication_s"),
                       ("exposed ms", "exposed_s")):  # fmt: skip
        va, vb = a["summary"].get(key), b["summary"].get(key)
        ratio = (
            f"  ({vb / va:.2f}x)"
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va
            else ""
        )
        lines.append(f"{label:<22} {_ms(va):>26} {_ms(vb):>26}{ratio}")
    for label, key in (("compression", "compression"), ("algorithms", "algorithms")):
        lines.append(
            f"{label:<22} {','.join(a['setup'].get(key, [])):>26} {','.join(b['setup'].get(key, [])):>26}"
        )
    lines.append(
        f"{'verdict':<22} {a['summary'].get('verdict') or '-':>26} {b['summary'].get('verdict') or '-':>26}"
    )
    return "\n".join(lines)
