"""`zcoll probe`: latency and bandwidth of every directed rank pair, and what they say.

Run it on the ranks a job will use (`mpirun -n P zcoll probe`, `srun zcoll probe`, or
`mpirun -n P python -m zcoll probe`); rank 0 prints the report and writes the files.

Measurement (measure(), collective), on a duplicate of MPI.COMM_WORLD with mpi4py's
point-to-point calls, so it sees what zcoll's collectives see (MPI's transport between the
ranks: shared memory within a node, the network between nodes):

1. Schedule: a round-robin tournament (circle method) pairs every two ranks once, each rank in
   one pair per round. A round is split further so that its pairs running at the same time touch
   different nodes (a node's ranks share its network interface and memory). Ranks not in a
   running pair wait without spinning (MPI_Ibarrier polled with sleeps), leaving the cores to
   those measuring.
2. Per pair (a, b): latency by ping-pong of 8 bytes (`latency_iters` round trips after 10 warm-up
   ones; one-way latency = round trip / 2, min and median; so latency is the same both ways), then
   bandwidth a->b and b->a, each a stream of `message_bytes` messages with `window` of them in
   flight (as osu_bw does: one message at a time measures the handshakes, not the link): a
   warm-up window, then `repeats` (2) streams of as many messages as fit budget / repeats
   seconds at the warm-up's rate (at least two windows, at most 256). The receiver times each
   message's arrival; a stream's bandwidth = the bytes that arrived after its first window / the
   time they took: the steady state, without start-up or acknowledgement (on a busy machine
   every restart of a stream loses a scheduling delay), timed over the whole stream (a rank
   waiting for its core sees arrivals a few ms late: over short runs that is 10% or more). The
   faster stream counts: a capacity probe, where a stretch in which the receiver lost its core
   must not make the link look slow (a shaped link cannot beat its rate in either).
3. Each rank's memory copy rate (numpy copy of 32 MiB, best of 5), one rank at a time.
4. Nodes from zcoll's Communicator (MPI's shared memory, or ZCOLL_NODE_ID); hosts are the
   ZCOLL_NODE_ID values where set, else MPI's processor names.

Analysis (zcoll.observe.placement, no MPI): links, tiers, hotspots, slow nodes and a placement suggestion;
the rules are in that module's docstring.

Outputs (probe_report.py): the report on rank 0's stdout, and in --out (default zcoll-probe/):
probe.json (everything; zcoll.probe.load() reads it), links.csv, bandwidth.csv, latency.csv,
heatmap.png, report.html, and where a better placement exists placement.hosts (one host per rank:
SLURM_HOSTFILE for `srun --distribution=arbitrary`, or python -m zcoll.tools.testbed --placement),
machinefile (hydra `-f`) and rankfile (Open MPI `--rankfile`).

From Python::

    import zcoll.observe.probe
    r = zcoll.observe.probe.load("zcoll-probe/probe.json")
    r.bandwidth          # (P, P) numpy, bytes/s from row rank to column rank, NaN diagonal
    r.latency            # (P, P) seconds one way (min), r.latency_median likewise
    r.node_of, r.nodes   # node per rank; ranks per node
    r.tiers, r.hotspots  # zcoll.observe.placement.Tier / Hotspot lists
    r.analysis.placement # zcoll.observe.placement.Placement or None
    zcoll._C.best_ring_order(r.bandwidth)  # a ring order whose slowest hop is fastest

or in a running job, collectively: ``r = zcoll.probe.measure(comm)`` (every rank gets it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _C
from ..core.communicator import PROBE_FORMAT, Communicator
from . import placement

FORMAT = PROBE_FORMAT
_TAG_LATENCY, _TAG_DATA, _TAG_CONTROL = 11, 12, 13


@dataclass
class Options:
    message_bytes: int = 1 << 20
    window: int = 8
    budget: float = 0.3  # seconds per direction
    repeats: int = 2  # streams per direction; the fastest counts
    latency_iters: int = 100
    max_messages: int = 256
    serial: bool = False  # one pair at a time, even on different nodes
    copy_bytes: int = 32 << 20


@dataclass
class ProbeResult:
    """One measurement and its analysis; see the module docstring."""

    size: int
    hosts: List[str]
    node_of: List[int]
    bandwidth: np.ndarray  # (P, P) bytes/s, NaN on the diagonal
    latency: np.ndarray  # (P, P) seconds one way, min over the ping-pongs
    latency_median: np.ndarray
    memcpy: np.ndarray  # (P,) bytes/s
    options: Dict[str, Any] = field(default_factory=dict)
    info: Dict[str, Any] = field(default_factory=dict)  # MPI library, date, seconds taken
    analysis: Optional[placement.TopologyAnalysis] = None

    @property
    def nodes(self) -> List[List[int]]:
        return [[r for r in range(self.size) if self.node_of[r] == k] for k in range(max(self.node_of) + 1)]

    @property
    def tiers(self) -> List[placement.Tier]:
        return self.analysis.tiers if self.analysis else []

    @property
    def hotspots(self) -> List[placement.Hotspot]:
        return self.analysis.hotspots if self.analysis else []

    def analyse(self, **rules) -> "ProbeResult":
        """(Re)computes the analysis; rules: gap, min_share, ratio, traffic, traffic_name."""
        self.analysis = placement.analyse(self.bandwidth, self.latency, self.node_of, self.hosts, **rules)
        return self

    def to_dict(self) -> dict:
        def matrix(m):
            return [[None if not np.isfinite(v) else float(v) for v in row] for row in np.atleast_2d(m)]

        return {
            "format": FORMAT,
            "size": self.size,
            "hosts": self.hosts,
            "node_of": self.node_of,
            "nodes": self.nodes,
            "bandwidth_bytes_per_s": matrix(self.bandwidth),
            "latency_s": matrix(self.latency),
            "latency_median_s": matrix(self.latency_median),
            "memcpy_bytes_per_s": [float(v) for v in self.memcpy],
            "options": self.options,
            "info": self.info,
            "analysis": self.analysis.to_dict() if self.analysis else None,
        }

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_dict(cls, d: dict) -> "ProbeResult":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a zcoll probe result (format {d.get('format')!r}, expected {FORMAT!r})")

        def matrix(rows):
            return np.array([[np.nan if v is None else v for v in row] for row in rows], float)

        r = cls(d["size"], list(d["hosts"]), list(d["node_of"]), matrix(d["bandwidth_bytes_per_s"]),
                matrix(d["latency_s"]), matrix(d["latency_median_s"]), np.array(d["memcpy_bytes_per_s"], float),
                dict(d.get("options", {})), dict(d.get("info", {})))
        a = d.get("analysis")
        if a is not None:
            place = a["placement"]
            r.analysis = placement.TopologyAnalysis(
                [placement.MeasuredLink(**{**l, "pairs": [tuple(p) for p in l["pairs"]]}) for l in a["links"]],
                [placement.Tier(**t) for t in a["tiers"]],
                [placement.Hotspot(**{**h, "pairs": [tuple(p) for p in h["pairs"]]}) for h in a["hotspots"]],
                list(a["slow_nodes"]),
                None if place is None else placement.Placement(**{
                    **place, "current_hop": tuple(place["current_hop"]),
                    "suggested_hop": tuple(place["suggested_hop"])}),
                dict(a.get("rules", {})),
            )
        return r


def load(path) -> ProbeResult:
    """A probe result written by `zcoll probe` (its probe.json)."""
    return ProbeResult.from_dict(json.loads(Path(path).read_text()))


# -- 1. schedule -----------------------------------------------------------------------------------
def tournament(p: int) -> List[List[Tuple[int, int]]]:
    """Rounds pairing every two of p ranks once, each rank in at most one pair per round (the
    circle method: rank p-1, or a bye for odd p, stays put while the others rotate)."""
    n = p + (p % 2)
    circle = list(range(n))
    rounds = []
    for _ in range(n - 1):
        pairs = [(circle[k], circle[n - 1 - k]) for k in range(n // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a < p and b < p])
        circle = [circle[0], circle[-1], *circle[1:-1]]
    return rounds


def schedule(p: int, node_of: Sequence[int], serial: bool = False) -> List[List[Tuple[int, int]]]:
    """The tournament's rounds, each split into steps whose pairs touch different nodes (one pair
    per step when serial)."""
    steps = []
    for pairs in tournament(p):
        if serial:
            steps += [[pair] for pair in pairs]
            continue
        pending = list(pairs)
        while pending:
            busy, step, rest = set(), [], []
            for a, b in pending:
                touched = {node_of[a], node_of[b]}
                if touched & busy:
                    rest.append((a, b))
                else:
                    busy |= touched
                    step.append((a, b))
            steps.append(step)
            pending = rest
    return steps


# -- 2. measurement --------------------------------------------------------------------------------
def _quiet_barrier(comm) -> None:
    """A barrier that sleeps instead of spinning, so waiting ranks leave the cores alone."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def _ping_pong(comm, peer: int, first: bool, iters: int) -> Tuple[float, float]:
    """(min, median) one-way latency, timed by the first rank and sent to the other (whose own
    clock would count the wait for the first message)."""
    buf = np.zeros(8, np.uint8)
    samples = []
    for k in range(10 + iters):
        t = time.perf_counter()
        if first:
            comm.Send(buf, peer, _TAG_LATENCY)
            comm.Recv(buf, peer, _TAG_LATENCY)
        else:
            comm.Recv(buf, peer, _TAG_LATENCY)
            comm.Send(buf, peer, _TAG_LATENCY)
        if k >= 10:
            samples.append((time.perf_counter() - t) / 2)
    result = np.array([np.min(samples), np.median(samples)])
    if first:
        comm.Send(result, peer, _TAG_CONTROL)
    else:
        comm.Recv(result, peer, _TAG_CONTROL)
    return float(result[0]), float(result[1])


