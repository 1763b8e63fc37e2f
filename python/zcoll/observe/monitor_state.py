"""The one aggregation point of ``zcoll monitor``: what every rank published, merged.

:class:`MonitorState` takes the ranks' snapshots (zcoll.observe.live's documents, POSTed to the
monitor), keeps the latest of each rank, a bounded series of steps per rank, rank 0's link
matrices and verdict, and the verdict's history; ``snapshot()`` is what the page, the event
stream and the Prometheus collector (zcoll.observe.metrics.JobCollector) read. With a
zcoll.observe.history.History it records the run as it goes (set-up, verdict changes, faults,
the summary every SUMMARY_SECONDS, the end) and draws suggestions from the earlier runs: on a
history.Writer thread, in order, so that a locked or slow history file never holds up
``publish()`` (the server's event loop) or ``snapshot()``; ``flush()`` waits for those writes.

A finished run is shown from its files the same way: ``load(snapshot)`` with what
zcoll.observe.monitor_files reads from a directory.
"""

from __future__ import annotations

import itertools
import math
import statistics
import threading
import time
from collections import deque
from typing import Any

from . import history as history_mod

SERIES = 600  # steps kept per rank
VERDICTS = 200  # verdict changes kept
SUMMARY_SECONDS = 5.0
SILENT_SECONDS = 10.0  # a rank of a live run not heard from for this long is named on the page


