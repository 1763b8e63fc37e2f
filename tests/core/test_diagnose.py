"""The link-telemetry classifier (python/zcoll/diagnose.py) on synthetic telemetry: each label
from the telemetry that fault would produce, tiers, hysteresis and its log line, and the exact
rebuild of the gathered sums (clock offsets, per-rank time bases). Real telemetry:
tests/mpi/telemetry.py; the randomized trials on an emulated network: bench/diagnose_trials.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from mpi_util import case_names, script_job

from zcoll.core.diagnose import Diagnoser, LinkStats, Thresholds, classify, from_rows

P = 4
MB = 1 << 20


def window(per_byte=None, delay=None, call=0.010, calls=10, links=None, seed=0, noise=0.15):
    """A window: `links` (default: every directed pair) each moved 4 MiB at `per_byte[i][j]`
    seconds per byte (1 ns, +-noise), ranks arrived `delay` seconds after the earliest."""
    rng = np.random.default_rng(seed)
    links = links if links is not None else [(i, j) for i in range(P) for j in range(P) if i != j]
    nbytes = np.zeros((P, P))
    messages = np.zeros((P, P))
    busy = np.full((P, P), np.nan)
    for i, j in links:
        nbytes[i, j] = 4 * MB
        messages[i, j] = 32
        rate = 1e-9 if per_byte is None else per_byte[i][j]
        busy[i, j] = nbytes[i, j] * rate * (1 + noise * rng.uniform(-1, 1))
    delay = np.zeros(P) if delay is None else np.asarray(delay, float)
    seconds = call + delay.max() - delay  # the others wait for the latest rank
    with np.errstate(invalid="ignore", divide="ignore"):
        return LinkStats(calls, nbytes, messages, busy, busy / messages, nbytes / busy / 1e9, delay, seconds)


def slowed(links, factor=4.0):
    per_byte = [[1e-9] * P for _ in range(P)]
    for i, j in links:
        per_byte[i][j] *= factor
    return per_byte


RING = [(i, (i + 1) % P) for i in range(P)]


def test_healthy():
    v = classify(window())
    assert v.label == "healthy", v


def test_healthy_says_when_no_link_has_peers_to_compare():
    """One link carried the window: nothing to compare it with, and the evidence says so (no 'nan')."""
    v = classify(window(links=[(0, 1)]))
    assert v.label == "healthy" and "no tier has two links" in v.evidence and "nan" not in v.evidence, v
    assert "slowest 1." in classify(window()).evidence


def test_slow_rank_is_the_late_one():
    v = classify(window(delay=[0, 0.001, 0.020, 0.0005]))  # rank 2 sleeps 2x a 10 ms call
    assert (v.label, v.rank) == ("slow rank", 2), v
    assert "20.00 ms after the earliest rank" in v.evidence


def test_late_rank_wins_over_the_slow_looking_links_into_it():
    """Messages to a late rank wait for it: its incoming links look slow too."""
    v = classify(window(per_byte=slowed([(i, 1) for i in range(P) if i != 1], 10), delay=[0, 0.02, 0, 0]))
    assert (v.label, v.rank) == ("slow rank", 1), v


def test_slow_link():
    v = classify(window(per_byte=slowed([(1, 2)])))
    assert (v.label, v.link) == ("slow link", (1, 2)), v
    assert "1->2" in v.evidence


def test_slow_link_on_a_ring_that_uses_four_links():
    v = classify(window(per_byte=slowed([(3, 0)]), links=RING))
    assert (v.label, v.link) == ("slow link", (3, 0)), v


def test_slow_node_all_outgoing_links():
    v = classify(window(per_byte=slowed([(3, j) for j in range(3)])))
    assert (v.label, v.node) == ("slow node", 3), v
    assert "its 3 outgoing links are" in v.evidence


def test_slow_node_all_incoming_links():
    v = classify(window(per_byte=slowed([(i, 0) for i in range(1, P)])))
    assert (v.label, v.node) == ("slow node", 0), v


def test_one_slow_link_of_a_node_is_a_link():
    v = classify(window(per_byte=slowed([(3, 1)])))
    assert v.label == "slow link", v


def test_tiers_do_not_mix():
    """Two nodes of two ranks: links between nodes are 5x slower than within, by nature: healthy.
    One inter-node link 4x slower than its tier: that link."""
    nodes = ["a", "a", "b", "b"]
    base = [[1e-9 if nodes[i] == nodes[j] else 5e-9 for j in range(P)] for i in range(P)]
    assert classify(window(per_byte=base), nodes).label == "healthy"
    base[0][2] *= 4
    v = classify(window(per_byte=base), nodes)
    assert (v.label, v.link) == ("slow link", (0, 2)), v


def test_node_of_two_ranks():
    nodes = ["a", "a", "b", "b"]
    per_byte = slowed([(i, j) for i in (2, 3) for j in (0, 1)])  # node b's egress across nodes
    v = classify(window(per_byte=per_byte), nodes)
    assert (v.label, v.node) == ("slow node", "b"), v


def test_too_few_calls_say_nothing():
    assert classify(window(calls=1), t=Thresholds(min_calls=3)).label == "unknown"


def test_hysteresis_and_one_log_line(caplog):
    d = Diagnoser(confirm=2, memory=0)
    caplog.set_level(logging.WARNING, logger="zcoll")
    assert d.update(window()).label == "healthy"
    slow = window(per_byte=slowed([(0, 1)]))
    assert d.update(slow).label == "healthy"  # one window is not enough
    assert d.update(window()).label == "healthy"  # and the streak is broken
    assert d.update(slow).label == "healthy"
    assert d.update(slow).label == "slow link"
    assert d.update(slow).label == "slow link"
    changes = [r for r in caplog.records if "link diagnosis changed" in r.getMessage()]
    assert len(changes) == 1 and "slow link 0->1" in changes[0].getMessage()
    assert d.update(window()).label == "slow link" and d.update(window()).label == "healthy"


def test_blended_windows_keep_the_evidence():
    """One noisy window does not flip a label the earlier windows support (memory 0.5)."""
    d = Diagnoser(confirm=1, memory=0.5)
    slow = window(per_byte=slowed([(2, 3)], 6.0))
    assert d.update(slow).label == "slow link"
    assert d.update(window(seed=5)).label == "slow link"  # blended: 6x at weight 1/2 still stands out


def test_settle_blends_like_windows_and_classifies_a_change_at_once():
    """With settle, windows like the evidence are only blended (at most `settle` seconds apart
    they are classified anyway); a slow link is classified from its first window, so it is
    confirmed in as many windows as without settle, and so is the way back."""
    clock = [0.0]
    d = Diagnoser(settle=1.0, clock=lambda: clock[0])
    ref = Diagnoser()
    slow = slowed([(1, 2)], 10.0)
    series = [window(seed=s, noise=0.05) for s in range(12)]
    series += [window(per_byte=slow, seed=s, noise=0.05) for s in range(5)]
    series += [window(seed=s, noise=0.05) for s in range(30, 45)]
    labels, skipped = [], []
    for w in series:
        clock[0] += 0.25
        before = d.skipped
        labels.append((d.update(w).label, ref.update(w).label))
        skipped.append(d.skipped > before)
    assert [a for a, _ in labels] == [b for _, b in labels]  # the same verdict at every window
    assert "slow link" in [a for a, _ in labels]
    assert sum(skipped[1:12]) >= 6  # the healthy windows: mostly blended only
    assert not any(skipped[12:15])  # the slow link's windows up to its confirmation: classified
    runs = [sum(skipped[i : i + 4]) for i in range(len(skipped) - 3)]
    assert max(runs) <= 3  # never more than `settle` (4 windows here) without classifying


def test_similar_windows():
    from zcoll.core.diagnose import similar

    base = window(noise=0.0)
    assert similar(base, window(seed=1, noise=0.1))
    assert not similar(base, window(per_byte=slowed([(0, 3)], 2.0), noise=0.0))
    assert not similar(base, window(delay=[0, 0, 0.004, 0], noise=0.0))
    assert not similar(base, window(calls=1, noise=0.0))
    assert not similar(base, window(links=[(0, 1), (1, 0)], noise=0.0))


@pytest.mark.parametrize("trial", range(200))
def test_randomized_synthetic_trials(trial):
    """The four kinds of fault, at random places, with 25% noise: each labelled right."""
    rng = np.random.default_rng(1000 + trial)
    kind = ["healthy", "slow rank", "slow link", "slow node"][trial % 4]
    delay = rng.uniform(0, 0.0003, P)
    per_byte, want = None, ("healthy", None)
    if kind == "slow rank":
        k = int(rng.integers(P))
        delay[k] += 0.020
        want = ("slow rank", k)
    elif kind == "slow link":
        i, j = rng.choice(P, 2, replace=False)
        per_byte, want = slowed([(int(i), int(j))]), ("slow link", (int(i), int(j)))
    elif kind == "slow node":
        k = int(rng.integers(P))
        per_byte, want = slowed([(k, j) for j in range(P) if j != k]), ("slow node", k)
    v = classify(window(per_byte=per_byte, delay=delay, seed=trial, noise=0.25))
    got = (v.label, {"slow rank": v.rank, "slow link": v.link, "slow node": v.node}.get(v.label))
    assert got == want, v


def test_rows_are_rebuilt_exactly():
    """Per-rank time bases and clock offsets: 2 ranks, rank 1's clock 5 s ahead of rank 0's."""
    p = 2
    row_len = 4 + p * 7
    rows = np.zeros((p, row_len), np.int64)
    base0, base1 = 1_000_000_000_000, 2_000_000_000_000
    offset1 = 5_000_000_000
    rows[0, :4] = [base0, 3, 3 * 100, 3 * 2_000_000]  # arrivals at base0+100 ns; 2 ms in each call
    rows[1, :4] = [base1, 3, 0, 3 * 1_000_000]
    rows[0, 4 + 1] = offset1  # rank 0 measured rank 1's offset
    # rank 1 arrived at rank-0 time (base1 - offset1) + 0 ns
    peer = lambda r, j: 4 + p + j * 6  # noqa: E731
    # rank 0 posted 2 sends to rank 1 at its times 10 and 20 (relative); rank 1 completed them at
    # rank-0 times 1000 and 2000 ns after their posts
    rows[0, peer(0, 1) : peer(0, 1) + 3] = [8192, 2, 30]
    t_done = [(base0 + 10 + 1000) - (base1 - offset1), (base0 + 20 + 2000) - (base1 - offset1)]
    rows[1, peer(1, 0) + 3 : peer(1, 0) + 6] = [8192, 2, sum(t_done)]
    s = from_rows(rows)
    assert s.calls == 3
    assert s.busy[0, 1] == pytest.approx(3000e-9)
    assert s.latency[0, 1] == pytest.approx(1500e-9)
    assert s.gbps[0, 1] == pytest.approx(8192 / 3000e-9 / 1e9)
    assert np.isnan(s.busy[1, 0])
    arrival0 = base0 + 100
    arrival1 = base1 - offset1
    assert s.arrival_delay.tolist() == pytest.approx(
        [(arrival0 - min(arrival0, arrival1)) / 1e9, (arrival1 - min(arrival0, arrival1)) / 1e9]
    )
    assert s.call_seconds.tolist() == pytest.approx([0.002, 0.001])


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("case", case_names("mpi/telemetry.py"))
def test_telemetry_of_real_jobs(case, nprocs):
    script_job("mpi/telemetry.py", nprocs, timeout=180).check(case, min_checks=1)


SMPI = Path(__file__).resolve().parent / "smpi_linkstats"
SMPI_CASES = {
    # traffic (algorithms at 1-16 MiB, ranks per node): platform -> (label, who in nodes)
    "three-algorithms-1-per-node": {
        "star": ("healthy", None),
        "star_slow_node": ("slow node", 1),
        "star_slow_link": ("slow link", (1, 2)),
    },
    "halving-doubling-1-per-node": {
        "star": ("healthy", None),
        "star_slow_node": ("slow node", 1),
        "star_slow_link": ("healthy", None),  # halving-doubling's partners never send 1 -> 2
    },
    "ring-halving-doubling-2-per-node": {
        "star": ("healthy", None),
        "star_slow_node": ("slow node", 1),
        "star_slow_link": ("slow link", (1, 2)),
    },
}


@pytest.mark.parametrize("traffic,platform", [(t, p) for t, cases in SMPI_CASES.items() for p in cases])
def test_telemetry_recorded_in_smpi(traffic, platform):
    """Telemetry zcoll gathered inside SimGrid (bench/smpi_scale.py --diagnose, 16 ranks on a star
    of 12.5 GB/s links; node 1 or the route 1 -> 2 4x slower): on many nodes, halving-doubling
    and recursive doubling make the links avoiding a slow node queue too (24-34 links over 2x)
    and spread 2-8x queueing over the healthy star's links; the verdicts stay right."""
    data = json.loads((SMPI / f"{traffic}-{platform}.json").read_text())
    nodes = data["nodes"]
    v = classify(from_rows(np.array(data["rows"])), nodes)
    who = None
    if v.label == "slow node":
        who = v.node
    elif v.label == "slow link":
        who = (nodes[v.link[0]], nodes[v.link[1]])
    assert (v.label, who) == SMPI_CASES[traffic][platform], v
