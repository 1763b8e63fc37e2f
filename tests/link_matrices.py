"""Synthetic link matrices (bandwidth and latency between ranks, no MPI) and a probe result made
from them: the input of the tests of zcoll.observe's placement, probe and probe_report."""

import itertools

import numpy as np
from zcoll.observe import placement, probe

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


def synthetic_result():
    node_of, bw, lat = cluster([2, 2])
    bw[2, 0] = bw[2, 1] = bw[3, 0] = bw[3, 1] = 31 * MB
    hosts = ["node0", "node0", "node1", "node1"]
    r = probe.ProbeResult(4, hosts, node_of, bw, lat, lat * 1.1, np.full(4, 10e9), {"window": 8}, {"mpi": "x"})
    return r.analyse()
