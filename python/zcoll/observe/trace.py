"""Step traces: a per-rank recorder, clocks aligned across ranks, one Chrome/Perfetto trace.

Framework-agnostic: ``zcoll.torch.profile`` fills it from PyTorch hooks; anything else can too.

1. A :class:`Recorder` keeps this rank's events in memory, timed with ``time.perf_counter_ns``
   (CLOCK_MONOTONIC on Linux): *steps* (named phases such as forward, backward, optimizer, each
   ``[t0, t1]``, and per-bucket communication records) and free *spans* / *instants*.
   ``current()`` returns the active recorder or None, so instrumented code costs one global
   lookup and a branch when tracing is off.
2. :class:`Session` ties recorders to an MPI communicator (a duplicate, so its messages never mix
   with the program's): it aligns the clocks, measures the link, and at the end gathers every
   rank's document to rank 0, which writes ``zcoll-trace-rank<r>.json`` per rank and the merged
   ``zcoll-trace.json`` (open it in ui.perfetto.dev or chrome://tracing).
3. Clock alignment (NTP's estimate): rank r sends its time t1 to rank 0, which answers with its
   time t2; r receives at t3. offset = t2 - (t1 + t3) / 2 is rank 0's clock minus r's, exact to
   within rtt / 2 (rtt = t3 - t1); the sample with the smallest rtt of a few dozen is kept. Done
   at the start and at the end: ``merge`` maps a local time t to rank 0's clock with the offset
   interpolated linearly between the two (the drift), and the report prints both.
4. Link capacity: every rank sends `nbytes` to rank + 1 while receiving from rank - 1 (the
   pattern of a ring allreduce), best of a few repeats, slowest rank: bytes / time is the rate
   one rank can send at while every rank sends, comparable to a ring's wire bytes per second.
5. Every wait of the session's own exchanges has a deadline: a rank that never arrives makes the
   others give up with a warning (and each rank then writes its own file), never hang.

Example::

    from mpi4py import MPI
    from zcoll import trace
    session = trace.Session("trace-dir", MPI.COMM_WORLD)
    rec = session.recorder
    with rec.span("load", lane="compute"):
        ...
    session.finish()            # collective: end-of-run clock check, files written by rank 0
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

FORMAT = "zcoll-step-trace"
VERSION = 1
RANK_FILE = "zcoll-trace-rank{rank}.json"
MERGED_FILE = "zcoll-trace.json"
_TAG_CLOCK, _TAG_GATHER, _TAG_BCAST = 7101, 7102, 7103

_active: Optional["Recorder"] = None


def current() -> Optional["Recorder"]:
    """The recorder spans go to, or None when tracing is off."""
    return _active


class Recorder:
    """This rank's events. ``now()`` is the clock every event uses (ns).

    Steps are dicts ``{"step": i, "model": m, "phases": {name: [t0, t1]}, "buckets": [...]}``,
    appended by the framework layer; spans and instants are free-form."""

    def __init__(self, rank: int = 0, size: int = 1, clock: Callable[[], int] = time.perf_counter_ns):
        self.rank, self.size = rank, size
        self.now = clock
        self.models: List[Dict[str, Any]] = []  # one description per traced model, "steps" inside
        self.spans: List[list] = []  # [name, lane, t0, t1, args]
        self.instants: List[list] = []  # [name, lane, t, args]
        self.meta: Dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
        self.created_ns = clock()

    def activate(self) -> None:
        global _active
        _active = self

    def deactivate(self) -> None:
        global _active
        if _active is self:
            _active = None

    @contextlib.contextmanager
    def span(self, name: str, lane: str = "compute", **args: Any) -> Iterator[None]:
        t0 = self.now()
        try:
            yield
        finally:
            self.spans.append([name, lane, t0, self.now(), args])

    def add_span(self, name: str, t0: int, t1: int, lane: str = "compute", **args: Any) -> None:
        self.spans.append([name, lane, t0, t1, args])

    def instant(self, name: str, lane: str = "compute", **args: Any) -> None:
        self.instants.append([name, lane, self.now(), args])

    def add_model(self, description: Dict[str, Any]) -> Dict[str, Any]:
        """Registers a traced model (a JSON-able description); returns it with an empty step
        list the framework layer appends to."""
        model = dict(description, id=len(self.models), steps=[])
        self.models.append(model)
        return model

    def document(self) -> Dict[str, Any]:
        """This rank's trace as one JSON-able dict (what zcoll-trace-rank<r>.json holds)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "rank": self.rank,
            "size": self.size,
            "meta": self.meta,
            "models": self.models,
            "spans": self.spans,
            "instants": self.instants,
        }


