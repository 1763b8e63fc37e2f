"""zcoll.observe.probe: the measurement schedule, results through JSON, and one real run on 3
ranks. The rules on the matrices: test_placement.py; the files: test_probe_report.py; the command
line: tests/tools/test_probe_command.py; the emulated two-node network: tests/tools/test_testbed.py."""

import itertools
import sys

import numpy as np
import pytest
from link_matrices import synthetic_result
from mpi_util import mpirun
from zcoll.observe import probe


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
