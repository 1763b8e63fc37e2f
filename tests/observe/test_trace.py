"""zcoll.observe.trace: the Chrome trace of synthetic step traces (and the checker that catches
overlaps), clock alignment, loading a trace directory, the ZCOLL_TRACE setting."""

import sys

import pytest
from chrome_trace import validate
from mpi_util import run
from synthetic_traces import MLP, synthetic_docs
from zcoll import _C
from zcoll.observe import trace


def test_chrome_trace_of_synthetic_docs_is_valid_and_checker_catches_overlaps():
    docs = synthetic_docs(MLP)
    chrome = trace.chrome_trace(docs)
    assert validate(chrome) == []
    names = {e["name"] for e in chrome["traceEvents"]}
    assert {
        "forward",
        "backward",
        "sync",
        "optimizer",
        "data",
        "bucket 0",
        "bucket 0 ready",
        "thread_name",
    } <= names
    bad = {
        "traceEvents": [
            {"name": "a", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 10},
            {"name": "b", "ph": "X", "pid": 0, "tid": 1, "ts": 5, "dur": 10},
            {"name": "c", "ph": "Q", "pid": 0, "tid": 1, "ts": 5},
        ]
    }
    problems = validate(bad)
    assert any("overlaps" in p for p in problems) and any("unknown phase" in p for p in problems)


def test_clock_map_corrects_offset_and_drift():
    m = trace.ClockMap(
        {"start": {"offset_ns": 1000, "local_ns": 0}, "end": {"offset_ns": 3000, "local_ns": 10_000}}
    )
    assert m(0) == 1000 and m(10_000) == 13_000 and m(5_000) == 7_000
    assert trace.ClockMap({"start": {"offset_ns": -7, "local_ns": 5}})(100) == 93


def test_trace_load_refuses_foreign_and_incomplete_directories(tmp_path):
    docs = synthetic_docs(MLP, ranks=3)
    for doc in docs[:2]:
        trace.write_json(tmp_path / trace.RANK_FILE.format(rank=doc["rank"]), doc)
    with pytest.raises(ValueError, match=r"ranks \[2\]"):
        trace.load(tmp_path)
    trace.write_json(tmp_path / "zcoll-trace-rank2.json", {"format": "other"})
    with pytest.raises(ValueError, match="not a zcoll step trace"):
        trace.load(tmp_path)


def test_zcoll_trace_is_a_declared_string_setting():
    assert _C.env_get("ZCOLL_TRACE") == ""
    rc, out = run(
        [sys.executable, "-c", "import zcoll; print(repr(zcoll._C.env_get('ZCOLL_TRACE')))"],
        env={"ZCOLL_TRACE": "/some/dir"},
    )
    assert rc == 0 and out.strip() == "'/some/dir'", out
