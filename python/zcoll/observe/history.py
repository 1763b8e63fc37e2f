"""Run history: each run's summary in a SQLite file, and the suggestions drawn from it.

``zcoll monitor --history FILE`` (default ``~/.zcoll/history.sqlite``) writes one row per run and
one per event as they happen, each its own committed transaction in WAL mode, so a run killed
at any point (the job, or the monitor itself) leaves everything written before it readable; a
run that never said it ended is listed as "stopped" once it has been silent for STALE_SECONDS.

Tables: ``runs`` (id, started, updated, ended, status, hosts fingerprint, ranks, the set-up as
JSON: algorithms, compression, the user's labels; the summary as JSON: steps, median step,
compute, communication, exposed communication, overlap, verdict counts, slow links, slow ranks,
faults) and ``events`` (run, time, kind: verdict / fault / end, JSON data).

Suggestions (:func:`suggestions`), from the runs on the same machines (hosts fingerprint) or
with the same labels (e.g. ``labels={"model": "resnet50"}``):

1. a link named slow in at least 2 of the last 5 runs there: "link 2->3 was the slow link in 4
   of the last 5 runs on these hosts";
2. a rank named slow likewise;
3. a compression method against none on the same model and ranks (the latest run of each):
   "int8 saved 31% of the step on this model last time (42.0 ms -> 29.0 ms)".
"""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA = 1
STALE_SECONDS = 120.0
RECENT = 5
DEFAULT_PATH = "~/.zcoll/history.sqlite"


class HistoryError(RuntimeError):
    """The history file cannot be used (corrupt, not ours, unwritable): the message says what to do."""


def default_path() -> Path:
    return Path(os.path.expanduser(DEFAULT_PATH))


class History:
    """One SQLite file of runs (see the module docstring). Every write is its own transaction.
    Thread-safe: one connection, used by one thread at a time (the monitor writes from its
    Writer thread and reads from request threads)."""

    def __init__(self, path: Any):
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), timeout=5.0, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._schema()
        except (sqlite3.DatabaseError, OSError) as e:
            raise HistoryError(
                f"zcoll: the history file {self.path} cannot be used ({e}): move it aside (it may be corrupt or "
                "not a zcoll history) or pass another with --history"
            ) from None

    def _schema(self) -> None:
        with self.db:
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, started REAL, updated REAL, ended REAL, "
                "status TEXT, hosts TEXT, ranks INTEGER, setup TEXT, summary TEXT)"
            )
            self.db.execute("CREATE TABLE IF NOT EXISTS events (run TEXT, t REAL, kind TEXT, data TEXT)")
            self.db.execute("CREATE INDEX IF NOT EXISTS events_run ON events (run)")
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
            elif int(row[0]) != SCHEMA:
                raise sqlite3.DatabaseError(f"schema {row[0]}, this zcoll reads {SCHEMA}")

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def _write(self, *statements: tuple) -> None:
        """(sql, parameters) pairs in one transaction."""
        with self._lock, self.db:
            for sql, params in statements:
                self.db.execute(sql, params)

    def _read(self, sql: str, params: tuple) -> list:
        with self._lock:
            return self.db.execute(sql, params).fetchall()

    # -- writing (the monitor) ---------------------------------------------------------------
    def start_run(self, run: str, setup: dict[str, Any], t: float | None = None) -> None:
        t = time.time() if t is None else t
        self._write(
            ("INSERT OR IGNORE INTO runs VALUES (?, ?, ?, NULL, 'running', ?, ?, ?, '{}')",
             (run, t, t, setup.get("hosts", ""), int(setup.get("ranks", 0)), json.dumps(setup))),
            ("UPDATE runs SET setup = ?, hosts = ?, ranks = ? WHERE id = ?",
             (json.dumps(setup), setup.get("hosts", ""), int(setup.get("ranks", 0)), run)),
        )  # fmt: skip

    def update(self, run: str, summary: dict[str, Any], t: float | None = None) -> None:
        self._write(
            ("UPDATE runs SET summary = ?, updated = ? WHERE id = ?",
             (json.dumps(summary), time.time() if t is None else t, run)),
        )  # fmt: skip

    def event(self, run: str, kind: str, data: dict[str, Any], t: float | None = None) -> None:
        self._write(
            (
                "INSERT INTO events VALUES (?, ?, ?, ?)",
                (run, time.time() if t is None else t, kind, json.dumps(data)),
            ),
        )

    def finish(self, run: str, status: str = "finished", t: float | None = None) -> None:
        t = time.time() if t is None else t
        self._write(("UPDATE runs SET ended = ?, updated = ?, status = ? WHERE id = ?", (t, t, status, run)))

    # -- reading -------------------------------------------------------------------------------
    def runs(self, limit: int = 50, hosts: str | None = None) -> list[dict[str, Any]]:
        """The latest runs first, each a dict (setup and summary parsed; status "stopped" for a
        run silent for STALE_SECONDS that never ended)."""
        q = "SELECT id, started, updated, ended, status, hosts, ranks, setup, summary FROM runs"
        args: tuple = ()
        if hosts:
            q, args = q + " WHERE hosts = ?", (hosts,)
        try:
            rows = self._read(q + " ORDER BY started DESC LIMIT ?", (*args, limit))
        except sqlite3.DatabaseError as e:
            raise HistoryError(
                f"zcoll: cannot read the history file {self.path} ({e}): move it aside"
            ) from None
        return [self._row(r) for r in rows]

    def run(self, run: str) -> dict[str, Any] | None:
        """One run by id, or by a unique prefix of it."""
        rows = [r for r in self.runs(limit=10**6) if r["id"].startswith(run)]
        exact = [r for r in rows if r["id"] == run]
        return (exact or rows)[0] if len(exact) == 1 or len(rows) == 1 else None

    def events(self, run: str) -> list[dict[str, Any]]:
        rows = self._read("SELECT t, kind, data FROM events WHERE run = ? ORDER BY t", (run,))
        return [{"t": t, "kind": k, **_json(d)} for t, k, d in rows]

    @staticmethod
    def _row(r: tuple) -> dict[str, Any]:
        run, started, updated, ended, status, hosts, ranks, setup, summary = r
        if status == "running" and time.time() - (updated or started) > STALE_SECONDS:
            status = "stopped"
        return {"id": run, "started": started, "updated": updated, "ended": ended, "status": status,
                "hosts": hosts, "ranks": ranks, "setup": _json(setup), "summary": _json(summary)}  # fmt: skip