# -- waits with a deadline over mpi4py ----------------------------------------------------------
class PeerTimeout(TimeoutError):
    """A rank did not take part in one of the session's exchanges in time."""


def _wait(req: Any, deadline: float, what: str) -> None:
    polls = 0
    while not req.Test():
        polls += 1
        if polls > 2000:  # about a millisecond of polling, then yield the core between polls
            if time.monotonic() > deadline:
                raise PeerTimeout(f"zcoll.trace: {what} did not complete in time")
            time.sleep(0.0002)


def _send_bytes(comm: Any, data: bytes, dest: int, tag: int, deadline: float) -> None:
    size = np.array([len(data)], dtype=np.int64)
    payload = np.frombuffer(data, dtype=np.uint8)
    for buf in (size, payload):
        _wait(comm.Isend(buf, dest=dest, tag=tag), deadline, f"sending to rank {dest}")


def _recv_bytes(comm: Any, source: int, tag: int, deadline: float) -> bytes:
    size = np.zeros(1, dtype=np.int64)
    _wait(comm.Irecv(size, source=source, tag=tag), deadline, f"rank {source}")
    payload = np.empty(int(size[0]), dtype=np.uint8)
    _wait(comm.Irecv(payload, source=source, tag=tag), deadline, f"rank {source}")
    return payload.tobytes()