def clean(obj: Any) -> Any:
    """JSON for a browser: NaN and infinities as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


class MonitorState:
    """Thread-safe: publish() from the server's handlers, snapshot() from anywhere."""

    def __init__(self, history: history_mod.History | None = None, clock: Any = time.time):
        self.history = history
        self.clock = clock
        self.lock = threading.Lock()
        self.version = 0
        self.static = False  # a finished run loaded from files
        self.grace = 3.0  # seconds after a run's first snapshot before missing ranks are named
        self._writer: history_mod.Writer | None = None  # started with the first history write
        self._writer_lock = threading.Lock()
        self._past: deque = deque(maxlen=100)  # runs replaced by a newer one
        self.late = 0  # their snapshots that came after that
        self._reset(None)
        self.history_error: str | None = None

    def _reset(self, run: str | None) -> None:
        self.run = run
        self.ranks: dict[int, dict[str, Any]] = {}
        self.steps: dict[int, deque] = {}
        self.step_totals: dict[int, int] = {}  # steps ever received per rank (the series keeps SERIES)
        self.links: dict[str, Any] | None = None
        self.verdict: dict[str, Any] | None = None
        self.verdicts: deque = deque(maxlen=VERDICTS)
        self.verdict_changes = 0
        self.setup: dict[str, Any] = {}
        self.faults: list[dict[str, Any]] = []
        self.ended: set = set()
        self.window_counts: dict[str, dict[str, int]] = {"verdicts": {}, "slow_links": {}, "slow_ranks": {}}
        self.report: dict[str, Any] = {}  # a finished run's step report (verdict, suggestions)
        self._history_suggestions: list[dict[str, Any]] = []
        self._last_summary = 0.0
        self._first_seen = self.clock()
        self._size = 0

    # -- input ---------------------------------------------------------------------------------
    def publish(self, doc: dict[str, Any]) -> None:
        """One rank's snapshot. ValueError for a document that is not one."""
        if not isinstance(doc, dict) or doc.get("format") != "zcoll-monitor/1":
            raise ValueError("not a zcoll monitor snapshot (format zcoll-monitor/1)")
        rank, run = int(doc["rank"]), str(doc["run"])
        with self.lock:
            if run in self._past:  # a late snapshot of a run the next one replaced: not back to it
                self.late += 1
                return
            if run != self.run:
                self._new_run(run)
            r = self.ranks.setdefault(rank, {"publishes": 0})
            r.update(calls=doc.get("calls", []), buckets=doc.get("buckets", []), t=doc.get("t"),
                     step_count=doc.get("step_count", 0), size=doc.get("size"))  # fmt: skip
            r["publishes"] += 1
            r["received"] = self.clock()
            self._size = max(self._size, int(doc.get("size") or 0))
            new = [dict(s, t=doc.get("t")) for s in doc.get("steps", [])]
            self.steps.setdefault(rank, deque(maxlen=SERIES)).extend(new)
            self.step_totals[rank] = self.step_totals.get(rank, 0) + len(new)
            if rank == 0:
                self._rank0(doc)
            if doc.get("event") == "end":
                self.ended.add(rank)
            if doc.get("event") == "fault" or doc.get("fault"):
                self._fault(rank, doc.get("fault") or "fault")
            self.version += 1
        self._record(doc)

    def _new_run(self, run: str) -> None:
        """The previous run's summary as it stands (its last snapshots may still be on their way,
        through a slow link: the next run's suggestions must see it), then a fresh state."""
        if self.run is not None:
            self._past.append(self.run)
        if self.run is not None and self.history is not None and not self.static:
            self._write(self.history.update, self.run, self.summary())
            self._write(self.history.finish, self.run, "finished" if self.ended else "stopped")
        self._reset(run)
        self.static = False

    def _rank0(self, doc: dict[str, Any]) -> None:
        if doc.get("links"):
            self.links = doc["links"]
        if doc.get("setup"):
            self.setup = doc["setup"]
        v = doc.get("verdict")
        if not v:
            return
        name = {"slow link": "slow_links", "slow rank": "slow_ranks"}.get(v["label"])
        counts = self.window_counts
        counts["verdicts"][v["label"]] = counts["verdicts"].get(v["label"], 0) + 1
        if name and v.get("who") is not None:
            counts[name][str(v["who"])] = counts[name].get(str(v["who"]), 0) + 1
        changed = self.verdict is None or (self.verdict["label"], self.verdict.get("who")) != (
            v["label"],
            v.get("who"),
        )
        self.verdict = v
        if changed:
            self.verdict_changes += 1
            self.verdicts.append(dict(v, t=doc.get("t")))
            if self.history is not None:
                self._write(self.history.event, self.run, "verdict", v, doc.get("t"))

    def _fault(self, rank: int, what: str) -> None:
        self.faults.append({"rank": rank, "what": what, "t": self.clock()})
        if self.history is not None:
            self._write(self.history.event, self.run, "fault", {"rank": rank, "what": what})

    def _record(self, doc: dict[str, Any]) -> None:
        """The run's history: set-up at the start, the summary now and then, the end."""
        if self.history is None:
            return
        now = self.clock()
        if doc.get("rank") == 0 and doc.get("setup") and doc.get("event") == "start":
            run, setup = self.run, doc["setup"]
            self._write(self.history.start_run, run, setup, doc.get("t"))
            self._write(history_mod.suggestions, self.history, setup.get("hosts", ""), setup.get("labels"),
                        setup.get("ranks"), run, then=lambda found: self._suggested(run, found))  # fmt: skip
        size = doc.get("size") or 0
        finished = size and len(self.ended) >= size
        if finished or now - self._last_summary >= SUMMARY_SECONDS:
            self._last_summary = now
            with self.lock:
                summary = self.summary()
            self._write(self.history.start_run, self.run, self.setup or {"ranks": size}, doc.get("t"))
            self._write(self.history.update, self.run, summary)
        if finished:
            self._write(self.history.finish, self.run)

    def _suggested(self, run: str, found: list[dict[str, Any]] | None) -> None:
        """The history's suggestions for `run`, computed on the writer's thread."""
        with self.lock:
            if self.run == run:
                self._history_suggestions = found or []
                self.version += 1

    def _write(self, fn: Any, *args: Any, then: Any = None) -> None:
        """fn(*args) on the history's writer thread, after the writes before it (_safe)."""
        with self._writer_lock:
            if self._writer is None:
                self._writer = history_mod.Writer()
        self._writer.submit(self._safe, fn, *args, then=then)

    def flush(self, timeout: float = 30.0) -> bool:
        """Waits for the history writes made so far (tests, and before the history is closed)."""
        return self._writer.flush(timeout) if self._writer is not None else True

    def _safe(self, fn: Any, *args: Any) -> Any:
        """History errors never stop the monitor: the first is kept and shown on the page."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 (a full disk, a locked or corrupt file)
            if self.history_error is None:
                self.history_error = f"history not written: {e}"
            return None

    def load(self, snapshot: dict[str, Any]) -> None:
        """A finished run, from its files (zcoll.observe.monitor_files)."""
        with self.lock:
            self._reset(snapshot.get("run", "files"))
            self.static = True
            self.links = snapshot.get("links")
            self.verdict = snapshot.get("verdict")
            self.verdicts.extend(snapshot.get("verdicts", []))
            self.setup = snapshot.get("setup", {})
            self.report = snapshot.get("report", {})
            self.faults = snapshot.get("faults", [])
            for rank, series in snapshot.get("steps", {}).items():
                self.steps[int(rank)] = deque(series, maxlen=max(SERIES, len(series)))
                self.step_totals[int(rank)] = len(series)
            for rank, r in snapshot.get("ranks", {}).items():
                self.ranks[int(rank)] = dict(r, publishes=0)
            self.version += 1

    # -- output --------------------------------------------------------------------------------
    def notes(self) -> list[str]:
        """What the page should warn about: ranks of the live run not heard from (rank 0 above
        all: it sends the links, the verdict and the set-up), or silent for SILENT_SECONDS."""
        if self.static or self.run is None:
            return []
        now, out = self.clock(), []
        heard = set(self.ranks)
        if now - self._first_seen >= self.grace:
            if 0 not in heard:
                out.append("rank 0 has not published: it sends the link matrices, the verdict and the set-up "
                           "(can it reach this monitor? its warning 'cannot publish to ...' says why not)")  # fmt: skip
            missing = [r for r in range(1, self._size) if r not in heard]
            if missing:
                out.append(f"rank{'s' if len(missing) > 1 else ''} {_ranks(missing)} of {self._size} "
                           "not heard from (cannot reach this monitor?)")  # fmt: skip
        silent = sorted((r, now - x["received"]) for r, x in self.ranks.items()
                        if r not in self.ended and now - x.get("received", now) >= SILENT_SECONDS)  # fmt: skip
        if silent:
            out.append("silent: " + ", ".join(f"rank {r} for {s:.0f} s" for r, s in silent)
                       + " (stopped, stuck, or cut off from this monitor)")  # fmt: skip
        return out

    def summary(self) -> dict[str, Any]:
        """The run's summary for the history (call with the lock held)."""
        per_step = [s for series in self.steps.values() for s in series]
        algorithms: dict[str, int] = {}
        for r in self.ranks.values():
            for row in r.get("calls", []):
                key = f"{row['op']}/{row['algorithm']}"
                algorithms[key] = algorithms.get(key, 0) + row["calls"]
        return {
            "steps": max((r.get("step_count", 0) for r in self.ranks.values()), default=0),
            "step_s": _median([s.get("step_s") for s in per_step]),
            "compute_s": _median([s.get("compute") for s in per_step]),
            "communication_s": _median([s.get("communication") for s in per_step]),
            "exposed_s": _median([s.get("exposed_communication") for s in per_step]),
            "overlap": _median([s.get("overlap") for s in per_step]),
            "verdict": self.verdict.get("label") if self.verdict else None,
            **{k: dict(v) for k, v in self.window_counts.items()},
            "algorithms": algorithms,
            "faults": list(self.faults),
        }

    def suggestions(self) -> list[dict[str, Any]]:
        out = list(self.report.get("suggestions", []))
        v = self.verdict or {}
        if v.get("label") == "slow link":
            out.append({"kind": "link", "text": f"link {v['who']} is slow now ({v.get('evidence', '')}): "
                        "zcoll probe measures every link and suggests a placement that avoids it"})  # fmt: skip
        elif v.get("label") == "slow rank":
            out.append({"kind": "rank", "text": f"rank {v['who']} arrives late: its compute, data loading or a "
                        "busy core holds the others up (communication cannot fix that)"})  # fmt: skip
        elif v.get("label") == "slow node":
            out.append({"kind": "node", "text": f"node {v['who']}: all of its links are slow (its network "
                        "interface, or its placement: zcoll probe)"})  # fmt: skip
        return out + self._history_suggestions

    def snapshot(self, since: dict[str, int] | None = None) -> dict[str, Any]:
        """The state for the page, the event stream and the metrics. since (the event stream's
        step_totals of its last push, same run): only the steps after those ("steps_from"), for
        the page to append: the whole series (600 steps a rank) was most of every push's CPU."""
        with self.lock:
            return clean({
                "run": self.run, "version": self.version, "static": self.static, "t": self.clock(),
                "setup": self.setup, "ranks": {str(k): v for k, v in sorted(self.ranks.items())},
                "steps": self._series(since), "step_totals": {str(k): v for k, v in self.step_totals.items()},
                **({"steps_from": since, "series": SERIES} if since is not None else {}),
                "links": self.links, "verdict": self.verdict, "verdicts": list(self.verdicts),
                "verdict_changes": self.verdict_changes, "faults": self.faults,
                "suggestions": self.suggestions(), "ended": sorted(self.ended),
                "report": {k: v for k, v in self.report.items() if k != "suggestions"},
                "history_error": self.history_error, "notes": self.notes(),
            })  # fmt: skip

    def _series(self, since: dict[str, int] | None) -> dict[str, list]:
        """Every rank's steps, or only those after since[rank] (ranks with none left out)."""
        if since is None:
            return {str(k): list(v) for k, v in sorted(self.steps.items())}
        out = {}
        for k, v in sorted(self.steps.items()):
            new = min(len(v), self.step_totals.get(k, len(v)) - since.get(str(k), 0))
            if new > 0:
                out[str(k)] = list(itertools.islice(v, len(v) - new, None))
        return out
