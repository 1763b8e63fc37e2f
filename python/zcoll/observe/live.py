"""The ranks' side of ``zcoll monitor``: what a running job publishes, from a background thread.

::

    mon = zcoll.observe.live.LiveMonitor(comm, "http://127.0.0.1:8765")   # every rank
    for step in range(steps):
        train_step()
        mon.step()                      # every rank, once per step: a counter, now and then more
    mon.close()

``comm``: a zcoll Communicator, the ``zcoll`` torch process group, or a DDP model on it (its
``process_group``); ``mon.attach(optimizer)`` calls ``step()`` from the optimizer's step hook.

1. Every ``step()`` counts (a clock read, an addition). At the steps chosen for it (about every
   ``window`` seconds), every rank takes the window of link telemetry: one collective, the
   gather of every rank's raw telemetry row (``comm._link_stats_rows(reset=True)``, the GIL
   released), on the communicator's own thread (through the group's ordered worker under torch,
   so it never runs beside another collective). Nothing else runs there: the rows go to a
   bounded queue, and classifying them (zcoll.core.diagnose.Diagnoser: healthy, slow rank, slow
   link, slow node; confirmed over three windows) runs on rank 0's publisher thread at once,
   which publishes a changed verdict straight away; other ranks publish no verdict and classify
   only when ``verdict`` or ``links`` is read. A window like the evidence before it, under a
   settled verdict, is only blended (classified at least every SETTLE seconds); one that moved
   is classified at once (Diagnoser's settle).
   The number of steps to the next window comes from the gathered rows themselves, so every rank
   computes the same number without a second collective: ``window`` over the longer of rank 0's
   step time in the window before (the distance between its last two telemetry resets, on its
   clock) and the slowest rank's time in collectives per step in this window (which rises at
   once when a link or a rank slows the job down). Windows are counted in steps, so a slowdown by
   a factor s stretches the window that spans it to about ``window`` x s seconds: a verdict of a
   change shows after about ``window`` x (s + 3) seconds (the default window, 0.25 s, keeps that
   under 5 s up to s = 10). docs/monitor.md has what a window costs. Under torch the window's
   interval is read at the next window (the worker has run it long before), so the training
   thread never waits for it.
2. A publisher thread per rank sends, every ``period`` seconds (rank 0 also as soon as the
   verdict changes), a JSON snapshot to the monitor (HTTP POST /publish, on one kept-alive
   connection): this rank's per-collective counters (zcoll.observe.metrics.call_rows, read
   without communicating), its steps since the last snapshot (phases and buckets from the
   step profiler when one runs, ``zcoll.torch.profile`` / ZCOLL_TRACE; otherwise the step time
   and the time in collectives), the guard's per-bucket figures when compression="auto" logs
   them, and on rank 0 the link matrices, arrival delays and the verdict.
3. Nothing here can stop or slow the training: the queue to the publisher is bounded (a
   snapshot that does not fit is dropped), a monitor that cannot be reached is reported once
   (a warning naming the URL) and tried again with back-off, every error of the thread is
   caught. Only what is listed above and the ``labels`` the caller passes are published: no
   paths, no environment; hosts only as a fingerprint (for the history's "on these hosts").
"""

from __future__ import annotations

import hashlib
import http.client
import json
import queue
import socket
import threading
import time
import urllib.parse
import uuid
import warnings
from collections import deque
from fractions import Fraction
from typing import Any

import numpy as np

from .. import _C
from ..core.diagnose import Diagnoser, LinkStats, Verdict, from_rows
from . import metrics, trace

FORMAT = "zcoll-monitor/1"
QUEUE = 64  # snapshots waiting for the publisher; more are dropped
SETTLE = 1.0  # seconds a settled verdict goes without classifying windows like the evidence
ROWS = 32  # telemetry windows waiting to be classified; older ones are dropped (their weight
# in the blended evidence is below 0.5^32 by then anyway)


def calls_needed(diagnoser: Diagnoser) -> Fraction:
    """Collectives a window needs so that the blended evidence (each window plus `memory` x the
    ones before) reaches the diagnoser's minimum: min_calls x (1 - memory), 1.5 by default."""
    return Fraction(diagnoser.thresholds.min_calls) * (1 - Fraction(diagnoser.memory).limit_denominator(1000))


