"""zcoll.observe.placement on synthetic matrices (tests/link_matrices.py): tiers, hotspots and
slow nodes, and the placement rules."""

import itertools

import numpy as np
import pytest
import zcoll
from link_matrices import MB, analyse, cluster, matrix, uniform
from zcoll.observe import placement


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
