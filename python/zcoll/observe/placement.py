"""What a measured link matrix says: links, tiers, hotspots, slow nodes, a better placement.

Pure functions on numpy matrices (no MPI), used by `zcoll probe` (probe.py) and by anything that
wants to order ranks by measured bandwidth (a topology-ordered ring: zcoll._C.best_ring_order).

Inputs: bw[i, j] = bytes per second from rank i to rank j, lat[i, j] = seconds one way (the
diagonal is ignored), node_of[r] = the node of rank r.

1. Links (links()). Between nodes, a link is a directed pair of *nodes* a->b: its ranks share the
   node's network interface, so the link's bandwidth and latency are the medians over the rank
   pairs (i on a, j on b). Within a node, every directed rank pair i->j is a link.
2. Tiers (find_tiers()), separately for intra-node and inter-node links. Sort the links by
   bandwidth, fastest first, and cut where one link is `gap` (default 2) times slower than the
   one before it. A group holding at least max(2, ceil(min_share x links of its kind)) links
   (min_share default 0.25) is a tier of its own; if no group is that big, the fastest group is.
   Each smaller group joins the tier nearest to it in log-bandwidth (a faster one on a tie): a
   few slow links are faults, not structure. A tier's reference bandwidth and latency are the
   medians of the links that formed it (not of those that joined it).
3. Hotspots (find_hotspots()): a link slower than `ratio` (default 0.7) x its tier's reference
   bandwidth; or whose latency exceeds twice its tier's reference and that by more than 20 us.
   Within an inter-node link, a rank pair below `ratio` x that link's median is a hotspot too
   (one rank's path, e.g. a NIC rail).
4. Slow nodes (slow_nodes()): with 3 or more nodes, a node every one of whose inter-node links
   (both directions) is a hotspot or in a slower tier than the fastest inter-node tier.
5. Placement (suggest_placement()): which rank should run where. Each current rank position is
   a slot; a placement perm puts rank r on slot perm[r]. A slot pair's bandwidth is the median of
   its node pair's (ranks of one host are interchangeable: placement files name hosts). For a traffic
   pattern t (default: a ring in rank order, as ring allreduce and pipeline neighbours use it)
   its cost is (the slowest transfer, max t[r, s] / bw[perm r, perm s]; then the sum of them).
   Searched exactly up to 8 ranks, by pairwise swaps from the current and from a node-blocked
   placement above. Suggested only when the slowest transfer gets at least 10% faster (or, at an
   equal one, the sum does).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

LATENCY_FLOOR_S = 20e-6  # a latency hotspot is at least this much above its tier's reference


@dataclass
class MeasuredLink:
    """One directed link. inter-node: src/dst are nodes; intra-node: ranks (of node `node`)."""

    kind: str  # "intra" or "inter"
    src: int
    dst: int
    node: int  # intra: the node holding both ranks; inter: -1
    bandwidth: float  # bytes/s (median over `pairs` for an inter-node link)
    latency: float  # seconds, one way (median over `pairs`)
    pairs: List[Tuple[int, int]]  # the rank pairs (i, j) this link carries
    tier: int = -1  # index into the tier list

    def name(self) -> str:
        if self.kind == "inter":
            return f"node {self.src} -> node {self.dst}"
        return f"rank {self.src} -> rank {self.dst} (node {self.node})"


@dataclass
class Tier:
    name: str  # "intra-node", "inter-node", "inter-node 2", ...
    kind: str
    bandwidth: float  # reference: median bandwidth of the links that formed it
    latency: float  # reference: median latency of the same links
    links: int  # links in the tier, joined ones included


@dataclass
class Hotspot:
    what: str  # "bandwidth" or "latency"
    link: str  # MeasuredLink.name(), or "rank i -> rank j" for a rank pair inside an inter-node link
    pairs: List[Tuple[int, int]]
    value: float  # bytes/s or seconds
    reference: float  # the tier's (or node link's) median it is compared with
    tier: str

    def describe(self) -> str:
        if self.what == "bandwidth":
            return (f"{self.link}: {self.value / 1e6:.1f} MB/s, {self.value / self.reference:.2f}x "
                    f"the {self.reference / 1e6:.1f} MB/s of {self.tier}")
        return (f"{self.link}: latency {self.value * 1e6:.1f} us, {self.value / self.reference:.1f}x "
                f"the {self.reference * 1e6:.1f} us of {self.tier}")


@dataclass
class Placement:
    """Rank r should run on slot perm[r] (where rank perm[r] runs now), host hosts[r]."""

    perm: List[int]
    hosts: List[str]
    traffic: str  # what it optimises: "ring in rank order" or a file name
    current_slowest: float  # seconds per traffic unit of the slowest transfer, now
    suggested_slowest: float
    current_total: float
    suggested_total: float
    current_hop: Tuple[int, int]  # the slowest transfer now (ranks)
    suggested_hop: Tuple[int, int]  # and with the suggestion (ranks)
    improves: bool  # worth moving ranks (see the module docstring, step 5)

    def speedup(self) -> float:
        return self.current_slowest / self.suggested_slowest if self.suggested_slowest else 1.0


@dataclass
class TopologyAnalysis:
    links: List[MeasuredLink]
    tiers: List[Tier]
    hotspots: List[Hotspot]
    slow_nodes: List[int]
    placement: Optional[Placement]
    rules: Dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# -- 1. links --------------------------------------------------------------------------------------
def links(bw: np.ndarray, lat: np.ndarray, node_of: Sequence[int]) -> List[MeasuredLink]:
    """Intra-node rank links and inter-node node links (module docstring, step 1)."""
    p = len(node_of)
    out: List[MeasuredLink] = []
    for i in range(p):
        for j in range(p):
            if i != j and node_of[i] == node_of[j]:
                out.append(MeasuredLink("intra", i, j, node_of[i], float(bw[i, j]), float(lat[i, j]), [(i, j)]))
    nodes = sorted(set(node_of))
    for a in nodes:
        for b in nodes:
            if a == b:
                continue
            pairs = [(i, j) for i in range(p) for j in range(p) if node_of[i] == a and node_of[j] == b]
            out.append(MeasuredLink("inter", a, b, -1, float(np.median([bw[i, j] for i, j in pairs])),
                            float(np.median([lat[i, j] for i, j in pairs])), pairs))
    return out


# -- 2. tiers --------------------------------------------------------------------------------------
def group_by_gaps(values: Sequence[float], gap: float) -> List[List[int]]:
    """Indices of values, fastest first, cut where the next is `gap` times smaller."""
    order = sorted(range(len(values)), key=lambda k: -values[k])
    groups: List[List[int]] = []
    for k in order:
        if groups and values[groups[-1][-1]] < gap * values[k]:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def find_tiers(all_links: List[MeasuredLink], gap: float = 2.0, min_share: float = 0.25) -> List[Tier]:
    """Tiers per kind (module docstring, step 2); sets each link's `tier`. Tiers are listed intra
    first, then inter, each kind fastest first."""
    tiers: List[Tier] = []
    for kind in ("intra", "inter"):
        mine = [l for l in all_links if l.kind == kind]
        if not mine:
            continue
        bws = [max(l.bandwidth, 1e-9) for l in mine]
        groups = group_by_gaps(bws, gap)
        big = max(2, math.ceil(min_share * len(mine)))
        cores = [g for g in groups if len(g) >= big] or [groups[0]]
        members = {id(c): list(c) for c in cores}
        for g in groups:
            if any(g is c for c in cores):
                continue
            centre = math.log(np.median([bws[k] for k in g]))
            nearest = min(cores, key=lambda c: (abs(math.log(np.median([bws[k] for k in c])) - centre),
                                                -np.median([bws[k] for k in c])))
            members[id(nearest)] += g
        label = "intra-node" if kind == "intra" else "inter-node"
        for n, core in enumerate(cores):
            index = len(tiers)
            for k in members[id(core)]:
                mine[k].tier = index
            tiers.append(Tier(label if n == 0 else f"{label} {n + 1}", kind,
                              float(np.median([mine[k].bandwidth for k in core])),
                              float(np.median([mine[k].latency for k in core])), len(members[id(core)])))
    return tiers


# -- 3. hotspots -----------------------------------------------------------------------------------
def find_hotspots(all_links: List[MeasuredLink], tiers: List[Tier], bw: np.ndarray, ratio: float = 0.7) -> List[Hotspot]:
    """Links well below their tier (module docstring, step 3), slowest relative first."""
    found: List[Hotspot] = []
    for l in all_links:
        t = tiers[l.tier]
        if l.bandwidth < ratio * t.bandwidth:
            found.append(Hotspot("bandwidth", l.name(), l.pairs, l.bandwidth, t.bandwidth, t.name))
        if l.latency > 2 * t.latency and l.latency - t.latency > LATENCY_FLOOR_S:
            found.append(Hotspot("latency", l.name(), l.pairs, l.latency, t.latency, t.name))
        if l.kind == "inter" and len(l.pairs) > 1:
            for i, j in l.pairs:
                if bw[i, j] < ratio * l.bandwidth:
                    found.append(Hotspot("bandwidth", f"rank {i} -> rank {j} (in {l.name()})", [(i, j)],
                                         float(bw[i, j]), l.bandwidth, f"the median of {l.name()}"))
    return sorted(found, key=lambda h: h.value / h.reference if h.what == "bandwidth" else h.reference / h.value)


# -- 4. slow nodes ---------------------------------------------------------------------------------
def slow_nodes(all_links: List[MeasuredLink], tiers: List[Tier], hotspots: List[Hotspot]) -> List[int]:
    """Nodes all of whose inter-node links are slow (module docstring, step 4)."""
    inter = [l for l in all_links if l.kind == "inter"]
    nodes = sorted({l.src for l in inter})
    if len(nodes) < 3:
        return []
    fastest = min((l.tier for l in inter), default=-1)
    hot = {h.link for h in hotspots if h.what == "bandwidth"}
    slow = {(l.src, l.dst) for l in inter if l.tier != fastest or l.name() in hot}
    return [k for k in nodes if all((l.src, l.dst) in slow for l in inter if k in (l.src, l.dst))]


# -- 5. placement ----------------------------------------------------------------------------------
def ring_traffic(p: int) -> np.ndarray:
    """t[r, r+1] = 1: the neighbour exchange of a ring in rank order."""
    t = np.zeros((p, p))
    if p > 1:
        for r in range(p):
            t[r, (r + 1) % p] = 1.0
    return t


def placement_cost(perm: Sequence[int], bw: np.ndarray, traffic: np.ndarray) -> Tuple[float, float, Tuple[int, int]]:
    """(slowest transfer, sum of transfers, its rank pair) of ranks placed on slots perm (seconds
    per unit of traffic)."""
    src, dst = np.nonzero(traffic)
    if len(src) == 0:
        return 0.0, 0.0, (0, 0)
    p = np.asarray(perm)
    cost = traffic[src, dst] / bw[p[src], p[dst]]
    k = int(np.argmax(cost))
    return float(cost[k]), float(cost.sum()), (int(src[k]), int(dst[k]))


def _better(a: Tuple[float, float], b: Tuple[float, float]) -> bool:
    """a beats b: a clearly (>0.1%) faster slowest transfer, or about equal and a smaller sum."""
    if a[0] < b[0] * 0.999:
        return True
    return a[0] <= b[0] * 1.001 and a[1] < b[1] * 0.999


def _search(bw: np.ndarray, traffic: np.ndarray, starts: List[List[int]], exact_up_to: int = 8) -> List[int]:
    p = len(bw)
    best = list(starts[0])
    best_cost = placement_cost(best, bw, traffic)[:2]
    if p <= exact_up_to:
        for perm in itertools.permutations(range(p)):
            c = placement_cost(perm, bw, traffic)[:2]
            if _better(c, best_cost):
                best, best_cost = list(perm), c
        return best
    for start in starts:
        perm, cost = list(start), placement_cost(start, bw, traffic)[:2]
        improved = True
        while improved:
            improved = False
            for i in range(p):
                for j in range(i + 1, p):
                    perm[i], perm[j] = perm[j], perm[i]
                    c = placement_cost(perm, bw, traffic)[:2]
                    if _better(c, cost):
                        cost, improved = c, True
                    else:
                        perm[i], perm[j] = perm[j], perm[i]
        if _better(cost, best_cost):
            best, best_cost = perm, cost
    return best


def node_smoothed(bw: np.ndarray, node_of: Sequence[int]) -> np.ndarray:
    """bw with each rank pair replaced by the median of its node pair's rank pairs: a placement
    moves ranks between hosts, and ranks of one host are interchangeable."""
    out = np.array(bw, float)
    p = len(node_of)
    for a in set(node_of):
        for b in set(node_of):
            pairs = [(i, j) for i in range(p) for j in range(p) if i != j and node_of[i] == a and node_of[j] == b]
            if pairs:
                value = float(np.median([bw[i, j] for i, j in pairs]))
                for i, j in pairs:
                    out[i, j] = value
    return out


def suggest_placement(
    bw: np.ndarray,
    node_of: Sequence[int],
    hosts: Sequence[str],
    traffic: Optional[np.ndarray] = None,
    traffic_name: str = "ring in rank order",
    min_gain: float = 1.1,
) -> Optional[Placement]:
    """The placement with the lowest cost for `traffic` (module docstring, step 5); None for one
    rank. `improves` says whether it is worth moving ranks for it."""
    p = len(node_of)
    if p < 2:
        return None
    bw = node_smoothed(np.asarray(bw, float), node_of)
    t = ring_traffic(p) if traffic is None else np.asarray(traffic, float)
    if t.shape != (p, p):
        raise ValueError(f"traffic matrix must be {p}x{p}, got {t.shape}")
    blocked = sorted(range(p), key=lambda r: (node_of[r], r))  # each node's ranks consecutive
    perm = _search(bw, t, [list(range(p)), blocked])
    now_slow, now_total, now_hop = placement_cost(range(p), bw, t)
    new_slow, new_total, new_hop = placement_cost(perm, bw, t)
    improves = (now_slow >= min_gain * new_slow) or (
        now_slow <= new_slow * 1.01 and now_total >= min_gain * new_total)
    return Placement(perm, [hosts[s] for s in perm], traffic_name, now_slow, new_slow, now_total, new_total,
                     now_hop, new_hop, bool(improves))


def analyse(
    bw: np.ndarray,
    lat: np.ndarray,
    node_of: Sequence[int],
    hosts: Sequence[str],
    gap: float = 2.0,
    min_share: float = 0.25,
    ratio: float = 0.7,
    traffic: Optional[np.ndarray] = None,
    traffic_name: str = "ring in rank order",
) -> TopologyAnalysis:
    """Steps 1-5 of the module docstring on one measurement."""
    bw = np.asarray(bw, float)
    lat = np.asarray(lat, float)
    all_links = links(bw, lat, node_of)
    tiers = find_tiers(all_links, gap, min_share)
    hot = find_hotspots(all_links, tiers, bw, ratio)
    place = suggest_placement(bw, node_of, hosts, traffic, traffic_name)
    rules = {"tier_gap": gap, "tier_min_share": min_share, "hotspot_ratio": ratio}
    return TopologyAnalysis(all_links, tiers, hot, slow_nodes(all_links, tiers, hot), place, rules)