def next_interval(
    rows: np.ndarray,
    steps: int,
    window: float,
    last: tuple[int, int] | None,
    needed: Fraction = Fraction(3, 2),
) -> int:
    """Steps to the next telemetry window from one window's gathered rows (the same on every
    rank, so every rank gets the same number): `window` seconds over the longer of rank 0's step
    time in the window before (`last`: rank 0's previous base_ns and that window's steps) and the
    slowest rank's time in collectives per step in this one; and at least the steps that make
    `needed` collectives (calls_needed: a job of one collective per step, one step a window,
    would never have the diagnoser's minimum). Integer arithmetic: bit for bit the same on every
    rank. 0 when the rows tell nothing yet (the first window, telemetry off)."""
    if last is None:  # the time in collectives alone would overestimate the distance
        return 0
    per_step = int(rows[:, 3].max()) // max(1, steps)
    if int(rows[0, 0]) > last[0] and last[1] > 0:
        per_step = max(per_step, (int(rows[0, 0]) - last[0]) // last[1])
    if per_step <= 0:
        return 0
    calls = int(rows[:, 1].min())
    least = -(-needed.numerator * steps // (needed.denominator * calls)) if calls > 0 else 1
    return int(min(1000, max(least, 1, (int(window * 1e9) + per_step // 2) // per_step)))


def _target(comm: Any) -> tuple[Any, Any]:
    """(zcoll Communicator, ordered executor or None) of a Communicator, a zcoll process group
    or a DDP model on one."""
    group = getattr(comm, "process_group", None)
    if group is not None:
        comm = group
    if hasattr(comm, "submit") and hasattr(comm, "communicator"):
        return comm.communicator, comm
    if not hasattr(comm, "link_stats"):
        raise TypeError(
            f"zcoll monitor: expected a zcoll Communicator, the zcoll process group or a DDP model on it, "
            f"got {type(comm).__name__}"
        )
    return comm, None


def verdict_dict(v: Verdict) -> dict[str, Any]:
    who = {
        "slow rank": v.rank,
        "slow link": f"{v.link[0]}->{v.link[1]}" if v.link else None,
        "slow node": v.node,
    }
    return {"label": v.label, "who": who.get(v.label), "text": str(v), "evidence": v.evidence}


def links_dict(stats: LinkStats) -> dict[str, Any]:
    def matrix(m: np.ndarray) -> list:
        return [[float(v) if np.isfinite(v) else None for v in row] for row in np.asarray(m, float)]

    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "bandwidth": matrix(stats.gbps * 1e9),
            "latency": matrix(stats.latency),
            "bytes": matrix(stats.bytes),
            "arrival_delay": [float(v) if np.isfinite(v) else None for v in stats.arrival_delay],
            "call_seconds": [float(v) if np.isfinite(v) else None for v in stats.call_seconds],
            "calls": int(stats.calls),
        }


def host_fingerprint(hosts: list[str]) -> str:
    """The same for the same set of machines, whatever the rank order; not the names."""
    return hashlib.sha1("\n".join(sorted(set(hosts))).encode()).hexdigest()[:12]


def step_figures(step: dict[str, Any], prev_end: int | None) -> dict[str, Any] | None:
    """One recorded step (zcoll.observe.trace's step dict, ns on this rank's clock) as seconds:
    step, compute, communication, exposed communication and overlap (docs/profiler.md's
    definitions, on this rank alone)."""
    ph = step.get("phases", {})
    if any(k not in ph or ph[k][1] is None for k in ("forward", "backward")):
        return None
    ends = [v[1] for v in ph.values() if v[1] is not None]
    starts = [v[0] for v in ph.values()]
    begin = prev_end if prev_end is not None else min(starts)
    b1 = ph["backward"][1]
    buckets = [b for b in step.get("buckets", []) if b.get("end") is not None]
    comm = hidden = 0.0
    last = None
    for b in sorted(buckets, key=lambda b: b["ready"]):
        start = b["start"] if b.get("start") is not None else max(b["issued"], last or b["issued"])
        comm += (b["end"] - start) * 1e-9
        hidden += max(0, min(b["end"], b1) - start) * 1e-9
        last = b["end"] if last is None else max(last, b["end"])
    exposed = max(0, last - b1) * 1e-9 if last is not None else 0.0
    total = (max(ends) - begin) * 1e-9
    return {
        "step": step.get("step"),
        "step_s": total,
        "compute": max(0.0, total - exposed),
        "communication": comm,
        "exposed_communication": exposed,
        "overlap": hidden / comm if comm > 0 else None,
        "source": "profiler",
    }


class Publisher:
    """A daemon thread POSTing JSON documents to `url` + /publish; see the module docstring."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 2.0):
        self.url = url.rstrip("/") + "/publish"
        self.token, self.timeout = token, timeout
        self._target = urllib.parse.urlsplit(self.url)
        self._path = self._target.path + (f"?{self._target.query}" if self._target.query else "")
        self._conn: http.client.HTTPConnection | None = None  # kept alive between POSTs
        self.queue: queue.Queue = queue.Queue(QUEUE)
        self.sent = self.dropped = self.failed = 0
        self.cpu = {"document": 0.0, "send": 0.0}  # this thread's CPU seconds, by part (benchmarks)
        self.warned = False
        self.thread = threading.Thread(target=self._run, name="zcoll-monitor-publisher", daemon=True)
        self.thread.start()

    def put(self, doc: Any) -> None:
        """Never blocks: a full queue drops the document. doc: a dict, or a callable run on the
        publisher's thread that returns one (or None: nothing to send)."""
        try:
            self.queue.put_nowait(doc)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 3.0) -> None:
        """Sends what is queued (within `timeout`), then stops the thread."""
        while True:
            try:
                self.queue.put_nowait(None)
                break
            except queue.Full:  # make room for the stop: the oldest snapshot goes
                try:
                    self.queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass
        self.thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.0
        while True:
            doc = self.queue.get()
            if doc is None:
                if self._conn is not None:
                    self._conn.close()
                return
            if backoff and time.monotonic() < backoff:
                self.dropped += 1
                continue
            try:
                t0 = time.thread_time()
                doc = doc() if callable(doc) else doc
                t1 = time.thread_time()
                self.cpu["document"] += t1 - t0
                if doc is None:
                    continue
                self._post(json.dumps(doc, default=float).encode())
                self.cpu["send"] += time.thread_time() - t1
                self.sent += 1
                backoff = 0.0
            except Exception as e:  # noqa: BLE001 (the training must never see this thread's errors)
                self.failed += 1
                backoff = time.monotonic() + min(30.0, 2.0 ** min(self.failed, 5))
                if not self.warned:
                    self.warned = True
                    warnings.warn(
                        f"zcoll monitor: cannot publish to {self.url} ({e}); the job goes on, publishing is "
                        "retried with back-off (start `zcoll monitor`, or check the URL and token)",
                        stacklevel=1,
                    )

    def _post(self, body: bytes) -> None:
        """One POST on the kept-alive connection (a new connection per POST cost the monitor and
        this thread a TCP set-up each); once more on a new one when the kept one was closed."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                self._conn = self._connect()
            try:
                self._conn.request("POST", self._path, body, headers)
                response = self._conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException) as e:
                self._conn.close()
                self._conn = None
                if fresh or attempt or isinstance(e, TimeoutError):  # a slow monitor: no second wait
                    raise
                continue
            if response.status >= 400:
                raise OSError(f"HTTP {response.status} {response.reason}")
            return

    def _connect(self) -> http.client.HTTPConnection:
        if self._target.scheme not in ("http", "https") or not self._target.hostname:
            raise OSError(f"not an http:// URL: {self.url}")  # said by the publisher's warning
        kind = http.client.HTTPSConnection if self._target.scheme == "https" else http.client.HTTPConnection
        try:
            port = self._target.port
        except ValueError as e:  # a port out of range
            raise OSError(f"{e}: {self.url}") from None
        return kind(self._target.hostname, port, timeout=self.timeout)


class _Later:
    """A window submitted to the torch worker: wait() gives fn's result."""

    def __init__(self, future: Any, box: list):
        self.future, self.box = future, box

    def wait(self) -> Any:
        self.future.wait()
        return self.box[0]


class LiveMonitor:
    """Publishes a running job to ``zcoll monitor`` (see the module docstring). Collective:
    every rank creates it (one small broadcast: the run's id), calls ``step()`` once per step
    and ``close()`` at the end. period: seconds between snapshots sent to the monitor; window:
    seconds between telemetry windows (the verdict's sampling, see the module docstring)."""

    def __init__(
        self,
        comm: Any,
        url: str = "http://127.0.0.1:8765",
        *,
        period: float = 1.0,
        window: float = 0.25,
        token: str | None = None,
        labels: dict[str, Any] | None = None,
        diagnose: bool = True,
        first_window: int = 5,
    ):
        self.comm, self.executor = _target(comm)
        self._holders = (comm, getattr(comm, "_zcoll_compression_state", None), self.comm)
        self.rank, self.size = self.comm.rank, self.comm.size
        self.period, self.window, self.diagnose = float(period), float(window), bool(diagnose)
        self.labels = dict(labels or {})
        self.steps = 0
        self.next_window = first_window
        self._pending: Any = None  # the torch worker's future of the last window
        self.first_window = first_window
        self._last_window_steps = 0
        self._last_base: tuple[int, int] | None = None  # rank 0's last base_ns, that window's steps
        self._last_step_t: float | None = None
        self._step_total = (0.0, 0)  # sum and count of step times (written by step() alone)
        self._step_seen = (0.0, 0)  # what the last snapshot took of it (publisher thread)
        self._seconds_in_calls = 0.0
        self._trace_seen: dict[int, int] = {}
        self._recorder: trace.Recorder | None = None  # the step profiler's, kept until published
        self._verdict: dict[str, Any] | None = None
        self._evidence: LinkStats | None = None  # the blended windows; links_dict of it when asked
        self._links: tuple[Any, dict[str, Any]] | None = None  # (evidence, its links_dict)
        self._rows: deque = deque(maxlen=ROWS)  # gathered windows not yet classified
        self._analysis = threading.Lock()
        self._diagnoser = Diagnoser(self._nodes(), quiet=self.rank != 0, settle=SETTLE)
        self._no_verdict = self._diagnoser.current  # "healthy: no telemetry yet" until windows confirm one
        self._needed = calls_needed(self._diagnoser)
        # CPU seconds by part, on the thread that ran it (window: the communicator's; classify:
        # rank 0's publisher): what docs/monitor.md's cost table reads
        self.cpu = {"window": 0.0, "classify": 0.0}
        self.run = self._run_id()
        self._lock = threading.Lock()
        self._steps_out: list[dict[str, Any]] = []
        self._buckets: dict[tuple, dict[str, Any]] = {}
        self.publisher = Publisher(url, token)
        self._last_publish = 0.0
        self.closed = False
        self._publish("start")

    # -- set-up --------------------------------------------------------------------------------
    def _nodes(self) -> list[int] | None:
        node_of = getattr(self.comm, "node_of", None)
        return [node_of(r) for r in range(self.size)] if node_of else None

    def _collective(self, fn: Any, wait: bool = True) -> Any:
        """fn(comm) on the communicator's own thread: its result, or (wait=False under torch)
        a future to wait() on later."""
        if self.executor is None:
            return fn(self.comm)
        box: list = []

        def run() -> list:
            box.append(fn(self.comm))
            return []

        future = self.executor.submit(run, None, async_op=True).get_future()
        if not wait:
            return _Later(future, box)
        future.wait()
        return box[0]

    def _run_id(self) -> str:
        box = np.frombuffer(uuid.uuid4().hex[:16].encode(), np.uint8).copy()

        def share(comm: Any) -> Any:
            comm.broadcast(box, root=0)
            return box

        self._collective(share)
        name = _C.env_get("ZCOLL_NODE_ID") or socket.gethostname()  # the node, as zcoll probe names it
        host = np.frombuffer(name.encode()[:64].ljust(64, b"\0"), np.uint8).copy()
        hosts = np.zeros((self.size, 64), np.uint8)
        self._collective(lambda comm: comm.allgather(host, out=hosts))
        self.hosts = host_fingerprint([bytes(h).rstrip(b"\0").decode(errors="replace") for h in hosts])
        self.host_count = len({bytes(h) for h in hosts})
        return time.strftime("%Y%m%d-%H%M%S-") + bytes(box).decode()[:8]

    def attach(self, optimizer: Any) -> Any:
        """Calls step() after every ``optimizer.step()`` (torch's step post-hook); returns the
        hook's handle."""
        return optimizer.register_step_post_hook(lambda *_: self.step())

    def _guard_buckets(self) -> list[dict[str, Any]]:
        """compression="auto"'s per-bucket figures (its MetricsLog), on a Communicator or a DDP
        model given apply_gradient_compression(model, "auto")."""
        for holder in self._holders:
            auto = getattr(holder, "compressor", None) or getattr(holder, "auto_compression", None)
            log = getattr(auto, "metrics", None)
            if log is not None and hasattr(log, "buckets"):
                return log.buckets()
        return []

    def publish_bucket(self, bucket: str, method: str, **figures: float) -> None:
        """The guard's (or the caller's) latest figures of one compressed bucket: ratio,
        residual_ratio, seconds (shown per bucket; zcoll_compression_* metrics)."""
        with self._lock:
            self._buckets[(bucket, method)] = {"bucket": bucket, "method": method, **figures}

    # -- per step (training thread) ------------------------------------------------------------
    def step(self) -> None:
        """Once per training step on every rank (see the module docstring)."""
        if self.closed:
            return
        now = time.monotonic()
        if self._last_step_t is not None:
            total, count = self._step_total
            self._step_total = (total + now - self._last_step_t, count + 1)
        self._last_step_t = now
        self.steps += 1
        if self.diagnose and self.steps >= self.next_window:
            self._window()
        if now - self._last_publish >= self.period:
            self._last_publish = now
            self._publish()

    def _window(self) -> None:
        """The collective part: the gather of the telemetry rows, and from them the distance to
        the next window (next_interval: the same on every rank, so no rank calls a collective
        the others do not make at that step). Classifying happens elsewhere (_take)."""
        steps = max(1, self.steps - self._last_window_steps)
        self._last_window_steps = self.steps

        def window(comm: Any) -> int:
            t0 = time.thread_time()
            rows = comm._link_stats_rows(True)
            interval = next_interval(rows, steps, self.window, self._last_base, self._needed)
            self._last_base = (int(rows[0, 0]), steps)
            self._take(rows)
            self.cpu["window"] += time.thread_time() - t0
            return interval

        if self.executor is None:
            interval = window(self.comm)
        else:  # the previous window's interval (long done); this one is read at the next window
            interval = self._pending.wait() if self._pending is not None else 0
            self._pending = self._collective(window, wait=False)
        self.next_window = self.steps + (interval or self.first_window)

    def _take(self, rows: np.ndarray) -> None:
        """A gathered window, to be classified: at once on rank 0's publisher thread (which
        publishes a changed verdict straight away), on other ranks when verdict or links is read."""
        self._rows.append(rows)
        if self.rank == 0:
            self.publisher.put(self._classify_and_publish)

    # -- classifying (off the training thread) -------------------------------------------------
    def _classify(self) -> bool:
        """Feeds the windows gathered so far to the diagnoser; True when the verdict changed."""
        changed, t0 = False, time.thread_time()
        with self._analysis:
            while self._rows:
                stats = from_rows(self._rows.popleft())
                verdict = self._diagnoser.update(stats)
                new = None if verdict is self._no_verdict else verdict_dict(verdict)
                with self._lock:
                    old = self._verdict
                    changed |= new is not None and (
                        old is None or (old["label"], old["who"]) != (new["label"], new["who"])
                    )
                    self._verdict = new
                    self._evidence = self._diagnoser.evidence or stats
            self.cpu["classify"] += time.thread_time() - t0
        return changed

    def _classify_and_publish(self) -> dict[str, Any] | None:
        """On rank 0's publisher thread after each window: a snapshot when the verdict changed."""
        if not self._classify():
            return None
        self._last_publish = time.monotonic()
        return self._document(None)

    @property
    def verdict(self) -> dict[str, Any] | None:
        """The diagnoser's verdict on the windows so far (None before one is confirmed)."""
        self._classify()
        return self._verdict

    @property
    def links(self) -> dict[str, Any] | None:
        """The blended link matrices of the windows so far (links_dict), None before the first."""
        self._classify()
        return self._links_now()

    def _links_now(self) -> dict[str, Any] | None:
        """links_dict of the latest evidence, built once per evidence (at most once a snapshot
        on rank 0, not once a window)."""
        with self._lock:
            evidence, cached = self._evidence, self._links
        if evidence is None:
            return None
        if cached is None or cached[0] is not evidence:
            cached = self._links = (evidence, links_dict(evidence))
        return cached[1]

    # -- what is published ---------------------------------------------------------------------
    def _recorded_steps(self) -> list[dict[str, Any]]:
        """Steps the step profiler recorded since the last call, as step_figures(). A recorder
        that has stopped (the profiler ended, or another began) gives the rest of its steps, the
        last one too: snapshots are built on the publisher's thread, which can run after it ends."""
        active, out = trace.current(), []
        if self._recorder is not None and self._recorder is not active:
            out = self._new_steps(self._recorder, running=0)
            self._recorder, self._trace_seen = None, {}
        if active is not None:
            self._recorder = active
            out += self._new_steps(active, running=1)  # its last step may be running
        return out

    def _new_steps(self, rec: trace.Recorder, running: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for model in rec.models:
            steps, seen = model["steps"], self._trace_seen.get(model["id"], 0)
            for i in range(seen, len(steps) - running):
                prev = steps[i - 1] if i > 0 else None
                ends = [v[1] for v in prev["phases"].values() if v[1] is not None] if prev else []
                fig = step_figures(steps[i], max(ends) if ends else None)
                if fig is not None:
                    out.append(fig)
            self._trace_seen[model["id"]] = max(seen, len(steps) - running)
        return out

    def _light_steps(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Without the profiler: the mean step time and time in collectives per step since the
        last snapshot."""
        (total, count), (seen, seen_count) = self._step_total, self._step_seen
        self._step_seen = (total, count)
        total, count = total - seen, count - seen_count
        if not count:
            return []
        seconds = sum(r["seconds"] for r in rows)
        comm, self._seconds_in_calls = seconds - self._seconds_in_calls, seconds
        mean = total / count
        return [{"step": self.steps, "step_s": mean, "communication": comm / count, "compute": None,
                 "exposed_communication": None, "overlap": None, "source": "step times"}]  # fmt: skip

    def _document(self, event: str | None) -> dict[str, Any]:
        """Built on the publisher's thread."""
        rows = metrics.call_rows(self.comm)
        steps = self._recorded_steps() or self._light_steps(rows)
        links = None
        if self.rank == 0:
            self._classify()  # windows whose classifying task did not fit the queue
            links = self._links_now()
        with self._lock:
            doc = {
                "format": FORMAT, "run": self.run, "rank": self.rank, "size": self.size, "t": time.time(),
                "event": event, "calls": rows, "steps": steps,
                "buckets": self._guard_buckets() + list(self._buckets.values()),
                "step_count": self.steps,
            }  # fmt: skip
            if self.rank == 0:
                doc.update(links=links, verdict=self._verdict, setup=self._setup(rows))
        return doc

    def _setup(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        algorithms = sorted({f"{r['op']}/{r['algorithm']}" for r in rows})
        methods = sorted({b["method"] for b in [*self._buckets.values(), *self._guard_buckets()]})
        return {"ranks": self.size, "hosts": self.hosts, "host_count": self.host_count,
                "algorithms": algorithms, "compression": methods or ["none"], "labels": self.labels}  # fmt: skip

    def _publish(self, event: str | None = None) -> None:
        if self.executor is not None or event is None:
            self.publisher.put(lambda: self._document(event))  # built off the training thread
        else:
            self.publisher.put(self._document(event))

    def close(self) -> None:
        """The last snapshot ("end"), then the publisher stops. Not collective."""
        if self.closed:
            return
        self.closed = True
        self._publish("end")
        self.publisher.close()
