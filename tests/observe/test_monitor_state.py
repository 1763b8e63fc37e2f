"""zcoll.observe.monitor_state: merging the ranks' snapshots, the verdict's history, the run in
the history file, and a finished run from its files (zcoll.observe.monitor_files)."""

from __future__ import annotations

import json

import pytest
from link_matrices import synthetic_result
from zcoll.observe import history as hist
from zcoll.observe import monitor_files
from zcoll.observe.monitor_state import MonitorState


def doc(rank, t, verdict=None, event=None, run="run-a", steps=()):
    d = {"format": "zcoll-monitor/1", "run": run, "rank": rank, "size": 2, "t": t, "event": event,
         "calls": [{"op": "allreduce", "algorithm": "ring", "size_class": "1MiB", "calls": 5, "bytes": 5 << 20,
                    "seconds": 0.01, "buckets": [0] * 24}],
         "steps": [{"step": i, "step_s": 0.02, "compute": None, "communication": 0.005,
                    "exposed_communication": None, "overlap": None} for i in steps], "buckets": []}  # fmt: skip
    if rank == 0:
        d["setup"] = {
            "ranks": 2,
            "hosts": "fp",
            "compression": ["none"],
            "labels": {"model": "x"},
            "algorithms": [],
        }
        d["links"] = {"bandwidth": [[None, 1e8], [float("nan"), None]], "latency": [[None, 1e-4], [2e-4, None]],
                      "arrival_delay": [0.0, 0.0]}  # fmt: skip
        d["verdict"] = verdict
    return d


def test_merge_verdict_history_and_record(tmp_path):
    h = hist.History(tmp_path / "h.sqlite")
    s = MonitorState(h)
    healthy = {"label": "healthy", "who": None, "text": "healthy"}
    slow = {"label": "slow link", "who": "1->0", "text": "slow link 1->0: ..."}
    s.publish(doc(0, 1.0, healthy, "start", steps=[1, 2]))
    s.publish(doc(1, 1.0, event="start", steps=[1, 2]))
    s.publish(doc(0, 2.0, healthy))
    s.publish(doc(0, 3.0, slow))
    assert s.flush()  # the history's suggestions are drawn on its writer thread
    snap = s.snapshot()
    assert [v["label"] for v in snap["verdicts"]] == ["healthy", "slow link"] and snap["verdict_changes"] == 2
    assert snap["links"]["bandwidth"][1][0] is None  # NaN is null for the browser
    assert any("link 1->0 is slow now" in x["text"] for x in snap["suggestions"])
    assert len(snap["steps"]["0"]) == 2
    s.publish(doc(0, 4.0, slow, "end"))
    s.publish(doc(1, 4.0, event="end"))
    assert s.flush()
    run = h.run("run-a")
    assert run["status"] == "finished" and run["summary"]["slow_links"] == {"1->0": 2}
    assert [e["label"] for e in h.events("run-a")] == ["healthy", "slow link"]
    s.publish(doc(0, 5.0, healthy, "start", run="run-b"))  # a new run replaces the old one
    assert s.snapshot()["run"] == "run-b" and s.snapshot()["verdicts"][0]["label"] == "healthy"


def test_bad_documents_and_history_errors():
    s = MonitorState()
    with pytest.raises(ValueError, match="zcoll-monitor/1"):
        s.publish({"hello": 1})

    class Broken:
        def __getattr__(self, name):
            def fail(*a, **k):
                raise OSError("disk full")

            return fail

    s = MonitorState(Broken())
    s.publish(doc(0, 1.0, {"label": "healthy", "who": None, "text": "healthy"}, "start"))
    assert s.flush()
    assert s.snapshot()["history_error"] == "history not written: disk full"


