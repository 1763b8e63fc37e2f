"""zcoll's allreduce algorithms at 16 to 1,024 simulated ranks (SimGrid SMPI), beside SMPI's own
MPI_Allreduce selectors; then auto's choice and the cost model against the simulated times.

Needs the SMPI build of the benchmark (docs/scale.md; apt-get install libsimgrid-dev):

    cmake -S . -B build/smpi -DZCOLL_SMPI=ON && cmake --build build/smpi -j 2 --target zcoll_allreduce_perf

Steps:
1. sweep (default): for every platform and scale, one `smpirun` of zcoll_allreduce_perf with
   every algorithm (-a), then one per MPI selector (`--cfg=smpi/allreduce:NAME`, row `mpi:NAME`);
   rows are appended to --csv as they finish, and a cell already there is not run again (so an
   interrupted sweep resumes). Simulated time is the platform's, immune to the host's load.
2. --report: from the CSV, bus bandwidth against size per scale (docs/scale-<ranks>.png), the
   best algorithm per cell beside auto's choice (zcoll.choose_algorithm: the C++ rule table),
   the cost formulas' error (the algorithm table's cost functions, alpha/beta/gamma of the
   platform), hierarchical against ring, and the compressed kinds by their bytes.
3. --diagnose: 16 ranks, one per node, on the star, star_slow_node and star_slow_link platforms:
   the telemetry zcoll's own messages gathered in the simulation (comm.link_stats's rows, written
   by zcoll_allreduce_perf --link-stats) judged by zcoll.core.diagnose.classify.
4. --quick: one 64-rank cell on the star platform (the CI smoke test, tests/bench/test_smpi_scale.py).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import matplotlib
import numpy as np
import zcoll

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from zcoll.core import diagnose
from zcoll.tools import perf_table
from zcoll.tools.proc import run_tree

ROOT = Path(__file__).resolve().parent.parent
PLATFORM_DIR = Path(__file__).resolve().parent / "smpi_platforms"
ALGORITHMS = ["ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical", "ordered_ring"]
QUICK = ALGORITHMS[:5]  # the CI smoke test: no probe file
# Run with ZCOLL_TOPOLOGY (a probe.json of the platform's nominal rates), each in its own smpirun:
# ordered_ring needs it; "auto" is algorithm="auto" resolved inside the simulation, from the
# capabilities the communicator found there (its nodes, the probe's ring gain and node/link ratio)
PROBED = ("ordered_ring", "auto")
AUTO_MPI = "mpich"  # MPI_Allreduce in auto's runs: the selector auto_time counts as "mpi"
SELECTORS = ["mpich", "ompi", "default"]
CLUSTERS = ["fattree", "fattree_2to1", "dragonfly"]
STARS = ["star_slow_node", "star_slow_link"]
FIELDS = ["platform", "ranks", "nodes", "size", "algorithm", "time_us", "busbw_gbs"]

# The platforms' parameters (bench/smpi_platforms/*.xml and star_xml below): a link 12.5 GB/s and
# 0.5 us, a node reducing 10 GB/s, shared memory within a node 20 GB/s and 0.3 us.
LINK_BPS, LINK_LAT, REDUCE_BPS, LOOP_BPS, LOOP_LAT = 12.5e9, 0.5e-6, 10e9, 20e9, 0.3e-6
HOPS = {"fattree": 4, "fattree_2to1": 4, "dragonfly": 5, "star": 2, "star_slow_node": 2, "star_slow_link": 2}
NODES = 128
SLOW = 4.0  # the slow node's links and speed, and the slow link, are this many times slower

SMPI_CFG = [
    "--cfg=smpi/simulate-computation:no",  # only the modelled reduction costs time (reduce.cc)
    "--cfg=network/model:CM02",  # plain max-min sharing: no TCP factors, so the formulas compare
    "--cfg=network/TCP-gamma:0",
    "--cfg=network/crosstraffic:0",
    "--cfg=smpi/test:1e-7",
    # the collectives zcoll's set-up calls (MPI_Allgather, MPI_Comm_dup, ...) as Open MPI runs
    # them, but with a plain binomial bcast and Bruck's allgather: SMPI's default allgather posts
    # p^2 requests and waits on them one by one, O(p^3) host time, and its SMP-aware bcasts
    # (MPICH's, MVAPICH's) first map the nodes of every new communicator with a p-step ring
    # allgather (hours at 1,024 ranks). Timing is unaffected: the benchmark synchronises
    # with zcoll's own barrier, and every run names its MPI_Allreduce explicitly (smpi/allreduce)
    "--cfg=smpi/coll-selector:ompi",
    "--cfg=smpi/bcast:binomial_tree",  # not SMP-aware: no p-step node map per new communicator
    "--cfg=smpi/allgather:bruck",
    "--log=root.thresh:critical",
]
SIM_ENV = {"ZCOLL_SHM": "0", "ZCOLL_FLIGHT_RECORDER": "0", "ZCOLL_TELEMETRY": "0", "ZCOLL_TIMEOUT": "0"}


def star_xml(kind: str, nodes: int) -> str:
    """A non-blocking switch, one node per port (full routing), optionally with node 1 slow (its
    links and its speed SLOW x slower) or the directed path node 1 -> node 2 SLOW x slower (a
    degraded route between two nodes; every other pair is healthy)."""
    bw, slow_bw = f"{LINK_BPS:.6g}Bps", f"{LINK_BPS / SLOW:.6g}Bps"
    out = [
        '<?xml version="1.0"?>',
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
        '<platform version="4.1">',
        f'<zone id="{kind}" routing="Full">',
    ]
    for n in range(nodes):
        slow = kind == "star_slow_node" and n == 1
        out.append(f'<host id="node-{n}" speed="{REDUCE_BPS / (SLOW if slow else 1):.6g}f" core="8"/>')
        for d in ("up", "down"):
            out.append(
                f'<link id="{d}-{n}" bandwidth="{slow_bw if slow else bw}" latency="{LINK_LAT * 1e6:g}us"/>'
            )
        out.append(
            f'<link id="loop-{n}" bandwidth="{LOOP_BPS:.6g}Bps" latency="{LOOP_LAT * 1e6:g}us" '
            'sharing_policy="FATPIPE"/>'
        )
    if kind == "star_slow_link":
        out.append(f'<link id="slow-1-2" bandwidth="{slow_bw}" latency="0us"/>')
    for i in range(nodes):
        for j in range(nodes):
            links = (
                [f"loop-{i}"]
                if i == j
                else [f"up-{i}"]
                + (["slow-1-2"] if (kind, i, j) == ("star_slow_link", 1, 2) else [])
                + [f"down-{j}"]
            )
            ctn = "".join(f'<link_ctn id="{name}"/>' for name in links)
            out.append(f'<route src="node-{i}" dst="node-{j}" symmetrical="NO">{ctn}</route>')
    out += ["</zone>", "</platform>", ""]
    return "\n".join(out)


def platform_file(name: str, work: Path, nodes: int) -> Path:
    if name in CLUSTERS:
        return PLATFORM_DIR / f"{name}.xml"
    path = work / f"{name}-{nodes}.xml"
    if not path.exists():
        path.write_text(star_xml(name, nodes))
    return path


def hostfile_lines(nodes: int, per_node: int) -> str:
    return "".join(f"node-{n}:{per_node}\n" for n in range(nodes))


def probe_matrix(platform: str, ranks: int, per_node: int):
    """(node_of, bandwidth rows) with the platform's nominal link rates: 20 GB/s within a node,
    12.5 GB/s across, the slow link's route SLOW x slower. What a probe would measure on an idle
    platform."""
    node_of = [r // per_node for r in range(ranks)]
    bw = []
    for i in range(ranks):
        row = []
        for j in range(ranks):
            a, b = node_of[i], node_of[j]
            rate = None if i == j else LOOP_BPS if a == b else LINK_BPS
            if platform == "star_slow_link" and (a, b) == (1, 2):
                rate = LINK_BPS / SLOW
            if platform == "star_slow_node" and a != b and 1 in (a, b):
                rate = LINK_BPS / SLOW
            row.append(rate)
        bw.append(row)
    return node_of, bw


def topology_file(work: Path, platform: str, ranks: int, per_node: int) -> Path:
    """A probe.json (zcoll-probe/1, what `zcoll probe` writes) of probe_matrix, for ZCOLL_TOPOLOGY
    (ordered_ring, and auto resolved in the simulation)."""
    node_of, bw = probe_matrix(platform, ranks, per_node)
    path = work / f"probe-{platform}-{ranks}x{per_node}.json"
    path.write_text(
        json.dumps(
            {"format": "zcoll-probe/1", "size": ranks, "node_of": node_of, "bandwidth_bytes_per_s": bw}
        )
    )
    return path


def simulate(
    args, platform: str, ranks: int, per_node: int, bench_args: list, cfg: list, env: dict, sizes=None
):
    """One smpirun; returns (the perf_table rows of its CSV, wall seconds), or raises
    RuntimeError with the output's tail (TimeoutError past args.timeout). sizes: (min, max)."""
    nodes = ranks // per_node
    work = Path(args.work)
    hostfile = work / f"hosts-{nodes}x{per_node}"
    hostfile.write_text(hostfile_lines(nodes, per_node))
    out_csv = work / f"{platform}-{ranks}-{time.time_ns()}.csv"
    lo, hi = sizes or (args.min_size, args.max_size)
    cmd = ["nice", "-n", str(args.nice), "smpirun", "-no-privatize", "-np", str(ranks)]
    cmd += ["-platform", str(platform_file(platform, work, max(nodes, 2))), "-hostfile", str(hostfile)]
    cmd += [*SMPI_CFG, *cfg, str(Path(args.binary).resolve()), "-c", "0", "-n", "1", "-w", str(args.warmup)]
    cmd += ["-b", str(lo), "-e", str(hi), "-f", str(args.factor), "--csv", str(out_csv), *bench_args]
    start = time.time()
    # smpirun writes temporary files into its working directory
    done, timed_out = run_tree(cmd, {**os.environ, **SIM_ENV, **env}, args.timeout, cwd=work)
    wall = time.time() - start
    if timed_out or done.returncode != 0 or not out_csv.exists():
        tail = "\n".join(done.output.splitlines()[-15:])
        why = f"over {args.timeout:.0f} s of wall time" if timed_out else f"exit {done.returncode}"
        error = TimeoutError if timed_out else RuntimeError
        raise error(f"{platform} x {ranks} ranks: {why}\n{' '.join(cmd)}\n{tail}")
    rows = perf_table.read_csv(out_csv)
    out_csv.unlink()
    return rows, wall


