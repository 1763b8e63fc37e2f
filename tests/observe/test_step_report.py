"""zcoll.observe.step_report on synthetic traces (tests/synthetic_traces.py): the verdict and
suggestions of three constructed traces, a late rank, `zcoll report` on a trace directory, and a
model without enough steps. The model: test_step_model.py; the trace format: test_trace.py; real
DDP runs: tests/torch/test_profiler.py and tests/bench/test_profiler_cases.py."""

import json
import sys

import numpy as np
import pytest
from chrome_trace import validate
from mpi_util import run
from synthetic_traces import INT8, MLP, analysis, synthetic_docs
from zcoll.observe import step_report, trace


def test_verdicts_of_three_constructed_traces():
    link = analysis(synthetic_docs(MLP, beta=1 / 20e6, codecs=INT8))  # 8.6 MB at 20 MB/s
    compute = analysis(synthetic_docs(MLP, compute=40e-9, beta=1 / 2e9))  # 350 ms of backward
    tiny = [4 * 1056] * 96  # 96 small tensors, one bucket each
    overhead = analysis(synthetic_docs(tiny, first_cap=1000, cap=1000, alpha=800e-6, eta=150e-6, gap=200e-6))
    assert (link.verdict["label"], compute.verdict["label"], overhead.verdict["label"]) == (
        "link-bound",
        "compute-bound",
        "overhead-bound",
    )
    kinds = lambda a: [s["kind"] for s in a.advice["suggestions"]]  # noqa: E731
    assert "compression" in kinds(link) and "bucket" in kinds(overhead)
    assert kinds(compute) == [] or all(s["speedup"] < 1.2 for s in compute.advice["suggestions"])
    bucket = next(s for s in overhead.advice["suggestions"] if s["kind"] == "bucket")
    assert bucket["bucket_cap_mb"] >= 0.25 and bucket["speedup"] > 2


def test_late_rank_is_waiting_not_cost():
    """Rank 1 loads its data 20 ms slower every step: the collectives' cost stays alpha + beta
    x (measured from the last rank's start), rank 1 is the slowest in every step, rank 0's wait
    grows by that much, and the model still replays the step."""
    docs = synthetic_docs(MLP, late=[0.0, 20e-3])
    a = analysis(docs)
    assert a.link.beta == pytest.approx(1 / 100e6, rel=1e-3)
    assert np.mean([s.alpha for s in a.shapes]) == pytest.approx(300e-6, rel=0.01)
    assert a.slowest == [1] * len(a.steps)
    assert a.median(0, "sync") - a.median(1, "sync") == pytest.approx(20e-3, rel=0.01)
    assert a.verdict["model_s"] == pytest.approx(a.measured(), rel=1e-3)


def test_report_command(tmp_path):
    rc, out = run([sys.executable, "-m", "zcoll", "report", "--help"])
    assert rc == 0 and "verdict" in out and "--warmup" in out
    rc, out = run([sys.executable, "-m", "zcoll", "report", str(tmp_path / "nope")])
    assert rc == 2 and "does not exist" in out
    rc, out = run([sys.executable, "-m", "zcoll", "report", str(tmp_path)])
    assert rc == 2 and "zcoll-trace-rank" in out
    for doc in synthetic_docs(MLP, beta=1 / 20e6, codecs=INT8):
        trace.write_json(tmp_path / trace.RANK_FILE.format(rank=doc["rank"]), doc)
    rc, out = run([sys.executable, "-m", "zcoll", "report", str(tmp_path)], timeout=120)
    assert rc == 0, out
    assert "VERDICT: LINK-BOUND" in out and "SUGGESTIONS" in out and "compression" in out
    for f in ("zcoll-report.txt", "zcoll-timeline.png", "zcoll-trace.json"):
        assert (tmp_path / f).stat().st_size > 0
    assert validate(json.loads((tmp_path / "zcoll-trace.json").read_text())) == []


def test_a_model_without_enough_steps_is_left_out_not_fatal():
    docs = synthetic_docs(MLP)
    for doc in docs:  # a second model that ran a single step
        doc["models"].append(dict(doc["models"][0], id=1, steps=doc["models"][0]["steps"][:1]))
    skipped = []
    analyses = step_report.analyze(docs, warmup=2, skipped=skipped)
    assert [a.model["id"] for a in analyses] == [0] and len(skipped) == 1 and "model 1" in skipped[0]
    for doc in docs:
        doc["models"] = doc["models"][1:]
    with pytest.raises(ValueError, match="no step after the first 2"):
        step_report.analyze(docs, warmup=2)