def _stream(comm, src: int, dst: int, opt: Options, latency: float, send_buf, recv_bufs) -> Optional[float]:
    """Bandwidth src->dst in bytes/s (on dst; None elsewhere): module docstring, step 2."""
    from mpi4py import MPI

    me, m, w = comm.rank, opt.message_bytes, opt.window
    ack = np.zeros(1, np.int64)

    def post(k: int):
        return comm.Isend(send_buf, dst, _TAG_DATA) if me == src else comm.Irecv(recv_bufs[k], src, _TAG_DATA)

    def stream(count: int) -> List[float]:
        """Keeps `window` messages in flight until `count` are done; the completion times."""
        reqs = [post(k) for k in range(min(w, count))]
        posted, done = len(reqs), []
        while True:
            k = MPI.Request.Waitany(reqs)
            if k == MPI.UNDEFINED:
                break
            done.append(time.perf_counter())
            if posted < count:
                reqs[k] = post(k)
                posted += 1
        if me == src:
            comm.Recv(ack, dst, _TAG_CONTROL)
        else:
            comm.Send(ack, src, _TAG_CONTROL)
        return done

    count = np.array([0], np.int64)
    start = time.perf_counter()
    stream(w)  # warm-up: connections, buffers, the first window; sizes the stream
    if me == dst:
        rate = w * m / max(time.perf_counter() - start - latency, 1e-9)
        count[0] = int(min(opt.max_messages, max(2 * w, round(opt.budget / opt.repeats * rate / m))))
        comm.Send(count, src, _TAG_CONTROL)
    else:
        comm.Recv(count, dst, _TAG_CONTROL)
    best = 0.0
    for _ in range(opt.repeats):
        done = stream(int(count[0]))
        if me == dst:
            steady = (len(done) - w) * m  # bytes that arrived after the first window had
            best = max(best, steady / max(done[-1] - done[w - 1], 1e-9))
    return best if me == dst else None


