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
    snap = s.snapshot()
    assert [v["label"] for v in snap["verdicts"]] == ["healthy", "slow link"] and snap["verdict_changes"] == 2
    assert snap["links"]["bandwidth"][1][0] is None  # NaN is null for the browser
    assert any("link 1->0 is slow now" in x["text"] for x in snap["suggestions"])
    assert len(snap["steps"]["0"]) == 2
    s.publish(doc(0, 4.0, slow, "end"))
    s.publish(doc(1, 4.0, event="end"))
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
