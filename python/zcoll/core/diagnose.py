"""Link telemetry and its verdict: healthy, slow rank k, slow link i->j, or slow node k.

The engine times real work (csrc/comm/telemetry.h): per collective each rank's arrival and the
time it spent in the call, per message the send's post time and the receive's completion time,
summed per peer. :func:`link_stats` turns every rank's sums (gathered to every rank) into:

* ``bytes[i, j]``, ``messages[i, j]``: what rank i sent to rank j;
* ``busy[i, j]``: seconds the messages i -> j spent in flight, summed over messages (from i's
  post to j's observed completion, on a common clock): a link's messages queue when it is slow;
* ``latency[i, j] = busy / messages`` and ``gbps[i, j] = bytes / busy / 1e9``, per message;
* ``arrival_delay[k]``: how much later than the earliest rank rank k entered collectives, on
  average (seconds); ``call_seconds[k]``: its mean time inside one.

:class:`Diagnoser` classifies each window together with the earlier ones at falling weight
(:func:`blend`, ``memory`` 0.5 per window) and keeps a label only when ``confirm`` (3) consecutive
windows agree (hysteresis), logging one warning line when it changes. :func:`classify`:

1. **slow rank k**: k arrives late by more than ``rank_threshold`` x the others' mean time in a
   call (compute, data loading, a busy core). Checked first: the messages sent to a late rank
   wait for it, which would otherwise look like slow links into it.
2. **slow node k** (all of its links): the lower median of node k's outgoing (or incoming)
   active links, at least two, is ``node_threshold`` x the median of the links that avoid node k
   (per byte, see 3); the node with the highest such ratio is named. A median, not every link: on many nodes the collectives' later
   steps wait on the slow node, so links that avoid it queue too, and one slow link of a node
   does not move its median.
3. **slow link i->j**: links whose time per byte is ``link_threshold`` x the reference of their
   tier (within a node / across nodes): its lower quartile, which stays a healthy link's even
   when half the tier is slow (one node's links of two nodes); and the slow links stand apart:
   ``link_gap`` x the slowness of the next link that is not counted slow. Waiting behind a late
   peer (the first step of halving-doubling absorbs the others' arrival skew) spreads slowness
   over many links in a continuum; a degraded link stands alone. The slowest is named.
4. otherwise **healthy**.

A window needs ``min_calls`` collectives; links that moved fewer than ``min_link_bytes`` are
not judged (latency, not bandwidth, dominates tiny messages). Nodes: ``nodes[r]`` names rank r's
node (the network helper's ZCOLL_NODE_ID, or anything hashable); without them each rank is its
own node.

    stats = comm.link_stats(reset=True)          # collective
    verdict = comm.diagnose()                    # collective: label + evidence, logged on change
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

log = logging.getLogger("zcoll")

_HEAD = 4  # csrc/comm/telemetry.h: base_ns, calls, arrival_sum, duration_sum
_PER_PEER = 6  # sent_bytes, sends, send_post_sum, recv_bytes, recvs, recv_done_sum


@dataclass
class LinkStats:
    """One window of telemetry, the same on every rank (see the module docstring)."""

    calls: int
    bytes: np.ndarray
    messages: np.ndarray
    busy: np.ndarray
    latency: np.ndarray
    gbps: np.ndarray
    arrival_delay: np.ndarray
    call_seconds: np.ndarray

    @property
    def ranks(self) -> int:
        return len(self.arrival_delay)


def from_rows(rows: np.ndarray) -> LinkStats:
    """LinkStats from the gathered rows of ``_link_stats_rows`` (csrc/collectives/link_stats.h).
    Sums are rebuilt exactly in Python integers before anything is divided."""
    rows = np.asarray(rows, dtype=np.int64)
    p = rows.shape[0]
    if rows.shape[1] != _HEAD + p * (1 + _PER_PEER):
        raise ValueError(f"telemetry rows of shape {rows.shape} do not fit {p} ranks")
    head = rows[:, :_HEAD].tolist()  # Python integers: calls x shift may not fit int64
    offset = rows[0, _HEAD : _HEAD + p].tolist()  # clock_r - clock_0, measured by rank 0
    shift = [head[r][0] - offset[r] for r in range(p)]  # rank r's relative time -> rank 0's clock
    calls = [h[1] for h in head]
    peer = rows[:, _HEAD + p :].reshape(p, p, _PER_PEER)  # peer[i, j] = rank i's sums about rank j

    nan = float("nan")
    arrival = np.array([(h[2] + c * s) / c / 1e9 if c else nan for h, c, s in zip(head, calls, shift)])
    seconds = np.array([h[3] / c / 1e9 if c else nan for h, c in zip(head, calls)])
    delay = arrival - np.nanmin(arrival) if np.isfinite(arrival).any() else arrival

    nbytes = peer[:, :, 0].astype(np.float64)
    messages = peer[:, :, 1].astype(np.float64)
    # busy[i, j]: rank j's receive completions minus rank i's send posts, in rank 0's clock. Both
    # sums are relative to their rank's window start, so only the start difference is scaled by
    # the count: every term stays a small exact int64.
    sends, recvs = peer[:, :, 1], peer[:, :, 4].T
    start = np.array(shift, dtype=np.int64)
    ns = (peer[:, :, 5].T - peer[:, :, 2]) + sends * (start[None, :] - start[:, None])
    busy = np.where((sends > 0) & (sends == recvs), ns / 1e9, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        latency = busy / messages
        gbps = nbytes / busy / 1e9
    return LinkStats(min(calls) if calls else 0, nbytes, messages, busy, latency, gbps, delay, seconds)


@dataclass
class Verdict:
    """A label ("healthy", "slow rank", "slow link", "slow node"), who, and the evidence."""

    label: str
    rank: Optional[int] = None  # slow rank / slow node (the node's name when nodes are given)
    link: Optional[Tuple[int, int]] = None  # slow link (i, j)
    node: Any = None
    evidence: str = ""
    details: Dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.label == "slow rank":
            who = f"slow rank {self.rank}"
        elif self.label == "slow link":
            who = f"slow link {self.link[0]}->{self.link[1]}"
        elif self.label == "slow node":
            who = f"slow node {self.node}"
        else:
            who = self.label
        return f"{who}: {self.evidence}" if self.evidence else who

    def key(self) -> tuple:
        return (self.label, self.rank, self.link, self.node)


@dataclass
class Thresholds:
    rank_threshold: float = 0.3  # arrival delay / the others' mean time in a call
    rank_floor: float = 2e-4  # seconds: arrival delays below this are noise
    link_threshold: float = 2.0  # time per byte / the tier's lower quartile
    link_gap: float = 2.0  # the slow links' slowness / the next link's
    node_threshold: float = 2.0  # the node's links' lower median / the median of links avoiding it
    min_calls: int = 3
    min_link_bytes: int = 256 * 1024  # per window


def classify(
    stats: LinkStats, nodes: Optional[Sequence[Any]] = None, t: Thresholds = Thresholds()
) -> Verdict:
    """The verdict of one window (no hysteresis: see Diagnoser)."""
    p = stats.ranks
    nodes = list(range(p)) if nodes is None else list(nodes)
    if stats.calls < t.min_calls:
        return Verdict(
            "unknown", evidence=f"{stats.calls} collectives in the window, fewer than {t.min_calls}"
        )

    # 1. a late rank
    late = _late_rank(stats, t)
    if late is not None:
        return late
    delay = _zero_nan(stats.arrival_delay)
    k = int(np.argmax(delay))

    # 2-3. links: time per byte against the lower quartile of the link's tier
    active, slowness = _link_slowness(stats, nodes, t)
    slow = _slow_links(slowness, t)
    details = {"slowness": slowness.tolist(), "gbps": stats.gbps.tolist()}

    def rate(i: int, j: int) -> str:
        return f"{i}->{j} {stats.gbps[i, j]:.3f} GB/s per message ({slowness[i, j]:.1f}x slower)"

    best = _slowest_node(slowness, active, nodes, t)
    if best is not None:
        ratio, node, direction, links = best
        return Verdict(
            "slow node",
            rank=min(r for r in range(p) if nodes[r] == node),
            node=node,
            evidence=f"its {len(links)} {direction} links are {ratio:.1f}x slower (lower median) "
            "than the links that avoid it: " + ", ".join(rate(i, j) for i, j in links),
            details=details,
        )
    if not slow:
        links = _no_slow_link(slowness, t)
        return Verdict(
            "healthy",
            evidence=f"no rank arrives late (latest {delay[k] * 1e3:.2f} ms), {links}",
            details=details,
        )
    i, j = max(slow, key=lambda l: slowness[l])
    return Verdict(
        "slow link",
        link=(i, j),
        evidence=rate(i, j)
        + " than its tier's lower quartile; slow links: "
        + ", ".join(f"{a}->{b}" for a, b in slow),
        details=details,
    )


def _late_rank(stats: LinkStats, t: Thresholds) -> Optional[Verdict]:
    """A rank that arrives late enough, and much later than the next latest, to be the cause."""
    p = stats.ranks
    delay = _zero_nan(stats.arrival_delay)
    k = int(np.argmax(delay))
    others = [r for r in range(p) if r != k]
    call = _nanmedian(stats.call_seconds[others]) if others else 0.0
    second = float(np.max(delay[others])) if others else 0.0
    if delay[k] > max(t.rank_floor, t.rank_threshold * call) and delay[k] > 2 * second:
        return Verdict(
            "slow rank",
            rank=k,
            evidence=f"arrives {delay[k] * 1e3:.2f} ms after the earliest rank on average, the others spend "
            f"{call * 1e3:.2f} ms in a call (next latest rank: {second * 1e3:.2f} ms late)",
            details={
                "arrival_delay": stats.arrival_delay.tolist(),
                "call_seconds": stats.call_seconds.tolist(),
            },
        )
    return None


def _no_slow_link(slowness: np.ndarray, t: Thresholds) -> str:
    """The healthy verdict's word on links. A link is slow only against others of its tier; with
    fewer than two that carried enough (2 ranks on one node: one link each way, often one busy),
    there is no yardstick."""
    if not np.isfinite(slowness).any():
        return "no tier has two links that carried enough to compare"
    return (
        f"no link slower than {t.link_threshold:g}x its tier and {t.link_gap:g}x the next "
        f"(slowest {np.nanmax(slowness):.2f}x)"
    )


def _link_slowness(stats: LinkStats, nodes: List[Any], t: Thresholds) -> Tuple[np.ndarray, np.ndarray]:
    """Which links carried enough to judge, and each one's time per byte over the lower quartile
    of its tier's (links inside a node, links between nodes)."""
    p = stats.ranks
    active = (stats.bytes >= t.min_link_bytes) & np.isfinite(stats.busy) & (stats.busy > 0)
    per_byte = np.where(active, stats.busy / np.maximum(stats.bytes, 1), np.nan)
    same_node = _same_node(nodes)
    slowness = np.full((p, p), np.nan)
    for tier in (True, False):
        mask = active & (same_node == tier)
        np.fill_diagonal(mask, False)
        if mask.sum() >= 2:
            slowness[mask] = per_byte[mask] / _percentile(per_byte[mask], 0.25)
    return active, slowness


