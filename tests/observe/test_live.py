"""zcoll.observe.live against a real monitor: a 2-rank job (tests/mpi/monitor_job.py) publishes
to zcoll monitor's application served in this process; what arrives is the job's own numbers.
The publisher alone: a monitor that is not there costs the caller nothing."""

from __future__ import annotations

import time
import warnings
from fractions import Fraction

import numpy as np
import pytest
from mpi_util import script_job
from zcoll.core.diagnose import Diagnoser
from zcoll.observe import history as hist
from zcoll.observe import live, serve
from zcoll.observe.monitor_state import MonitorState

pytest.importorskip(
    "starlette", reason="pip install 'zcoll[monitor]' (starlette, uvicorn, prometheus_client, plotly)"
)
monitor_server = pytest.importorskip("zcoll.tools.monitor_server")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    history = hist.History(tmp_path_factory.mktemp("history") / "h.sqlite")
    state = MonitorState(history)
    server = serve.serve(monitor_server.make_app(state, history=history), "127.0.0.1", 0)
    try:
        job = script_job("mpi/monitor_job.py", 2, f"--url={server.url}", "--steps=60", "--period=0.1")
        job.check("publish", min_checks=60)
        yield state, job
    finally:
        server.close()


def test_every_rank_published_its_calls(published):
    state, job = published
    s = state.snapshot()
    assert sorted(s["ranks"]) == ["0", "1"] and s["ended"] == [0, 1]
    for r in s["ranks"].values():
        ring = [c for c in r["calls"] if c["op"] == "allreduce" and c["size_class"] == "1MiB"]
        assert sum(c["calls"] for c in ring) >= 60, r["calls"]  # the job's 60 steps, 1 MiB each
    assert f"run={s['run']}" in job.finished.output


def test_links_verdict_and_steps(published):
    state, _ = published
    s = state.snapshot()
    bw = s["links"]["bandwidth"]
    assert bw[0][1] > 1e6 and bw[1][0] > 1e6 and bw[0][0] is None, bw
    assert len(s["links"]["arrival_delay"]) == 2
    assert s["verdict"]["label"] in ("healthy", "slow rank", "slow link", "slow node", "unknown"), s[
        "verdict"
    ]
    steps = s["steps"]["0"]
    assert len(steps) >= 3 and all(x["step_s"] > 0.003 for x in steps), steps
    assert s["setup"]["ranks"] == 2 and s["setup"]["labels"] == {"model": "monitor_job"}
    assert any(a.startswith("allreduce/") for a in s["setup"]["algorithms"]), s["setup"]


def test_the_run_is_in_the_history(published):
    """The monitor recorded the real job as it went: set-up, summary, finished."""
    state, _ = published
    assert state.flush()  # the history is written on its own thread
    r = state.history.run(state.run)
    assert r is not None and r["status"] == "finished" and r["ranks"] == 2, r
    s = r["summary"]
    assert s["steps"] == 60 and s["step_s"] > 0.003 and s["communication_s"] > 0, s
    assert sum(s["verdicts"].values()) >= 1 and s["algorithms"], s
    assert r["setup"]["labels"] == {"model": "monitor_job"} and r["setup"]["compression"] == ["none"], r


def test_publisher_never_blocks_on_a_missing_monitor():
    p = live.Publisher("http://127.0.0.1:9", timeout=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        for _ in range(1000):
            p.put({"x": 1})
        took = time.perf_counter() - start
        deadline = time.monotonic() + 10
        while p.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        p.close()
    assert took < 0.5, f"put() took {took:.3f} s for 1000 documents"
    assert p.failed >= 1 and p.sent == 0 and p.dropped >= 1
    assert sum("cannot publish to http://127.0.0.1:9/publish" in str(w.message) for w in caught) == 1


def test_ddp_on_the_zcoll_backend():
    """tests/torch_mpi/monitor_ddp.py: the windows through the group's worker leave training bit
    for bit unchanged; with the step profiler on (two in turn), the steps carry their parts."""
    state = MonitorState()
    server = serve.serve(monitor_server.make_app(state), "127.0.0.1", 0)
    try:
        job = script_job("torch_mpi/monitor_ddp.py", 2, f"--url={server.url}")
        job.check("results_unchanged", min_checks=3)
        job.check("profiled_steps_have_parts", min_checks=1)
    finally:
        server.close()
    steps = state.snapshot()["steps"]["0"]
    parts = [x for x in steps if x["source"] == "profiler"]
    # every step of both profilers (steps 0-24 and 0-14: each numbers its own) published once,
    # those after the training's last snapshot by the end one, built after the profiler stopped
    assert sorted(x["step"] for x in parts) == sorted([*range(25), *range(15)]), steps
    assert all(
        x["compute"] > 0 and x["exposed_communication"] >= 0 and x["communication"] > 0 for x in parts
    ), parts


def _rows(base_ns: int, calls: int, seconds_in_calls: float, ranks: int = 2):
    """Gathered telemetry rows with what next_interval reads: base_ns, calls, duration_sum."""
    rows = np.zeros((ranks, 4 + ranks * 7), np.int64)
    rows[:, 0], rows[:, 1], rows[:, 3] = base_ns, calls, int(seconds_in_calls * 1e9)
    return rows


def test_next_interval_from_the_gathered_rows():
    """The steps to the next window, computed alike on every rank from the rows: from rank 0's
    step time in the window before, shortened at once when the time in collectives jumps (a slow
    link), never fewer steps than 1.5 collectives (the diagnoser's blended minimum)."""
    needed = live.calls_needed(Diagnoser())
    assert needed == Fraction(3, 2)
    t0 = 10**12
    last = (t0 - 8 * 30_000_000, 8)  # the window before: 8 steps of 30 ms on rank 0's clock
    assert live.next_interval(_rows(t0, 16, 0.02), 8, 0.25, None, needed) == 0  # first window
    assert live.next_interval(_rows(t0, 16, 0.02), 8, 0.25, last, needed) == 8  # 0.25 s / 30 ms
    # this window's steps spent 200 ms each in collectives: the next window is one step long
    # by time, but two steps make the 1.5 collectives of a one-collective-per-step job
    assert live.next_interval(_rows(t0, 8, 8 * 0.2), 8, 0.25, last, needed) == 2
    assert live.next_interval(_rows(t0, 16, 8 * 0.2), 8, 0.25, last, needed) == 1
    assert live.next_interval(_rows(t0, 16, 0.0), 8, 1e-6, last, needed) == 1  # at least one step
    assert live.next_interval(_rows(t0, 16, 0.0), 8, 1e3, last, needed) == 1000  # at most 1000
    assert live.next_interval(_rows(t0, 0, 0.0), 8, 0.25, (t0, 8), needed) == 0  # telemetry off