class Writer:
    """Calls run in order on one daemon thread, so that a history file that is locked (SQLite
    waits up to 5 s for a lock) or slow never stalls the caller: the monitor's event loop, which
    must keep serving the page. submit() never blocks; flush() waits for what was submitted."""

    def __init__(self, name: str = "zcoll-history"):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Any, *args: Any, then: Any = None) -> None:
        """fn(*args) on the writer's thread, then then(its result) when given."""
        with self._done:
            self._pending += 1
        self._queue.put((fn, args, then))

    def flush(self, timeout: float = 30.0) -> bool:
        """Waits until everything submitted so far ran; False when `timeout` passed first."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, then = item
            try:
                result = fn(*args)
                if then is not None:
                    then(result)
            except Exception:  # noqa: BLE001 (the caller wraps its calls; this thread must live on)
                pass
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()


def _json(text: str | None) -> dict[str, Any]:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


# -- suggestions -----------------------------------------------------------------------------------
def _recent_named(runs: list[dict[str, Any]], field: str) -> Iterator[tuple[str, int, int]]:
    """(name, runs naming it, runs looked at) for the links or ranks of summary[field]."""
    counts: dict[str, int] = {}
    for r in runs:
        for name in set(r["summary"].get(field, {})):
            counts[name] = counts.get(name, 0) + 1
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        yield name, n, len(runs)


def suggestions(history: History, hosts: str, labels: dict[str, Any] | None = None,
                ranks: int | None = None, exclude: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """What the earlier runs say (see the module docstring); each {"kind", "text", ...}."""
    out: list[dict[str, Any]] = []
    if hosts:
        recent = [r for r in history.runs(limit=RECENT + 1, hosts=hosts) if r["id"] != exclude][:RECENT]
        for field, what in (("slow_links", "link"), ("slow_ranks", "rank")):
            for name, n, total in _recent_named(recent, field):
                if n >= 2:
                    out.append({"kind": f"history-{what}", "name": name, "runs": n, "of": total,
                                "text": f"{what} {name} was the slow {what} in {n} of the last {total} runs on these "
                                        "hosts: check it (zcoll probe measures every link and suggests a placement)"})  # fmt: skip
    out += _compression_history(history, labels or {}, ranks, exclude)
    return out


def _compression_history(history: History, labels: dict[str, Any], ranks: int | None,
                         exclude: str | None) -> list[dict[str, Any]]:  # fmt: skip
    """The latest run with a compression method against the latest without, same labels and
    ranks, both with a median step."""
    if not labels:
        return []
    same = [
        r for r in history.runs(limit=200)
        if r["id"] != exclude and r["setup"].get("labels") == labels and (ranks is None or r["ranks"] == ranks)
        and r["summary"].get("step_s")
    ]  # fmt: skip
    plain = next((r for r in same if _method(r) == "none"), None)
    lossy = next((r for r in same if _method(r) != "none"), None)
    if plain is None or lossy is None:
        return []
    a, b = plain["summary"]["step_s"], lossy["summary"]["step_s"]
    saved = 1 - b / a
    what = "saved" if saved > 0 else "cost"
    name = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return [{"kind": "history-compression", "method": _method(lossy), "saved": saved,
             "text": f"{_method(lossy)} {what} {abs(saved):.0%} of the step on this model ({name}) last time "
                     f"({a * 1e3:.1f} ms without compression -> {b * 1e3:.1f} ms)"}]  # fmt: skip


def _method(run: dict[str, Any]) -> str:
    methods = [m for m in run["setup"].get("compression", ["none"]) if m != "none"]
    return "+".join(methods) if methods else "none"