def size_list(args) -> list:
    """The sizes zcoll_allreduce_perf runs for -b/-e/-f (float32 elements, as bench/harness.cc)."""
    out, b = [], float(parse_size(args.min_size))
    while b <= parse_size(args.max_size) * 1.0000001:
        out.append(max(int(b) // 4, 1) * 4)
        b *= args.factor
    return out


def parse_size(text: str) -> int:
    text = str(text).strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def done_cells(path: Path) -> set:
    if not path.exists():
        return set()
    with path.open() as f:
        return {(r["platform"], int(r["ranks"]), r["algorithm"], int(r["size"])) for r in csv.DictReader(f)}


def append(path: Path, platform: str, ranks: int, per_node: int, rows, rename=None) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(FIELDS)
        for r in rows:
            name = rename.get(r.algorithm, r.algorithm) if rename else r.algorithm
            w.writerow(
                [platform, ranks, ranks // per_node, r.size, name, f"{r.time_us:.3f}", f"{r.busbw_gbs:.4f}"]
            )


WALL_FIELDS = ["platform", "ranks", "job", "sizes", "wall_s", "status", "when"]


def log_wall(args, platform: str, ranks: int, job: str, sizes: tuple, wall: float, status: str) -> None:
    """One line per smpirun in --wall-csv: what the host spent simulating it (status ok, timeout
    or failed), so the cost of each scale can be stated and a cell too slow to run named."""
    path = Path(args.wall_csv)
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(WALL_FIELDS)
        span = fmt_size(sizes[0]) + ("" if sizes[0] == sizes[1] else f"-{fmt_size(sizes[1])}")
        w.writerow([platform, ranks, job, span, f"{wall:.1f}", status, time.strftime("%Y-%m-%d %H:%M")])


def plan(args, platform: str, ranks: int) -> list:
    """The smpiruns a cell still needs: (label, algorithms, selector, sizes, env). Below
    --split-from ranks one run per kind over every size; from it, one per algorithm and size
    (every kind's smallest size first), so each costs its own wall time and an interrupted sweep
    loses little."""
    have = done_cells(Path(args.csv))
    sizes = size_list(args)
    kinds = [(a, None) for a in args.algorithms if a not in PROBED]
    kinds += [(a, None) for a in PROBED if a in args.algorithms and ranks <= args.ordered_max_ranks]
    kinds += [("mpi", s) for s in args.selectors]
    jobs = []
    for algo, selector in kinds:
        name = f"mpi:{selector}" if selector else algo
        missing = [s for s in sizes if (platform, ranks, name, s) not in have]
        if not missing:
            continue
        if ranks >= args.split_from:
            spans = [(s, s) for s in missing]
        elif algo == "auto":  # one run per stretch of sizes with the same companion selector
            spans = companion_spans(args, platform, ranks, missing)
        else:
            spans = [(min(missing), max(missing))]
        jobs += [(name, algo, selector, span) for span in spans]
    if ranks >= args.split_from:  # every kind's small sizes before any kind's large ones
        return sorted(jobs, key=lambda j: j[3][0])
    if ranks < args.split_from:  # the plain zcoll algorithms of one scale share one run
        plain = [j for j in jobs if j[2] is None and j[1] not in PROBED]
        if plain:
            span = (min(j[3][0] for j in plain), max(j[3][1] for j in plain))
            joined = ",".join(j[1] for j in plain)
            jobs = [(joined, joined, None, span)] + [j for j in jobs if j not in plain]
    return jobs


def auto_companion(args, platform: str, ranks: int, size: int) -> str:
    """The SMPI selector of the "mpi" row in auto's run at this size. The run's MPI_Allreduce
    selector moves the other rows' simulated times too (its set-up allreduces and its row run
    in the same simulation: halving-doubling at 64 ranks x 4 KiB on `dragonfly` takes 16.77 us
    beside `rdb` and 19.02 us beside `mpich`), so auto runs beside the selector the algorithms'
    own runs had (--reference), and beside MPICH's only where it picks MPI's allreduce (rule 4),
    which the table times as `mpi:mpich`."""
    choice = auto_choice(size, ranks, args.per_node, platform, probe=True)
    return AUTO_MPI if choice == "mpi" else args.reference


def companion_spans(args, platform: str, ranks: int, sizes: list) -> list:
    """(min, max) runs of consecutive sizes that share auto_companion."""
    spans: list = []
    for size in sorted(sizes):
        companion = auto_companion(args, platform, ranks, size)
        if spans and spans[-1][2] == companion:
            spans[-1][1] = size
        else:
            spans.append([size, size, companion])
    return [(lo, hi) for lo, hi, _ in spans]


def run_job(args, platform: str, ranks: int, job: tuple) -> str:
    name, algos, selector, span = job
    env = {}
    if algos in PROBED:
        env["ZCOLL_TOPOLOGY"] = str(topology_file(Path(args.work), platform, ranks, args.per_node))
    # zcoll_allreduce_perf always adds an "mpi" row: in zcoll's runs it is the cheapest selector
    # to simulate (--reference), and dropped
    # except in auto's runs where auto picks it (rule 4), timed as the table times "mpi" (MPICH's)
    companion = auto_companion(args, platform, ranks, span[0]) if algos == "auto" else args.reference
    cfg = [f"--cfg=smpi/allreduce:{selector or companion}"]
    print(
        f"[{time.strftime('%H:%M:%S')}] {platform} {ranks} ranks: {name} "
        f"{fmt_size(span[0])}-{fmt_size(span[1])} ...",
        flush=True,
    )
    try:
        rows, wall = simulate(args, platform, ranks, args.per_node, ["-a", algos], cfg, env, span)
    except TimeoutError as e:
        log_wall(args, platform, ranks, name, span, args.timeout, "timeout")
        print(f"  TIMEOUT: {str(e).splitlines()[0]}", flush=True)
        return "timeout"
    except RuntimeError as e:
        log_wall(args, platform, ranks, name, span, 0.0, "failed")
        print(f"  FAILED: {e}", flush=True)
        return "failed"
    keep = [r for r in rows if (r.algorithm != "mpi") == (selector is None)]
    append(Path(args.csv), platform, ranks, args.per_node, keep, {"mpi": f"mpi:{selector}"})
    log_wall(args, platform, ranks, name, span, wall, "ok")
    print(f"  {len(keep)} rows in {wall:.0f} s of wall time", flush=True)
    return "ok"


def sweep(args) -> None:
    """Every platform x scale; past a timeout, the larger sizes of that kind are not tried (each
    costs more wall time than the one before)."""
    for platform in args.platforms:
        for ranks in args.scales:
            given_up = set()
            for job in plan(args, platform, ranks):
                if job[0] in given_up:
                    log_wall(args, platform, ranks, job[0], job[3], 0.0, "skipped")
                    continue
                if run_job(args, platform, ranks, job) != "ok":
                    given_up.add(job[0])


# ---- report -------------------------------------------------------------------------------------


def load(path: Path) -> dict:
    """{(platform, ranks): {algorithm: {size: time_us}}}"""
    table: dict = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            cell = table.setdefault((r["platform"], int(r["ranks"])), {})
            cell.setdefault(r["algorithm"], {})[int(r["size"])] = float(r["time_us"])
    return table


def extrapolate_rings(table: dict) -> list:
    """Adds "ring*" where p ranks have no simulated ring but p/4 ranks have one at S/4: the same
    chunk (S/p) per step, so the time scales by the step count, 2(p-1) / 2(p/4-1). A p-rank ring
    costs p 2(p-1) messages of host time (about 40 minutes at 1,024 ranks here). Returns, for
    every cell where both exist, (platform, ranks, size, extrapolated / simulated)."""
    checks = []
    for (platform, ranks), cell in sorted(table.items()):
        small = table.get((platform, ranks // 4), {}).get("ring", {})
        guess = {
            size: small[size // 4] * (ranks - 1) / (ranks // 4 - 1)
            for size in {s for series in cell.values() for s in series}
            if size // 4 in small and ranks >= 64
        }
        have = cell.get("ring", {})
        checks += [
            (platform, ranks, size, t / have[size]) for size, t in sorted(guess.items()) if size in have
        ]
        missing = {size: t for size, t in guess.items() if size not in have}
        if missing:
            cell["ring*"] = missing
    return checks


def busbw(size: int, ranks: int, time_us: float) -> float:
    return size / (time_us * 1e-6) / 1e9 * 2 * (ranks - 1) / ranks


@functools.lru_cache(maxsize=None)
def probe_caps(platform: str, ranks: int, per_node: int) -> tuple:
    """(ordered_ring_gain, node_link_ratio, slow_node_factor) a communicator derives from
    probe_matrix (what ZCOLL_TOPOLOGY gives it, csrc/comm/topology.cc): the rank-order ring's
    slowest hop over the best order's, the median bandwidth within a node over the median across
    nodes, and (from 3 nodes) the median across nodes over the slowest node's median."""
    node_of, bw = probe_matrix(platform, ranks, per_node)
    order = zcoll._C.best_ring_order([[b or 0.0 for b in row] for row in bw])

    def slowest(o):
        return max(1 / bw[o[k]][o[(k + 1) % ranks]] for k in range(ranks))

    gain = slowest(range(ranks)) / slowest(order) if ranks > 1 else 1.0
    same = [bw[i][j] for i in range(ranks) for j in range(ranks) if i != j and node_of[i] == node_of[j]]
    cross = [bw[i][j] for i in range(ranks) for j in range(ranks) if node_of[i] != node_of[j]]
    ratio = float(np.median(same) / np.median(cross)) if same and cross else 0.0
    nodes = max(node_of) + 1
    touching = [
        [
            bw[i][j]
            for i in range(ranks)
            for j in range(ranks)
            if node_of[i] != node_of[j] and n in (node_of[i], node_of[j])
        ]
        for n in range(nodes)
    ]
    slow = (
        max(1.0, float(np.median(cross) / min(np.median(t) for t in touching)))
        if nodes >= 3 and cross
        else 0.0
    )
    return gain, ratio, slow


def auto_choice(size: int, ranks: int, per_node: int, platform: str = "", probe: bool = False) -> str:
    """What algorithm="auto" picks on a real cluster of this shape (not oversubscribed, MPI's own
    allreduce available, equal nodes of per_node ranks): the C++ rule table; with probe, also
    what ZCOLL_TOPOLOGY's probe of the platform tells it (probe_caps)."""
    gain, ratio, slow = probe_caps(platform, ranks, per_node) if probe else (1.0, 0.0, 0.0)
    return zcoll.choose_algorithm(
        size,
        ranks,
        shared_memory=False,
        oversubscribed=False,
        node_hierarchy=per_node > 1 and ranks > per_node,
        nodes=max(ranks // per_node, 1),
        ordered_ring_gain=gain,
        node_link_ratio=ratio,
        slow_node_factor=slow,
    )


def auto_time(cell: dict, choice: str, size: int):
    """The simulated time of auto's choice: 'mpi' is MPI_Allreduce, run as MPICH's selector."""
    name = "mpi:mpich" if choice == "mpi" else choice
    return cell.get(name, {}).get(size) or (cell.get("ring*", {}).get(size) if name == "ring" else None)


def model_us(algorithm: str, size: int, ranks: int, platform: str, per_node: int) -> float:
    """The algorithm table's cost function with the platform's inter-node alpha, beta, gamma."""
    fn = {d["name"]: d["cost"] for d in zcoll._C.allreduce_algorithms()}[algorithm]
    alpha = HOPS[platform] * LINK_LAT
    return 1e6 * fn(size, ranks, alpha, 1 / LINK_BPS, 1 / REDUCE_BPS, nodes=max(ranks // per_node, 1))


# The two-tier cost model (docs/algorithms.md, "Across nodes"): the table's formulas with each
# step's alpha and beta taken from the tier its messages cross, and beta multiplied by the step's
# contention: how many of the step's concurrent flows share the busiest link of a flow's route
# (8 ranks of a node share its link; a 2:1 leaf's nodes share its 2 uplinks). Everything comes
# from the platform's description (PLATFORM below); nothing is fitted to the simulated times.
# Per platform: nodes per leaf or router, per chassis, per group, and the links out of each
# (fat tree: a leaf's uplinks, shared by all its nodes; dragonfly: links between two routers,
# chassis, groups), and the slow node or link of the star platforms.
PLATFORM = {
    "fattree": {"levels": [(4, 4, "up")]},
    "fattree_2to1": {"levels": [(4, 2, "up")]},
    # dragonfly: 1 link between two routers of a chassis; between two chassis of a group 2 links
    # from each of their 4 routers (to the router of the same index), so 8; between groups 2
    "dragonfly": {"levels": [(2, 1, "pair"), (8, 8, "pair"), (32, 2, "pair")]},
    "star": {"levels": []},
    "star_slow_node": {"levels": [], "slow_node": 1},
    "star_slow_link": {"levels": [], "slow_link": (1, 2)},
}


def route(platform: str, a: int, b: int):
    """Node a -> node b: (latency in seconds, [(link, share of one flow, slowness)])."""
    desc = PLATFORM[platform]
    slow = SLOW if desc.get("slow_node") in (a, b) else 1.0
    links = [(("up", a), 1.0, slow), (("down", b), 1.0, slow)]
    hops = 2
    for size, count, kind in desc["levels"]:
        if a // size == b // size:
            break
        hops += 1 if kind == "pair" else 2
        if kind == "up":
            links += [(("leaf-up", a // size), 1 / count, 1.0), (("leaf-down", b // size), 1 / count, 1.0)]
        else:
            links = [l for l in links if l[0][0] in ("up", "down")]
            links.append((("pair", size, a // size, b // size), 1 / count, 1.0))
    if desc.get("slow_link") == (a, b):
        links.append((("slow", a, b), 1.0, SLOW))
    return hops * LINK_LAT, links


def flow_times(platform: str, pairs, per_node: int, msg: float) -> list:
    """Every (src, dst) rank pair sends msg bytes at once: per flow, (latency, msg x beta x the
    load of the busiest link on its route); pairs on one node go through its loopback."""
    load, flows, out = {}, [], []
    for s, d in pairs:
        a, b = s // per_node, d // per_node
        if a == b:
            out.append((LOOP_LAT, msg / LOOP_BPS))
            continue
        lat, links = route(platform, a, b)
        flows.append((lat, links))
        for link, share, _ in links:
            load[link] = load.get(link, 0.0) + share
    for lat, links in flows:
        out.append((lat, msg / LINK_BPS * max(load[l] * slow for l, _, slow in links)))
    return out


def step_time(platform: str, pairs, per_node: int, msg: float) -> float:
    """A step ends with its slowest flow."""
    return max((lat + bw for lat, bw in flow_times(platform, pairs, per_node, msg)), default=0.0)


def reduce_time(platform: str, nodes: int, nbytes: float) -> float:
    """nbytes reduced on every rank at once: the slowest node's time."""
    slow = SLOW if PLATFORM[platform].get("slow_node", nodes) < nodes else 1.0
    return nbytes * slow / REDUCE_BPS


def ring_time(platform: str, lanes: list, per_node: int, size: float) -> float:
    """One ring per lane (list of ranks), all at once, 2(p-1) steps of S/p: the latency of the
    mean hop (a step waits only for its predecessor on the chain, and most hops stay on a node),
    the bandwidth of the slowest hop under the load of every lane, the reductions added."""
    p = len(lanes[0])
    flows = flow_times(
        platform, [(lane[i], lane[(i + 1) % p]) for lane in lanes for i in range(p)], per_node, size / p
    )
    mean_lat = sum(lat for lat, _ in flows) / len(flows)
    return 2 * (p - 1) * (mean_lat + max(bw for _, bw in flows)) + reduce_time(
        platform, NODES, (p - 1) / p * size
    )


def tree_time(platform: str, ranks: int, per_node: int, size: float) -> float:
    """Reduce up the binary tree, then broadcast down, each pipelined in segments: the first
    segment crosses the levels one at a time (only that level's edges load the links), the
    other nseg - 1 follow at the rate of a step with every edge busy."""
    seg = 128 * 1024
    m, nseg = min(size, seg), max(1, math.ceil(size / seg))
    up = [(c, (c - 1) // 2) for c in range(1, ranks)]
    levels = {}
    for c, parent in up:
        levels.setdefault(int(math.log2(c + 1)), []).append((c, parent))
    total = 0.0
    for edges, reduce in ((up, True), ([(b, a) for a, b in up], False)):
        red = reduce_time(platform, NODES, 2 * m) if reduce else 0.0
        fill = sum(
            step_time(platform, [e if reduce else e[::-1] for e in lv], per_node, m) + red
            for lv in levels.values()
        )
        total += fill + (nseg - 1) * (step_time(platform, edges, per_node, m) + red)
    return total


def model2_us(algorithm: str, size: int, ranks: int, platform: str, per_node: int) -> float:
    """The two-tier model's time of one allreduce (powers of two: the simulated cells)."""
    nodes = max(ranks // per_node, 1)
    steps = int(math.log2(ranks))
    xor = lambda k: [(r, r ^ (1 << k)) for r in range(ranks)]  # noqa: E731
    if algorithm in ("ring", "ordered_ring"):
        t = ring_time(platform, [list(range(ranks))], per_node, size)
    elif algorithm == "recursive_doubling":
        t = sum(step_time(platform, xor(k), per_node, size) for k in range(steps))
        t += steps * reduce_time(platform, nodes, size)
    elif algorithm == "halving_doubling":
        halves = [(xor(steps - 1 - k), size / 2 ** (k + 1)) for k in range(steps)]
        t = 2 * sum(step_time(platform, pairs, per_node, m) for pairs, m in halves)
        t += reduce_time(platform, nodes, (ranks - 1) / ranks * size)
    elif algorithm == "tree":
        t = tree_time(platform, ranks, per_node, size)
    elif algorithm == "hierarchical":
        L = ranks // nodes
        t = ring_time(platform, [list(range(L))], per_node, size) if L > 1 else 0.0
        lanes = [[n * L + i for n in range(nodes)] for i in range(L)]
        if nodes > 1:
            t += ring_time(platform, lanes, per_node, size / L)
    else:
        raise ValueError(algorithm)
    return 1e6 * t


def auto_rows(table: dict, per_node: int) -> list:
    """One row per cell: best algorithm; auto's choice without a probe and its time over the
    best; auto's choice with the platform's probe (ZCOLL_TOPOLOGY) and its time over the best,
    that time the simulated `auto` row's where one ran (auto resolved inside the simulation,
    flagged "sim"), else its choice's; the best MPI selector over the best."""
    out = []
    for (platform, ranks), cell in sorted(table.items()):
        zc = {a: t for a, t in cell.items() if not a.startswith("mpi:") and a != "auto"}
        for size in sorted({s for series in cell.values() for s in series}):
            times = {a: t[size] for a, t in zc.items() if size in t}
            if len(times) < 3:  # a ring run only to extrapolate from, not a cell
                continue
            best = min(times, key=times.get)
            choice = auto_choice(size, ranks, per_node)
            t = auto_time(cell, choice, size)
            probed = auto_choice(size, ranks, per_node, platform, probe=True)
            simulated = cell.get("auto", {}).get(size)
            tp = simulated or auto_time(cell, probed, size)
            mpis = {a: cell[a][size] for a in cell if a.startswith("mpi:") and size in cell[a]}
            best_mpi = min(mpis.values()) if mpis else float("nan")
            out.append(
                (
                    platform,
                    ranks,
                    size,
                    best,
                    times[best],
                    choice,
                    (t or math.nan) / times[best],
                    probed,
                    (tp or math.nan) / times[best],
                    simulated is not None,
                    best_mpi / times[best],
                )
            )
    return out


def model_rows(table: dict, per_node: int) -> list:
    """Per platform, scale and algorithm: the median |model - simulated| / simulated over the
    sizes, the worst, and the error at the largest size, for the table's one-tier formulas
    (model_us) and the two-tier model (model2_us)."""
    out = []
    for (platform, ranks), cell in sorted(table.items()):
        for algo in ALGORITHMS:
            if algo not in cell or algo == "ordered_ring":
                continue
            row = [platform, ranks, algo]
            for model in (model_us, model2_us):
                errs = [
                    (model(algo, s, ranks, platform, per_node) - t) / t for s, t in sorted(cell[algo].items())
                ]
                row += [float(np.median(np.abs(errs))), max(errs, key=abs), errs[-1]]
            out.append(tuple(row))
    return out


def compressed_us(cell: dict, size: int, wire_ratio: float):
    """A compressed ring by its bytes: the uncompressed ring's simulated time at size / ratio,
    interpolated log-log between the simulated sizes (encode and decode not counted)."""
    ring = sorted(cell.get("ring", {}).items())
    target = size / wire_ratio
    for (s0, t0), (s1, t1) in zip(ring, ring[1:]):
        if s0 <= target <= s1:
            w = math.log(target / s0) / math.log(s1 / s0)
            return math.exp((1 - w) * math.log(t0) + w * math.log(t1))
    return None


COMPRESSED = {"fp16": 2.0, "int8": 4 / (1 + 4 / 256), "int4": 8 / (1 + 8 / 256)}


def plot(table: dict, out_dir: Path) -> list:
    written = []
    for ranks in sorted({r for _, r in table}):
        platforms = [p for p in [*CLUSTERS, *STARS] if (p, ranks) in table]
        fig, axes = plt.subplots(1, len(platforms), figsize=(4.2 * len(platforms), 3.8), squeeze=False)
        for ax, platform in zip(axes[0], platforms):
            cell = table[(platform, ranks)]
            for algo, series in sorted(cell.items()):
                sizes = sorted(series)
                style = "--" if algo.startswith("mpi:") else "-"
                ax.plot(sizes, [busbw(s, ranks, series[s]) for s in sizes], style, marker=".", label=algo)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{platform}, {ranks} ranks", fontsize=9)
            ax.set_xlabel("bytes per rank")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("bus bandwidth (GB/s)")
        axes[0][-1].legend(fontsize=6)
        fig.tight_layout()
        path = out_dir / f"scale-{ranks}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def report(args) -> None:
    table = load(Path(args.csv))
    checks = extrapolate_rings(table)
    for path in plot(table, Path(args.plots)):
        print(f"wrote {path}")
    print("\n### auto against the best simulated algorithm\n")
    print(
        "| platform | ranks | size | best | best us | auto, no probe | / best | auto, probe | / best "
        "| best MPI / best zcoll |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = auto_rows(table, args.per_node)
    for platform, ranks, size, best, t, choice, ratio, probed, ratio_p, sim, mpi in rows:
        flag = " **" if ratio > 1.1 else ""
        flag_p = (" sim" if sim else "") + (" **" if ratio_p > 1.1 else "")
        print(
            f"| {platform} | {ranks} | {fmt_size(size)} | {best} | {t:.1f} | {choice} | {ratio:.2f}{flag} "
            f"| {probed} | {ratio_p:.2f}{flag_p} | {mpi:.2f} |"
        )
    for label, k in (("without a probe", 6), ("with the platform's probe (ZCOLL_TOPOLOGY)", 8)):
        ok = [r for r in rows if r[k] <= 1.1]
        print(f"\nauto {label} within 10% of the best in {len(ok)} of {len(rows)} cells")
    print("\n### cost formulas against simulated time: (model - simulated) / simulated\n")
    print(
        "| platform | ranks | algorithm | one-tier median abs | worst | at largest | two-tier median abs | worst | at largest |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = model_rows(table, args.per_node)
    for platform, ranks, algo, *e in rows:
        print(
            f"| {platform} | {ranks} | {algo} | {e[0]:.0%} | {e[1]:+.0%} | {e[2]:+.0%} | {e[3]:.0%} | {e[4]:+.0%} | {e[5]:+.0%} |"
        )
    for name, k in (("one-tier", 0), ("two-tier", 3)):
        print(
            f"\n{name}: median over the rows of the median abs error {np.median([r[3 + k] for r in rows]):.0%}"
        )
    print("\n### hierarchical / ring time, and compressed rings by their bytes (speed-up over ring)\n")
    print("| platform | ranks | size | hierarchical / ring | fp16 | int8 | int4 |")
    print("|---|---|---|---|---|---|---|")
    for (platform, ranks), cell in sorted(table.items()):
        rings = {**cell.get("ring*", {}), **cell.get("ring", {})}
        for size in sorted(rings):
            if "hierarchical" not in cell or size not in cell["hierarchical"]:
                continue
            ring = rings[size]
            mark = "" if size in cell.get("ring", {}) else " (ring*)"
            comp = [compressed_us(cell, size, r) if size >= 1 << 20 else None for r in COMPRESSED.values()]
            cols = " | ".join(f"{ring / c:.2f}x" if c else "-" for c in comp)
            print(
                f"| {platform} | {ranks} | {fmt_size(size)} | {cell['hierarchical'][size] / ring:.2f}{mark} | {cols} |"
            )
    print("\n### ring* (p ranks from p/4 ranks at S/4) against the simulated ring\n")
    print("| platform | ranks | size | ring* / ring |")
    print("|---|---|---|---|")
    for platform, ranks, size, ratio in checks:
        print(f"| {platform} | {ranks} | {fmt_size(size)} | {ratio:.3f} |")
    wall_report(Path(args.wall_csv))


def wall_report(path: Path) -> None:
    """Wall time of the simulations per platform and scale (--wall-csv), and what did not finish."""
    if not path.exists():
        return
    with path.open() as f:
        rows = list(csv.DictReader(f))
    print("\n### wall time of the simulation on this host\n")
    print("| platform | ranks | smpiruns | wall s (ok) | slowest run | not finished |")
    print("|---|---|---|---|---|---|")
    for platform, ranks in sorted({(r["platform"], int(r["ranks"])) for r in rows}):
        mine = [r for r in rows if r["platform"] == platform and int(r["ranks"]) == ranks]
        ok = [r for r in mine if r["status"] == "ok"]
        slow = max(ok, key=lambda r: float(r["wall_s"]), default=None)
        slowest = f"{slow['job']} {slow['sizes']}: {float(slow['wall_s']):.0f} s" if slow else "-"
        bad = "; ".join(
            f"{r['job']} {r['sizes']} ({r['status']} {float(r['wall_s']):.0f} s)"
            for r in mine
            if r["status"] != "ok"
        )
        print(
            f"| {platform} | {ranks} | {len(ok)} | {sum(float(r['wall_s']) for r in ok):.0f} "
            f"| {slowest} | {bad or '-'} |"
        )


# ---- diagnose and quick -------------------------------------------------------------------------


def diagnose_one(args, platform: str, ranks: int) -> diagnose.Verdict:
    """zcoll's link telemetry gathered inside the simulation (--diagnose-per-node ranks per node;
    the traffic of --diagnose-algorithms at 1-16 MiB), judged by the classifier comm.diagnose()
    uses (one window, no hysteresis)."""
    path = Path(args.work) / f"linkstats-{platform}.json"
    saved = (args.min_size, args.max_size)
    args.min_size, args.max_size = "1M", "16M"
    try:
        simulate(
            args,
            platform,
            ranks,
            args.diagnose_per_node,
            ["-a", args.diagnose_algorithms, "--link-stats", str(path)],
            [f"--cfg=smpi/allreduce:{args.reference}"],
            {"ZCOLL_TELEMETRY": "1"},
        )
    finally:
        args.min_size, args.max_size = saved
    data = json.loads(path.read_text())
    return diagnose.classify(diagnose.from_rows(np.array(data["rows"])), data["nodes"])


def run_diagnose(args) -> int:
    expected = {"star": "healthy", "star_slow_node": "slow node 1", "star_slow_link": "slow link 1->2"}
    failures = 0
    for platform, want in expected.items():
        verdict = diagnose_one(args, platform, 16)
        got, k = verdict.label, args.diagnose_per_node  # in nodes: ranks are packed k per node
        if verdict.label == "slow node":
            got += f" {verdict.rank // k}"
        if verdict.label == "slow link":
            got += f" {verdict.link[0] // k}->{verdict.link[1] // k}"
        failures += got != want
        print(f"{platform}: {got} (expected {want}; nodes of {k} ranks): {verdict}", flush=True)
    return 1 if failures else 0


def run_quick(args) -> int:
    """One 64-rank cell (8 nodes x 8) on the healthy star: every algorithm runs in the simulation
    and the large sizes reach the link: ring's busbw within 60-100% of one link's bandwidth."""
    args.min_size, args.max_size = "64K", "4M"
    rows, wall = simulate(
        args, "star", 64, 8, ["-a", ",".join(QUICK)], [f"--cfg=smpi/allreduce:{args.reference}"], {}
    )
    for r in rows:
        print(f"{r.algorithm:>20} {r.size:>9} {r.time_us:12.1f} us {r.busbw_gbs:8.3f} GB/s", flush=True)
    ring = max((r for r in rows if r.algorithm == "ring"), key=lambda r: r.size)
    share = ring.busbw_gbs * 1e9 / LINK_BPS
    print(
        f"64 ranks simulated in {wall:.1f} s of wall time; ring at {ring.size} bytes: {share:.0%} of the link"
    )
    missing = set(QUICK) - {r.algorithm for r in rows}
    if missing or not 0.6 <= share <= 1.0:
        print(
            f"FAILED: missing {sorted(missing)}" if missing else "FAILED: ring's busbw is off the link rate"
        )
        return 1
    return 0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--binary",
        default=str(ROOT / "build/smpi/zcoll_allreduce_perf"),
        help="the SMPI build of zcoll_allreduce_perf (default build/smpi/)",
    )
    p.add_argument(
        "--platforms",
        default=",".join(CLUSTERS + STARS),
        help=f"comma-separated, of {', '.join(CLUSTERS + STARS)} (default all)",
    )
    p.add_argument("--scales", default="16,64,256,1024", help="rank counts (default 16,64,256,1024)")
    p.add_argument("--per-node", type=int, default=8, help="ranks per node (default 8)")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS), help="zcoll algorithms (default all)")
    p.add_argument("--selectors", default=",".join(SELECTORS), help="SMPI MPI_Allreduce selectors")
    p.add_argument("--min-size", default="4K", help="smallest size (default 4K)")
    p.add_argument("--max-size", default="256M", help="largest size (default 256M)")
    p.add_argument("--factor", type=float, default=4, help="size step (default 4: 4K, 16K, ...)")
    p.add_argument(
        "--split-from",
        type=int,
        default=256,
        help="from this many ranks, one smpirun per algorithm and size, smallest first; after a "
        "timeout the larger sizes of that algorithm are skipped (default 256)",
    )
    p.add_argument(
        "--reference",
        default="rdb",
        help="SMPI selector of the MPI row zcoll_allreduce_perf always adds, dropped from zcoll's runs "
        "(default rdb: the cheapest to simulate)",
    )
    p.add_argument(
        "--ordered-max-ranks",
        type=int,
        default=64,
        help="ordered_ring only up to this many ranks: every simulated rank parses the p x p probe "
        "and searches the ring order, O(p^3) in all (default 64)",
    )
    p.add_argument(
        "--diagnose-algorithms",
        default="ring,halving_doubling,recursive_doubling",
        help="the traffic --diagnose judges (default ring,halving_doubling,recursive_doubling)",
    )
    p.add_argument(
        "--diagnose-per-node", type=int, default=1, help="ranks per node in --diagnose's 16 (default 1)"
    )
    p.add_argument("--nice", type=int, default=19, help="niceness of the simulations (default 19)")
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed calls per row (default 0: a simulation has no caches to warm)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="wall seconds per smpirun (default 1800)")
    p.add_argument(
        "--csv", default=str(ROOT / "docs/scale.csv"), help="results (appended; default docs/scale.csv)"
    )
    p.add_argument(
        "--wall-csv",
        default=str(ROOT / "docs/scale-wall.csv"),
        help="wall time of every smpirun (appended; default docs/scale-wall.csv)",
    )
    p.add_argument("--plots", default=str(ROOT / "docs"), help="where --report writes scale-<ranks>.png")
    p.add_argument("--work", default=None, help="scratch directory (default a temporary one)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true", help="plots and tables from --csv (no simulation)")
    mode.add_argument("--diagnose", action="store_true", help="the slow node / slow link detection runs")
    mode.add_argument("--quick", action="store_true", help="one 64-rank cell: the CI smoke test")
    args = p.parse_args(argv)
    args.platforms = args.platforms.split(",")
    args.scales = [int(s) for s in args.scales.split(",")]
    args.algorithms = args.algorithms.split(",")
    args.selectors = [s for s in args.selectors.split(",") if s]
    unknown = set(args.platforms) - set(CLUSTERS + STARS + ["star"])
    if unknown:
        p.error(f"unknown platform(s) {sorted(unknown)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        report(args)
        return 0
    if not shutil.which("smpirun"):
        print("smpirun not found: apt-get install libsimgrid-dev (SimGrid's SMPI)", file=sys.stderr)
        return 2
    if not Path(args.binary).exists():
        print(
            f"{args.binary} not found: cmake -S . -B build/smpi -DZCOLL_SMPI=ON && "
            "cmake --build build/smpi -j 2 --target zcoll_allreduce_perf",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="zcoll-smpi-") as tmp:
        args.work = args.work or tmp
        Path(args.work).mkdir(parents=True, exist_ok=True)
        if args.quick:
            return run_quick(args)
        if args.diagnose:
            return run_diagnose(args)
        sweep(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