def _memcpy_rate(nbytes: int) -> float:
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    best = min(_timed_copy(a, b) for _ in range(5))
    return nbytes / best


def _timed_copy(a, b) -> float:
    t = time.perf_counter()
    np.copyto(b, a)
    return time.perf_counter() - t


def measure(comm=None, options: Optional[Options] = None, progress: Optional[Callable[[str], None]] = None,
            **rules) -> ProbeResult:
    """Measures every directed pair (collective over the mpi4py communicator `comm`, default
    COMM_WORLD) and analyses it (rules: see ProbeResult.analyse). Every rank gets the result.
    progress(line) is called on rank 0 as each step starts."""
    from mpi4py import MPI  # (initialises MPI: not at import)

    opt = options or Options()
    parent = MPI.COMM_WORLD if comm is None else comm
    zc = Communicator(parent)
    try:
        node_of = [zc.node_of(r) for r in range(zc.size)]
    finally:
        zc.free()
    comm = parent.Dup()
    try:
        return _measure(comm, opt, node_of, progress, _C.env_get("ZCOLL_NODE_ID"), rules)
    finally:
        comm.Free()


def _measure(comm, opt: Options, node_of, progress, node_id: str, rules) -> ProbeResult:
    from mpi4py import MPI

    p, me = comm.size, comm.rank
    say = progress if (progress is not None and me == 0) else (lambda _line: None)
    start = time.perf_counter()
    send_buf = np.ones(opt.message_bytes, np.uint8)
    recv_bufs = [np.empty(opt.message_bytes, np.uint8) for _ in range(opt.window)]
    measured: List[Tuple[int, int, float, float, float]] = []  # (src, dst, bw, lat min, lat median)
    steps = schedule(p, node_of, opt.serial)
    say(f"probe: {p} ranks on {len(set(node_of))} nodes, {p * (p - 1)} directed links in {len(steps)} steps "
        f"({opt.message_bytes} B messages, {opt.window} in flight, {opt.budget:g} s per direction)")
    for n, step in enumerate(steps):
        _quiet_barrier(comm)
        say(f"  step {n + 1}/{len(steps)}: " + " ".join(f"{a}<->{b}" for a, b in step)
            + f"  (at {time.perf_counter() - start:.1f} s)")
        for a, b in step:
            if me not in (a, b):
                continue
            peer = b if me == a else a
            lat_min, lat_med = _ping_pong(comm, peer, me == a, opt.latency_iters)
            for src, dst in ((a, b), (b, a)):
                rate = _stream(comm, src, dst, opt, lat_min, send_buf, recv_bufs)
                if rate is not None:
                    measured.append((src, dst, rate, lat_min, lat_med))
    del recv_bufs
    copy_rate = 0.0
    for r in range(p):
        _quiet_barrier(comm)
        if me == r:
            copy_rate = _memcpy_rate(opt.copy_bytes)
    host = node_id or MPI.Get_processor_name()
    gathered = comm.gather((measured, copy_rate, host), root=0)
    result = None
    if me == 0:
        bw = np.full((p, p), np.nan)
        lat = np.full((p, p), np.nan)
        lat_med = np.full((p, p), np.nan)
        for rows, _, _ in gathered:
            for src, dst, rate, lmin, lmed in rows:
                bw[src, dst], lat[src, dst], lat_med[src, dst] = rate, lmin, lmed
        result = ProbeResult(
            p, [g[2] for g in gathered], list(node_of), bw, lat, lat_med, np.array([g[1] for g in gathered]),
            options=dict(vars(opt)),
            info={"mpi": MPI.Get_library_version().splitlines()[0].strip(),
                  "date": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.perf_counter() - start, 2)},
        )
        result.analyse(**rules)
        say(f"probe: measured in {result.info['seconds']} s")
    return ProbeResult.from_dict(comm.bcast(result.to_dict() if result else None, root=0))