# -- clocks and link ------------------------------------------------------------------------------
def measure_clock_offsets(
    comm: Any, clock: Callable[[], int], samples: int = 32, timeout: float = 60.0
) -> Dict[str, int]:
    """Collective. This rank's clock offset to rank 0 (rank 0's clock minus ours, ns), the
    round trip of the sample it came from (the offset is exact to within rtt / 2), and the
    local time it was taken at. Rank 0 serves the others one after the other."""
    deadline = time.monotonic() + timeout
    mine = np.zeros(1, dtype=np.int64)
    theirs = np.zeros(1, dtype=np.int64)
    if comm.rank == 0:
        for r in range(1, comm.size):
            for _ in range(samples):
                _wait(comm.Irecv(theirs, source=r, tag=_TAG_CLOCK), deadline, f"clock sample of rank {r}")
                mine[0] = clock()
                comm.Send(mine, dest=r, tag=_TAG_CLOCK)
        return {"offset_ns": 0, "rtt_ns": 0, "local_ns": clock()}
    best = None
    for _ in range(samples):
        t1 = clock()
        mine[0] = t1
        comm.Send(mine, dest=0, tag=_TAG_CLOCK)
        _wait(comm.Irecv(theirs, source=0, tag=_TAG_CLOCK), deadline, "clock sample of rank 0")
        t3 = clock()
        rtt = t3 - t1
        if best is None or rtt < best[1]:
            best = (int(theirs[0]) - (t1 + t3) // 2, rtt, (t1 + t3) // 2)
    return {"offset_ns": best[0], "rtt_ns": best[1], "local_ns": best[2]}


def probe_link(comm: Any, nbytes: int = 4 << 20, repeats: int = 3) -> Optional[Dict[str, float]]:
    """Collective. Bytes per second one rank sends while every rank sends `nbytes` to rank + 1
    and receives from rank - 1 (a ring allreduce's pattern); best of `repeats`, slowest rank.
    None on one rank."""
    from mpi4py import MPI

    p = comm.size
    if p == 1:
        return None
    send = np.ones(nbytes, dtype=np.uint8)
    recv = np.empty(nbytes, dtype=np.uint8)
    best = float("inf")
    for i in range(repeats + 1):  # round 0 is a warm-up (connections, TCP windows)
        comm.Barrier()
        t0 = time.perf_counter()
        reqs = [
            comm.Irecv(recv, source=(comm.rank - 1) % p, tag=_TAG_CLOCK + 10),
            comm.Isend(send, dest=(comm.rank + 1) % p, tag=_TAG_CLOCK + 10),
        ]
        MPI.Request.Waitall(reqs)
        elapsed = np.array([time.perf_counter() - t0])
        comm.Allreduce(MPI.IN_PLACE, elapsed, op=MPI.MAX)
        if i:
            best = min(best, float(elapsed[0]))
    return {"bandwidth_Bps": nbytes / best, "bytes": nbytes, "seconds": best, "pattern": "ring exchange"}


# -- a session: one recorder per rank on one MPI communicator --------------------------------------
class Session:
    """Tracing on every rank of an MPI communicator (collective to create and to finish).

    ``Session(dir, comm)`` duplicates comm, aligns the clocks and (``probe_bytes`` > 0) measures
    the link; ``recorder`` is this rank's :class:`Recorder` (activated: ``current()`` returns
    it). ``finish()`` checks the clocks again, gathers the documents to rank 0, which writes the
    files, and returns the paths (rank 0) or []."""

    def __init__(
        self,
        directory: Any,
        comm: Any = None,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        probe_bytes: int = 4 << 20,
        timeout: float = 120.0,
    ):
        from mpi4py import MPI

        self.directory = Path(directory)
        self.comm = (MPI.COMM_WORLD if comm is None else comm).Dup()
        self.timeout = timeout
        self.recorder = Recorder(self.comm.rank, self.comm.size, clock)
        self.recorder.meta["clock"] = {"start": measure_clock_offsets(self.comm, clock, timeout=timeout)}
        self.recorder.meta["link"] = probe_link(self.comm, probe_bytes) if probe_bytes > 0 else None
        self.finished = False
        self.paths: List[Path] = []
        self.recorder.activate()

    def finish(
        self,
        summarize: Optional[Callable[[List[Dict[str, Any]]], Any]] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """Collective (with a deadline): end-of-run clock offsets, then rank 0 writes every
        rank's file and the merged Chrome trace (``paths``), runs ``summarize(documents)`` and
        shares its result, which every rank returns (None without summarize). A rank that does
        not arrive in time makes the others warn and write their own file. Idempotent."""
        if self.finished:
            return None
        self.finished = True
        rec = self.recorder
        rec.deactivate()
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            rec.meta["clock"]["end"] = measure_clock_offsets(self.comm, rec.now, timeout=timeout)
            docs = self._gather(rec.document(), deadline)
            result = None
            if docs is not None:
                self.paths = [write_json(self.directory / RANK_FILE.format(rank=d["rank"]), d) for d in docs]
                self.paths.append(write_json(self.directory / MERGED_FILE, chrome_trace(docs)))
                if summarize is not None:
                    try:
                        result = summarize(docs)
                    except Exception as e:  # noqa: BLE001 - the other ranks wait for an answer
                        result = {"error": f"{type(e).__name__}: {e}"}
            if summarize is not None:
                result = share_from_root(self.comm, result, max(1.0, deadline - time.monotonic()))
            return result
        except PeerTimeout as e:
            warnings.warn(
                f"{e}; rank {rec.rank} writes its own trace file only", RuntimeWarning, stacklevel=2
            )
            self.paths = [write_json(self.directory / RANK_FILE.format(rank=rec.rank), rec.document())]
            return None
        finally:
            self.comm.Free()

    def _gather(self, doc: Dict[str, Any], deadline: float) -> Optional[List[Dict[str, Any]]]:
        if self.comm.rank != 0:
            _send_bytes(self.comm, pickle.dumps(doc), 0, _TAG_GATHER, deadline)
            return None
        return [doc] + [
            pickle.loads(_recv_bytes(self.comm, r, _TAG_GATHER, deadline)) for r in range(1, self.comm.size)
        ]


def share_from_root(comm: Any, obj: Any, timeout: float = 120.0) -> Any:
    """Rank 0's obj on every rank (pickled point-to-point sends with a deadline)."""
    deadline = time.monotonic() + timeout
    if comm.rank == 0:
        data = pickle.dumps(obj)
        for r in range(1, comm.size):
            _send_bytes(comm, data, r, _TAG_BCAST, deadline)
        return obj
    return pickle.loads(_recv_bytes(comm, 0, _TAG_BCAST, deadline))


def write_json(path: Path, obj: Any) -> Path:
    """Writes atomically (a temporary file renamed), so a reader never sees half a file."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))
    os.replace(tmp, path)
    return path


# -- reading and merging ----------------------------------------------------------------------------
def load(directory: Any) -> List[Dict[str, Any]]:
    """Every rank's document in `directory`, in rank order. ValueError when there is none, when
    one is not a zcoll step trace, or when ranks are missing."""
    directory = Path(directory)
    paths = sorted(directory.glob("zcoll-trace-rank*.json"))
    if not paths:
        raise ValueError(
            f"{directory}: no zcoll-trace-rank*.json files (write them with zcoll.torch.profile)"
        )
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path}: not a zcoll step trace (format {doc.get('format')!r})")
        if doc.get("version") != VERSION:
            raise ValueError(
                f"{path}: trace version {doc.get('version')}, this zcoll reads version {VERSION}"
            )
        docs.append(doc)
    docs.sort(key=lambda d: d["rank"])
    size = docs[0]["size"]
    missing = sorted(set(range(size)) - {d["rank"] for d in docs})
    if missing:
        raise ValueError(f"{directory}: the trace of ranks {missing} (of {size}) is missing")
    return docs


class ClockMap:
    """Maps one rank's local times (ns) to rank 0's clock: the start offset, plus the drift
    measured between the start and the end of the session when both exist."""

    def __init__(self, clock: Dict[str, Any]):
        start, end = clock["start"], clock.get("end")
        self.o0, self.t0 = start["offset_ns"], start["local_ns"]
        self.rate = 0.0
        if end is not None and end["local_ns"] != self.t0:
            self.rate = (end["offset_ns"] - self.o0) / (end["local_ns"] - self.t0)

    def __call__(self, t: float) -> float:
        return t + self.o0 + self.rate * (t - self.t0)


def clock_maps(docs: List[Dict[str, Any]]) -> List[ClockMap]:
    return [ClockMap(d["meta"]["clock"]) for d in docs]


LANES = ("step", "compute", "communication", "buckets")


def chrome_trace(docs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The ranks' documents as one Chrome trace (JSON object format): pid = rank, tid = lane
    (per traced model: step, compute, communication, buckets; then free-form lanes), ts and dur
    in microseconds on rank 0's clock, relative to the earliest event."""
    trace = _ChromeTrace(clock_maps(docs))
    for doc in docs:
        r = doc["rank"]
        for model in doc["models"]:
            trace.add_model(r, model, f"m{model['id']} " if len(doc["models"]) > 1 else "")
        for name, lane, t0, t1, args in doc["spans"]:
            trace.span(r, lane, name, t0, t1, args)
        for name, lane, t, args in doc["instants"]:
            trace.instant(r, lane, name, t, args)
    clocks = {d["rank"]: d["meta"]["clock"] for d in docs}
    return {
        "traceEvents": trace.metadata(docs) + trace.events(),
        "displayTimeUnit": "ms",
        "otherData": {"producer": "zcoll", "clock_offsets_to_rank0": clocks},
    }


class _ChromeTrace:
    """Events in nanoseconds on rank 0's clock (maps[rank] converts), lanes numbered per rank."""

    def __init__(self, maps: List["ClockMap"]):
        self.maps = maps
        self.raw: List[Dict[str, Any]] = []
        self.tids: Dict[tuple, int] = {}

    def tid(self, rank: int, lane: str) -> int:
        key = (rank, lane)
        if key not in self.tids:
            self.tids[key] = len([k for k in self.tids if k[0] == rank]) + 1
        return self.tids[key]

    def span(self, rank: int, lane: str, name: str, t0: float, t1: float, args: Dict[str, Any]) -> None:
        a, b = self.maps[rank](t0), self.maps[rank](t1)
        self.raw.append({"name": name, "ph": "X", "pid": rank, "tid": self.tid(rank, lane), "ts": a,
                         "dur": max(0.0, b - a), "args": args})  # fmt: skip

    def instant(self, rank: int, lane: str, name: str, t: float, args: Dict[str, Any]) -> None:
        self.raw.append({"name": name, "ph": "i", "s": "t", "pid": rank, "tid": self.tid(rank, lane),
                         "ts": self.maps[rank](t), "args": args})  # fmt: skip

    def add_model(self, r: int, model: Dict[str, Any], prefix: str) -> None:
        for lane in LANES:
            self.tid(r, prefix + lane)
        for step in model["steps"]:
            phases = step["phases"]
            if phases:
                t0 = min(v[0] for v in phases.values())
                t1 = max(v[1] for v in phases.values())
                self.span(r, prefix + "step", f"step {step['step']}", t0, t1, {"step": step["step"]})
            for name, (t0, t1) in sorted(phases.items(), key=lambda kv: kv[1][0]):
                self.span(r, prefix + "compute", name, t0, t1, {"step": step["step"]})
            self._add_buckets(r, step, prefix)

    def _add_buckets(self, r: int, step: Dict[str, Any], prefix: str) -> None:
        prev_end = None
        for b in sorted(step["buckets"], key=lambda b: b["ready"]):
            if b["end"] is None or b["issued"] is None:
                continue
            # a hook that reports no start (timed_hook): its worker's previous end or the hand-over
            start = b["start"] if b["start"] is not None else max(b["issued"], prev_end or b["issued"])
            prev_end = b["end"] if prev_end is None else max(prev_end, b["end"])
            args = {k: v for k, v in b.items() if k not in ("ready", "issued", "start", "end", "params")}
            args["step"] = step["step"]
            args["start_inferred"] = b["start"] is None
            self.span(r, prefix + "communication", f"bucket {b['index']}", start, b["end"], args)
            self.instant(r, prefix + "buckets", f"bucket {b['index']} ready", b["ready"],
                         {"step": step["step"], "hook_us": (b["issued"] - b["ready"]) / 1e3})  # fmt: skip

    def events(self) -> List[Dict[str, Any]]:
        """Relative to the earliest event, in microseconds."""
        origin = min((e["ts"] for e in self.raw), default=0.0)
        for e in self.raw:
            e["ts"] = round((e["ts"] - origin) / 1e3, 3)
            if "dur" in e:
                e["dur"] = round(e["dur"] / 1e3, 3)
        return self.raw

    def metadata(self, docs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        meta: List[Dict[str, Any]] = []
        for doc in docs:
            r = doc["rank"]
            meta.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                         "args": {"name": f"rank {r} ({doc['meta'].get('host', '?')})"}})  # fmt: skip
            meta.append(
                {"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": r}}
            )
        for (r, lane), t in self.tids.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": r, "tid": t, "args": {"name": lane}})
            meta.append(
                {"name": "thread_sort_index", "ph": "M", "pid": r, "tid": t, "args": {"sort_index": t}}
            )
        return meta
