"""`zcoll probe` without a network to shape: the schedule, the tiers / hotspots / slow nodes /
placement rules on synthetic matrices (zcoll/placement.py), the files and their loading, the
command line, and one real run on 3 ranks. The emulated two-node network: test_testbed.py."""

import itertools
import sys

import numpy as np
import pytest
import zcoll
from mpi_util import mpirun, run
from zcoll.observe import placement, probe, probe_report

MB = 1e6


def matrix(p, value, lat=20e-6):
    bw = np.full((p, p), float(value))
    np.fill_diagonal(bw, np.nan)
    lt = np.full((p, p), lat)
    np.fill_diagonal(lt, np.nan)
    return bw, lt


def cluster(ranks_per_node, intra=5000 * MB, inter=125 * MB):
    """A uniform cluster, node 0's ranks first: node_of, bw, lat (intra-node 1 us, inter 30 us)."""
    return uniform([k for k, n in enumerate(ranks_per_node) for _ in range(n)], intra, inter)


def uniform(node_of, intra=5000 * MB, inter=125 * MB):
    p = len(node_of)
    bw, lat = matrix(p, inter, 30e-6)
    for i, j in itertools.permutations(range(p), 2):
        if node_of[i] == node_of[j]:
            bw[i, j], lat[i, j] = intra, 1e-6
    return node_of, bw, lat


def analyse(node_of, bw, lat, **kw):
    return placement.analyse(bw, lat, node_of, [f"node{k}" for k in node_of], **kw)


# -- schedule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", range(1, 10))
def test_tournament_pairs_everyone_once(p):
    rounds = probe.tournament(p)
    pairs = [pair for r in rounds for pair in r]
    assert sorted(pairs) == list(itertools.combinations(range(p), 2))
    for r in rounds:
        ranks = [x for pair in r for x in pair]
        assert len(ranks) == len(set(ranks)), r
    assert len(rounds) == (p - 1 if p % 2 == 0 else p)


def test_schedule_runs_pairs_together_only_on_different_nodes():
    node_of = [0, 0, 1, 1, 2, 2, 3, 3]
    steps = probe.schedule(8, node_of)
    assert sorted(pair for s in steps for pair in s) == list(itertools.combinations(range(8), 2))
    for step in steps:
        nodes = [n for a, b in step for n in {node_of[a], node_of[b]}]
        assert len(nodes) == len(set(nodes)), step
    assert max(len(s) for s in steps) >= 2  # pairs on different nodes do run together
    assert all(len(s) == 1 for s in probe.schedule(8, node_of, serial=True))
    assert all(len(s) == 1 for s in probe.schedule(4, [0, 0, 0, 0]))  # one machine: one pair at a time


# -- tiers and hotspots -----------------------------------------------------------------------------
def test_two_nodes_one_slow_direction_is_the_hotspot():
    node_of, bw, lat = cluster([2, 2])
    for i in (2, 3):
        for j in (0, 1):
            bw[i, j] = 31 * MB
    a = analyse(node_of, bw, lat)
    assert [t.name for t in a.tiers] == ["intra-node", "inter-node"]
    assert a.tiers[1].bandwidth == pytest.approx(125 * MB) and a.tiers[1].links == 2
    assert [(h.what, h.link) for h in a.hotspots] == [("bandwidth", "node 1 -> node 0")]
    assert sorted(a.hotspots[0].pairs) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert a.slow_nodes == []


def test_one_slow_link_among_four_nodes():
    node_of, bw, lat = cluster([1, 1, 1, 1])
    bw[2, 3] = 30 * MB
    a = analyse(node_of, bw, lat)
    assert [t.name for t in a.tiers] == ["inter-node"] and a.tiers[0].links == 12
    assert [h.link for h in a.hotspots] == ["node 2 -> node 3"]
    assert a.slow_nodes == []


def test_slow_node_is_named():
    node_of, bw, lat = cluster([1, 1, 1, 1])
    for k in range(4):
        if k != 1:
            bw[1, k] = bw[k, 1] = 30 * MB
    a = analyse(node_of, bw, lat)
    assert a.slow_nodes == [1]
    assert len(a.tiers) == 2  # half the links are slow: a tier of their own, not hotspots
    assert a.hotspots == []


def test_two_racks_are_two_tiers_without_hotspots():
    node_of, bw, lat = cluster([1, 1, 1, 1])
    for i, j in itertools.permutations(range(4), 2):
        if (i < 2) != (j < 2):
            bw[i, j] = 40 * MB
    a = analyse(node_of, bw, lat)
    assert [t.name for t in a.tiers] == ["inter-node", "inter-node 2"]
    assert [t.links for t in a.tiers] == [4, 8]
    assert a.hotspots == [] and a.slow_nodes == []