def test_a_finished_run_from_its_probe_and_logs(tmp_path):
    synthetic_result().save(tmp_path / "probe.json")
    (tmp_path / "m.jsonl").write_text(
        json.dumps(
            {
                "t": 1,
                "event": "bucket",
                "step": 3,
                "bucket": "ddp/bucket0",
                "method": "int8",
                "ratio": 3.9,
                "residual_ratio": 0.02,
                "nonfinite": 0,
                "seconds": 0.004,
            }
        )
        + "\n{cut by a kill"
    )
    s = MonitorState()
    s.load(monitor_files.load(tmp_path))
    snap = s.snapshot()
    assert snap["static"] and snap["links"]["bandwidth"][0][1] > 0
    assert snap["ranks"]["0"]["buckets"][0]["ratio"] == 3.9
    assert snap["verdict"]["label"] == "slow link" and any(
        "hotspot" in x["text"] for x in snap["suggestions"]
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no step traces"):
        monitor_files.load(tmp_path / "empty")


def run_docs(run, t0, method, step_s, slow):
    """One run's snapshots as zcoll.observe.live sends them: rank 0's start (no bucket yet, so
    compression "none"), a few windows, every rank's end (rank 0's set-up by then names int8)."""
    verdict = {"label": "slow link", "who": slow, "text": f"slow link {slow}"} if slow else None
    healthy = {"label": "healthy", "who": None, "text": "healthy"}
    docs = []
    for k, event in enumerate(("start", None, None, "end")):
        for rank in (0, 1):
            d = doc(rank, t0 + k, verdict if k else healthy, event, run=run, steps=range(3 * k, 3 * k + 3))
            for s in d["steps"]:
                s["step_s"] = step_s
            if rank == 0 and k:
                d["setup"] = dict(d["setup"], compression=[method])
            docs.append(d)
    return docs


def test_suggestions_from_runs_the_monitor_recorded(tmp_path):
    """Runs recorded through the monitor's own path (publish -> history), then the next run's
    page: the slow link of the earlier runs and what int8 saved, in their numbers."""
    h = hist.History(tmp_path / "h.sqlite")
    s = MonitorState(h)
    for t0, (run, method, step_s) in enumerate(
        (("a", "none", 0.210), ("b", "int8", 0.060), ("c", "none", 0.2))
    ):
        for d in run_docs(run, 10.0 * t0, method, step_s, "1->0"):
            s.publish(d)
    assert s.flush()
    assert [r["status"] for r in h.runs()] == ["finished"] * 3
    assert h.run("b")["setup"]["compression"] == ["int8"] and h.run("c")["summary"]["slow_links"] == {
        "1->0": 3
    }
    s.publish(run_docs("d", 40.0, "none", 0.2, None)[0])
    assert s.flush()
    text = [x["text"] for x in s.snapshot()["suggestions"]]
    assert any("link 1->0 was the slow link in 3 of the last 3 runs on these hosts" in t for t in text), text
    assert any("int8 saved 70% of the step on this model (model=x) last time (200.0 ms without compression -> "
               "60.0 ms)" in t for t in text), text  # fmt: skip


def test_ranks_not_heard_from_are_named():
    now = [100.0]
    s = MonitorState(clock=lambda: now[0])
    s.publish(doc(1, 1.0, event="start"))
    assert s.snapshot()["notes"] == []  # within the grace: rank 0's first snapshot may be on its way
    now[0] += s.grace
    assert any("rank 0 has not published" in n for n in s.snapshot()["notes"])
    s.publish(doc(0, 2.0, {"label": "healthy", "who": None, "text": "healthy"}))
    assert s.snapshot()["notes"] == []
    now[0] += 11.0
    s.publish(doc(0, 3.0, {"label": "healthy", "who": None, "text": "healthy"}))
    assert s.snapshot()["notes"] == ["silent: rank 1 for 14 s (stopped, stuck, or cut off from this monitor)"]
    s.publish(doc(1, 4.0, event="end"))
    assert s.snapshot()["notes"] == []


def test_late_snapshots_of_the_last_run(tmp_path):
    """Rank 1's last snapshots of a run come after the next run began (its posts queue behind a
    slow link): the next run's suggestions already count that run, and the late ones do not take
    the page back to it."""
    h = hist.History(tmp_path / "h.sqlite")
    s = MonitorState(h)
    for t0, run in enumerate(("a", "b")):
        docs = run_docs(run, 10.0 * t0, "none", 0.2, "1->0")
        for d in docs[:-3] if run == "b" else docs:  # run b: rank 1's last two and rank 0's end are late
            s.publish(d)
    s.publish(run_docs("c", 30.0, "none", 0.2, None)[0])
    assert s.flush()
    assert h.run("b")["summary"]["slow_links"] == {"1->0": 2} and h.run("b")["status"] == "stopped"
    text = [x["text"] for x in s.snapshot()["suggestions"]]
    assert any("link 1->0 was the slow link in 2 of the last 2 runs" in t for t in text), text
    for d in run_docs("b", 10.0, "none", 0.2, "1->0")[-3:]:
        s.publish(d)
    assert s.snapshot()["run"] == "c" and s.late == 3


def test_snapshot_since_sends_only_new_steps():
    """The event stream's pushes after the first: the steps after the totals the page has, which
    appended to what it had give the whole series again (also past the series' length)."""
    from zcoll.observe.monitor_state import SERIES

    s = MonitorState()
    s.publish(doc(0, 1.0, steps=range(0, 5)))
    s.publish(doc(1, 1.0, steps=range(0, 3)))
    first = s.snapshot()
    page = {r: list(v) for r, v in first["steps"].items()}
    assert first["step_totals"] == {"0": 5, "1": 3} and "steps_from" not in first
    totals = first["step_totals"]
    for t in range(2, 40):
        s.publish(doc(0, t, steps=range(5 + (t - 2) * 20, 5 + (t - 1) * 20)))
        if t % 3 == 0:
            s.publish(doc(1, t, steps=range(t, t + 1)))
        push = s.snapshot(since=totals)
        assert push["steps_from"] == totals and push["series"] == SERIES
        assert "1" not in push["steps"] or t % 3 == 0  # a rank with nothing new is left out
        for r, new in push["steps"].items():
            page[r] = (page.get(r, []) + new)[-SERIES:]
        totals = push["step_totals"]
        assert page == {r: list(v) for r, v in s.snapshot()["steps"].items()}
    assert len(page["0"]) == SERIES and page["0"][-1]["step"] == 5 + 38 * 20 - 1