def _same_node(nodes: List[Any]) -> np.ndarray:
    """same[i, j]: ranks i and j share a node (read-only: one array per placement, every window
    of a job asks for the same)."""
    return _same_node_of(tuple(nodes))


@functools.lru_cache(maxsize=16)
def _same_node_of(nodes: Tuple[Any, ...]) -> np.ndarray:
    labels = np.empty(len(nodes), dtype=object)
    labels[:] = nodes
    same = np.equal.outer(labels, labels).astype(bool)
    same.setflags(write=False)
    return same


# numpy's nan_to_num, nanmedian and percentile spend tens of microseconds each checking and
# dispatching; a window classifies p x p figures a few times a second on a thread beside the
# training, so the few lines below do what the verdict needs of them, with the same results.
def _zero_nan(a: np.ndarray) -> np.ndarray:
    """a with NaN as 0 (its figures are finite or NaN: sums and means of clock differences)."""
    return np.where(np.isnan(a), 0.0, a)


def _nanmedian(a: np.ndarray) -> float:
    """The median of a's values that are not NaN (NaN when none is)."""
    values = np.sort(a[~np.isnan(a)])
    n = len(values)
    if n == 0:
        return float("nan")
    return float(values[n // 2]) if n % 2 else float((values[n // 2 - 1] + values[n // 2]) / 2)


def _percentile(a: np.ndarray, q: float) -> float:
    """np.percentile(a, 100 q) of finite values, numpy's default (linear) method, to the bit."""
    values = np.sort(a)
    pos = (len(values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    t, a0, b0 = pos - lo, float(values[lo]), float(values[hi])
    diff = b0 - a0
    return b0 - diff * (1 - t) if t >= 0.5 else a0 + diff * t


def _slow_links(slowness: np.ndarray, t: Thresholds) -> List[Tuple[int, int]]:
    """The links above the widest break in slowness, when that break is at least link_gap wide
    and every link above it is link_threshold x its tier (a continuum of slow-ish links is
    queueing, not a fault)."""
    ranked = sorted(((float(slowness[l]), l) for l in zip(*np.nonzero(np.isfinite(slowness)))), reverse=True)
    ranked = [(s, (int(i), int(j))) for s, (i, j) in ranked]
    best, cut = 0.0, 0
    for c in range(1, len(ranked) + 1):
        if ranked[c - 1][0] < t.link_threshold:
            break
        below = ranked[c][0] if c < len(ranked) else 1.0
        gap = ranked[c - 1][0] / max(below, 1e-12)
        if gap > best:
            best, cut = gap, c
    return [l for _, l in ranked[:cut]] if best >= t.link_gap else []


def _node_links(node: Any, direction: str, active: np.ndarray, nodes: List[Any]) -> List[Tuple[int, int]]:
    p = len(nodes)
    members = {r for r in range(p) if nodes[r] == node}
    if direction == "out":
        return [(i, j) for i in members for j in range(p) if j not in members and active[i, j]]
    return [(i, j) for j in members for i in range(p) if i not in members and active[i, j]]


def _lower_median(values: List[float]) -> float:
    return float(np.percentile(values, 50, method="lower")) if values else float("nan")


def _slowest_node(slowness: np.ndarray, active: np.ndarray, nodes: List[Any],
                  t: Thresholds) -> Optional[Tuple[float, Any, str, List[Tuple[int, int]]]]:  # fmt: skip
    """The node whose outgoing (or incoming) links are slowest against the links avoiding it
    (lower median over median), if node_threshold x. Outgoing first: between two nodes, one's slow egress
    is the other's slow ingress, and shaping happens on egress. (ratio, node, "out"/"in", links)."""
    between = active & ~_same_node(nodes)
    between &= np.isfinite(slowness)

    def ratio(links: List[Tuple[int, int]], avoid: Any) -> float:
        if len(links) < 2:
            return float("nan")
        others = [
            slowness[i, j] for i, j in zip(*np.nonzero(between)) if nodes[i] != avoid and nodes[j] != avoid
        ]
        if len(others) < 2:  # two nodes: the other direction is the yardstick
            chosen = set(links)
            others = [slowness[l] for l in zip(*np.nonzero(between)) if l not in chosen]
        return (
            _lower_median([slowness[l] for l in links]) / float(np.median(others)) if others else float("nan")
        )

    candidates = []
    for direction in ("out", "in"):
        for node in sorted(set(nodes), key=str):
            links = _node_links(node, direction, between, nodes)
            r = ratio(links, node)
            if np.isfinite(r):
                candidates.append((r, node, direction, links))
    if not candidates:
        return None
    best = max(candidates, key=lambda c: c[0])  # max keeps the first of equals: "out"
    best = (best[0], best[1], best[2] + "going" if best[2] == "out" else "incoming", best[3])
    return best if best[0] >= t.node_threshold else None


def blend(old: Optional[LinkStats], new: LinkStats, memory: float) -> LinkStats:
    """new plus `memory` x old: sums add (bytes, messages, busy), per-call means are weighted by
    their calls. A window of a few collectives on a busy machine is noisy; this keeps the last
    windows' evidence at geometrically falling weight."""
    if old is None or memory <= 0 or old.ranks != new.ranks:
        return new
    w_old, w_new = memory * old.calls, new.calls
    total = w_old + w_new

    def mean(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (w_old * _zero_nan(a) + w_new * _zero_nan(b)) / total if total else b

    nbytes = memory * old.bytes + new.bytes
    messages = memory * old.messages + new.messages
    busy = memory * _zero_nan(old.busy) + _zero_nan(new.busy)
    busy[messages == 0] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        return LinkStats(
            int(round(total)),
            nbytes,
            messages,
            busy,
            busy / messages,
            nbytes / busy / 1e9,
            mean(old.arrival_delay, new.arrival_delay),
            mean(old.call_seconds, new.call_seconds),
        )


SIMILAR = 1.3  # a window's time per byte of a link within this factor of the evidence's
SIMILAR_DELAY = 0.1  # a rank's arrival delay within this x the mean time in a call (or rank_floor)


def similar(old: LinkStats, new: LinkStats, t: Thresholds = Thresholds()) -> bool:
    """Whether window `new` tells what the evidence `old` told (Diagnoser's settle): enough
    collectives, the same links carried enough, each one's time per byte within SIMILAR x, and
    each rank's arrival delay within SIMILAR_DELAY x a call's time (at least rank_floor / 2)."""
    if new.calls < t.min_calls or old.ranks != new.ranks:
        return False
    with np.errstate(invalid="ignore", divide="ignore"):
        a_old = (old.bytes >= t.min_link_bytes) & (old.busy > 0)
        a_new = (new.bytes >= t.min_link_bytes) & (new.busy > 0)
        if not np.array_equal(a_old, a_new):
            return False
        ratio = (new.busy[a_new] / new.bytes[a_new]) / (old.busy[a_new] / old.bytes[a_new])
        if ratio.size and not (ratio.min() >= 1 / SIMILAR and ratio.max() <= SIMILAR):
            return False
        moved = np.abs(_zero_nan(new.arrival_delay) - _zero_nan(old.arrival_delay))
        call = _nanmedian(old.call_seconds)
    return bool(moved.max() <= max(t.rank_floor / 2, SIMILAR_DELAY * (call if call == call else 0.0)))


class Diagnoser:
    """Windows of telemetry in, a stable label out. Each window is classified together with the
    earlier ones at `memory` x the weight per window (blend), and a new label replaces the
    current one only after `confirm` consecutive windows gave it; each change is logged once
    (logging, "zcoll"). `history` keeps the verdicts of the last that many windows. With
    `settle` (seconds), a window like the evidence before it, while no new label awaits
    confirmation, is only blended, classified at least every `settle` seconds (_settled)."""

    def __init__(
        self,
        nodes: Optional[Sequence[Any]] = None,
        confirm: int = 3,
        memory: float = 0.5,
        thresholds: Thresholds = Thresholds(),
        name: str = "zcoll",
        quiet: bool = False,
        history: int = 256,
        settle: Optional[float] = None,
        clock: Any = time.monotonic,
    ):
        self.nodes = nodes
        self.confirm = confirm
        self.memory = memory
        self.evidence: Optional[LinkStats] = None
        self.thresholds = thresholds
        self.name = name
        self.quiet = quiet  # no log line (every rank reaches the same verdict; one of them logs)
        self.current = Verdict("healthy", evidence="no telemetry yet")
        self._candidate: Optional[Verdict] = None
        self._streak = 0
        self.history: Deque[Verdict] = collections.deque(maxlen=history)  # the latest verdicts
        self.settle, self.clock = settle, clock
        self._classified = -math.inf  # when classify last ran (clock)
        self.windows = 0  # windows updated
        self.skipped = 0  # of them, blended without classifying (settle)

    def update(self, stats: LinkStats) -> Verdict:
        old = self.evidence
        self.evidence = blend(old, stats, self.memory)
        self.windows += 1
        if self._settled(old, stats):
            self.skipped += 1
            self.history.append(self.current)
            return self.current
        self._classified = self.clock()
        verdict = classify(self.evidence, self.nodes, self.thresholds)
        self.history.append(verdict)
        if verdict.label == "unknown":
            return self.current
        if verdict.key() == self.current.key():
            self.current = verdict  # fresher evidence
            self._candidate, self._streak = None, 0
            return self.current
        if self._candidate is not None and verdict.key() == self._candidate.key():
            self._streak += 1
        else:
            self._candidate, self._streak = verdict, 1
        if self._streak >= self.confirm:
            if not self.quiet:
                log.warning(
                    "%s: link diagnosis changed from %s to %s", self.name, self.current.label, verdict
                )
            self.current = verdict
            self._candidate, self._streak = None, 0
        return self.current

    def _settled(self, old: Optional[LinkStats], new: LinkStats) -> bool:
        """With `settle` seconds: True when classifying this window can wait (blend only): the
        verdict is settled (no new label awaiting confirmation), the last classification is less
        than `settle` seconds old, and the window says what the evidence before it said (similar).
        Classifying costs a few hundred microseconds of Python a window, on a thread beside the
        training; a window that moved (a link or a rank slowing down) is classified at once, so
        a change is confirmed in as many windows as without `settle`."""
        if self.settle is None or old is None or self._candidate is not None:
            return False
        if self.clock() - self._classified >= self.settle:
            return False
        return similar(old, new, self.thresholds)