def test_small_differences_are_neither_tiers_nor_hotspots():
    node_of, bw, lat = cluster([2, 2])
    rng = np.random.default_rng(0)
    bw *= rng.uniform(0.9, 1.1, bw.shape)  # +-10%: far from the 0.7 rule and the 2x gap
    a = analyse(node_of, bw, lat)
    assert len(a.tiers) == 2 and a.hotspots == []


def test_rank_pair_hotspot_inside_a_node_link():
    node_of, bw, lat = cluster([2, 2])
    bw[1, 3] = 40 * MB
    a = analyse(node_of, bw, lat)
    assert [h.link for h in a.hotspots] == ["rank 1 -> rank 3 (in node 0 -> node 1)"]


def test_latency_hotspot_rule():
    node_of, bw, lat = cluster([1, 1, 1, 1])
    lat[0, 1] = 100e-6  # > 2x 30 us and > 20 us above it
    lat[0, 2] = 55e-6  # under 2x: not a hotspot
    a = analyse(node_of, bw, lat)
    assert [(h.what, h.link) for h in a.hotspots] == [("latency", "node 0 -> node 1")]


def test_hotspot_ratio_is_a_rule_not_a_constant():
    node_of, bw, lat = cluster([1, 1, 1])
    bw[0, 1] = 100 * MB  # 0.8x its tier
    assert analyse(node_of, bw, lat).hotspots == []
    assert [h.link for h in analyse(node_of, bw, lat, ratio=0.9).hotspots] == ["node 0 -> node 1"]


# -- placement --------------------------------------------------------------------------------------
def test_interleaved_ranks_are_placed_in_blocks():
    # ranks alternate between two nodes: a ring in rank order crosses nodes at every hop
    node_of, bw, _ = uniform([0, 1, 0, 1])
    p = placement.suggest_placement(bw, node_of, ["a", "b", "a", "b"])
    assert p.improves
    assert p.suggested_slowest == pytest.approx(p.current_slowest)  # some hop still crosses
    assert p.current_total / p.suggested_total == pytest.approx((4 / 125) / (2 / 125 + 2 / 5000))
    assert sum(p.hosts[r] != p.hosts[(r + 1) % 4] for r in range(4)) == 2  # two node crossings


def test_ring_avoids_a_slow_link_between_three_nodes():
    node_of = [0, 0, 1, 1, 2, 2]
    _, bw, _ = cluster([2, 2, 2])
    for i in (0, 1):
        for j in (2, 3):
            bw[i, j] = 30 * MB  # node 0 -> node 1 slow: the rank-order ring uses it (1 -> 2)
    p = placement.suggest_placement(bw, node_of, [f"node{k}" for k in node_of])
    assert p.improves and p.speedup() == pytest.approx(125 / 30, rel=1e-6)
    order = [p.hosts[r] for r in range(6)]
    assert ("node0", "node1") not in {(order[r], order[(r + 1) % 6]) for r in range(6)}


def test_two_nodes_no_placement_helps():
    node_of, bw, _ = cluster([2, 2])
    bw[2, 0] = bw[2, 1] = bw[3, 0] = bw[3, 1] = 31 * MB
    p = placement.suggest_placement(bw, node_of, ["n0", "n0", "n1", "n1"])
    assert not p.improves  # any ring crosses both ways


def test_traffic_matrix_places_the_heavy_pair_together():
    node_of = [0, 0, 1, 1]
    _, bw, _ = cluster([2, 2])
    t = np.zeros((4, 4))
    t[1, 2] = t[2, 1] = 1e9  # ranks 1 and 2 exchange most: they belong on one node
    p = placement.suggest_placement(bw, node_of, ["n0", "n0", "n1", "n1"], traffic=t, traffic_name="t")
    assert p.improves and p.hosts[1] == p.hosts[2]


def test_best_cycle_avoids_the_slow_hop():
    bw, _ = matrix(5, 125 * MB)
    bw[1, 2] = 20 * MB
    order = zcoll._C.best_ring_order(np.nan_to_num(bw).tolist())
    assert order[0] == 0 and sorted(order) == list(range(5))
    assert (1, 2) not in {(order[k], order[(k + 1) % 5]) for k in range(5)}


def test_local_search_above_eight_ranks():
    node_of, bw, _ = uniform([r % 3 for r in range(9)])  # round-robin over 3 nodes
    p = placement.suggest_placement(bw, node_of, [f"n{k}" for k in node_of])
    assert p.improves
    assert sum(p.hosts[r] != p.hosts[(r + 1) % 9] for r in range(9)) == 3


