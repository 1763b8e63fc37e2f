"""zcoll.observe.history: runs and events in SQLite, what a killed writer leaves, a corrupt file,
and the suggestions drawn from earlier runs."""

from __future__ import annotations

import sys
import textwrap

import pytest
from mpi_util import run
from zcoll.observe import history as hist


def test_runs_events_and_status(tmp_path):
    h = hist.History(tmp_path / "h.sqlite")
    h.start_run(
        "r1", {"ranks": 2, "hosts": "abc", "compression": ["int8"], "labels": {"model": "m"}}, t=100.0
    )
    h.update("r1", {"step_s": 0.05, "verdict": "healthy"}, t=101.0)
    h.event("r1", "verdict", {"label": "slow link", "who": "0->1", "text": "slow link 0->1"}, t=102.0)
    h.finish("r1", t=103.0)
    h.start_run("r2", {"ranks": 2, "hosts": "abc"})
    runs = h.runs()
    assert [r["id"] for r in runs] == ["r2", "r1"]
    assert runs[1]["status"] == "finished" and runs[1]["summary"]["step_s"] == 0.05
    assert runs[0]["status"] == "running"
    assert h.run("r1")["setup"]["compression"] == ["int8"] and h.run("r") is None  # ambiguous prefix
    assert h.events("r1")[0]["who"] == "0->1"
    old = hist.History(tmp_path / "old.sqlite")
    old.start_run("r0", {"ranks": 1}, t=1.0)  # silent for a long time, never ended
    assert old.runs()[0]["status"] == "stopped"


def test_a_killed_writer_leaves_what_it_wrote(tmp_path):
    """A writer killed with SIGKILL in the middle of its run: every committed record stays readable."""
    path = tmp_path / "h.sqlite"
    code = textwrap.dedent(f"""
        import os, signal
        from zcoll.observe.history import History
        h = History({str(path)!r})
        h.start_run("killed", {{"ranks": 4, "hosts": "x"}})
        for i in range(50):
            h.event("killed", "verdict", {{"label": "healthy", "i": i}})
            h.update("killed", {{"steps": i}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    rc, out = run([sys.executable, "-c", code], timeout=60)
    assert rc == -9 or rc == 137, out
    h = hist.History(path)
    r = h.run("killed")
    assert r["summary"]["steps"] == 49 and len(h.events("killed")) == 50


def test_corrupt_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "h.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(hist.HistoryError, match="move it aside"):
        hist.History(bad)


def _run(h, name, t, hosts="hx", slow=None, method="none", step=None, labels=None):
    h.start_run(name, {"ranks": 4, "hosts": hosts, "compression": [method], "labels": labels or {}}, t=t)
    h.update(name, {"slow_links": {slow: 3} if slow else {}, "step_s": step}, t=t)


def test_suggestions_from_history(tmp_path):
    h = hist.History(tmp_path / "h.sqlite")
    for k, slow in enumerate(["1->0", "2->3", "2->3", None, "2->3", "2->3"]):  # the oldest falls out
        _run(h, f"r{k}", 100.0 + k, slow=slow)
    _run(h, "other", 50.0, hosts="elsewhere", slow="2->3")
    text = [s["text"] for s in hist.suggestions(h, "hx")]
    assert any("link 2->3 was the slow link in 4 of the last 5 runs on these hosts" in t for t in text), text
    assert not any("1->0" in t for t in text)  # once is not a pattern

    _run(h, "plain", 200.0, hosts="h2", step=0.042, labels={"model": "lm"})
    _run(h, "int8", 201.0, hosts="h2", method="int8", step=0.029, labels={"model": "lm"})
    text = [s["text"] for s in hist.suggestions(h, "h2", {"model": "lm"}, ranks=4)]
    assert any("int8 saved 31% of the step on this model (model=lm) last time" in t for t in text), text
    assert hist.suggestions(h, "h2", {"model": "other"}, ranks=4) == []