# -- results, files, command line -------------------------------------------------------------------
def synthetic_result():
    node_of, bw, lat = cluster([2, 2])
    bw[2, 0] = bw[2, 1] = bw[3, 0] = bw[3, 1] = 31 * MB
    hosts = ["node0", "node0", "node1", "node1"]
    r = probe.ProbeResult(4, hosts, node_of, bw, lat, lat * 1.1, np.full(4, 10e9), {"window": 8}, {"mpi": "x"})
    return r.analyse()


def test_result_round_trips_through_json(tmp_path):
    r = synthetic_result()
    r.save(tmp_path / "p.json")
    back = probe.load(tmp_path / "p.json")
    assert np.array_equal(back.bandwidth, r.bandwidth, equal_nan=True)
    assert np.array_equal(back.latency, r.latency, equal_nan=True)
    assert back.nodes == [[0, 1], [2, 3]] and back.hosts == r.hosts
    assert back.analysis == r.analysis
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a zcoll probe result"):
        probe.load(tmp_path / "bad.json")


def test_files_and_report(tmp_path):
    r = synthetic_result()
    written = probe_report.write_outputs(r, tmp_path)
    names = {p.name for p in written}
    assert {"probe.json", "links.csv", "bandwidth.csv", "latency.csv", "heatmap.png", "report.html"} <= names
    assert "placement.hosts" not in names  # nothing to gain with two nodes
    assert (tmp_path / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (tmp_path / "links.csv").read_text().splitlines()
    assert len(rows) == 1 + 12
    assert sum("node 1 -> node 0" in row.split(",")[-1] for row in rows) == 4
    text = probe_report.format_report(r, written)
    assert "node 1 -> node 0: 31.0 MB/s, 0.25x the 125.0 MB/s of inter-node" in text
    assert "node 0 (node0): ranks 0 1" in text


def test_placement_files(tmp_path):
    p = placement.Placement([0, 2, 1, 3], ["a", "b", "a", "b"], "ring", 2.0, 1.0, 4.0, 3.0, (0, 1), (1, 2), True)
    probe_report._write_placement(p, tmp_path)
    assert (tmp_path / "placement.hosts").read_text() == "a\nb\na\nb\n"
    assert (tmp_path / "rankfile").read_text() == "rank 0=a slot=0\nrank 1=b slot=0\nrank 2=a slot=1\nrank 3=b slot=1\n"
    machinefile = (tmp_path / "machinefile").read_text()
    assert machinefile.splitlines()[-4:] == ["a:1", "b:1", "a:1", "b:1"] and "rankmap" in machinefile


def test_help():
    rc, out = run([sys.executable, "-m", "zcoll", "probe", "--help"], timeout=60)
    assert rc == 0 and "round-robin tournament" in out and "--hotspot-ratio" in out, out
    rc, out = run([sys.executable, "-m", "zcoll", "--help"], timeout=60)
    assert rc == 0 and "probe" in out, out


def test_reanalyse_a_saved_result(tmp_path):
    synthetic_result().save(tmp_path / "in.json")
    rc, out = run([sys.executable, "-m", "zcoll", "probe", "--from", tmp_path / "in.json", "--out", tmp_path / "o",
                   "--hotspot-ratio", "0.2", "--no-png"], timeout=60)
    assert rc == 0, out
    assert "hotspots (bandwidth below 0.2x" in out and "  none" in out, out
    assert probe.load(tmp_path / "o" / "probe.json").analysis.rules["hotspot_ratio"] == 0.2
    assert not (tmp_path / "o" / "heatmap.png").exists()


def test_probe_runs_on_three_ranks(tmp_path):
    """A real measurement on one machine (odd rank count: the tournament's bye)."""
    out = tmp_path / "probe"
    rc, text = mpirun(3, sys.executable, "-m", "zcoll", "probe", "--out", out, "--budget", "0.03",
                      "--message-bytes", "65536", "--latency-iters", "20", "--no-png", timeout=120)
    assert rc == 0, text
    assert "step 3/3" in text and "bandwidth, MB/s" in text, text
    r = probe.load(out / "probe.json")
    off = ~np.eye(3, dtype=bool)
    assert r.nodes == [[0, 1, 2]]
    assert np.all(r.bandwidth[off] > 1e6), r.bandwidth  # shared memory: far above 1 MB/s
    assert np.all((r.latency[off] > 0) & (r.latency[off] < 0.01)), r.latency
    assert np.all(r.latency_median[off] >= r.latency[off])
    assert np.all(r.memcpy > 1e8)
    assert [t.kind for t in r.tiers][0] == "intra"
