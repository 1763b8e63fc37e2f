"""zcoll.observe.metrics: the Prometheus families of a job's state, parsed back with
prometheus_client's own parser, and the engine's per-call counters on one rank."""

from __future__ import annotations

import pytest
from mpi_util import script_job
from zcoll.observe import metrics

UNREACHABLE = ("--url=http://127.0.0.1:9", "--unreachable", "--steps=40")
parser = pytest.importorskip(
    "prometheus_client.parser", reason="pip install 'zcoll[monitor]' (prometheus_client)"
)


def state():
    buckets = [0] * metrics.BUCKETS
    buckets[3], buckets[5] = 4, 6  # 4 calls under 65.5 us, 6 under 262 us
    row = {"op": "allreduce", "algorithm": "ring", "size_class": "64KiB", "calls": 10, "bytes": 40960,
           "seconds": 0.0015, "buckets": buckets}  # fmt: skip
    return {
        "ranks": {"0": {"calls": [row], "publishes": 3,
                        "buckets": [{"bucket": "ddp/bucket0", "method": "int8", "ratio": 3.9, "residual_ratio": 0.02,
                                     "seconds": 0.004}]},
                  "1": {"calls": [dict(row, calls=12)], "publishes": 2}},
        "links": {"bandwidth": [[None, 1.2e8], [3.0e7, None]], "latency": [[None, 1e-4], [4e-4, None]],
                  "arrival_delay": [0.0, 0.003]},
        "verdict": {"label": "slow link", "who": "1->0"},
        "verdict_changes": 2,
        "steps": {"0": [{"step": 7, "step_s": 0.05, "compute": 0.04, "communication": 0.02,
                         "exposed_communication": 0.01, "overlap": 0.5}]},
    }  # fmt: skip


def families():
    text = metrics.exposition(metrics.JobCollector(state)).decode()
    return {f.name: f for f in parser.text_string_to_metric_families(text)}, text


def test_names_types_and_values_parse_back():
    fams, text = families()
    assert fams["zcoll_collective_calls"].type == "counter"
    calls = {(s.labels["rank"], s.name): s.value for s in fams["zcoll_collective_calls"].samples}
    assert (
        calls[("0", "zcoll_collective_calls_total")] == 10
        and calls[("1", "zcoll_collective_calls_total")] == 12
    )
    assert (
        'zcoll_collective_bytes_total{algorithm="ring",op="allreduce",rank="0",size_class="64KiB"} 40960.0'
        in text
    )
    bw = {
        (s.labels["src"], s.labels["dst"]): s.value
        for s in fams["zcoll_link_bandwidth_bytes_per_second"].samples
    }
    assert bw == {("0", "1"): 1.2e8, ("1", "0"): 3.0e7}  # no diagonal
    verdict = fams["zcoll_verdict"].samples[0]
    assert verdict.labels == {"verdict": "slow link", "who": "1->0"} and verdict.value == 1
    assert fams["zcoll_verdict_changes"].samples[0].value == 2
    parts = {s.labels["part"]: s.value for s in fams["zcoll_step_seconds"].samples}
    assert parts == {"step": 0.05, "compute": 0.04, "communication": 0.02, "exposed_communication": 0.01}
    assert fams["zcoll_compression_ratio"].samples[0].value == 3.9
    assert {s.labels["rank"]: s.value for s in fams["zcoll_rank_arrival_delay_seconds"].samples}["1"] == 0.003


def test_histogram_is_cumulative_and_ends_at_inf():
    fams, _ = families()
    h = fams["zcoll_collective_duration_seconds"]
    assert h.type == "histogram"
    rank0 = [s for s in h.samples if s.labels["rank"] == "0"]
    les = [(s.labels["le"], s.value) for s in rank0 if s.name.endswith("_bucket")]
    assert les[-1] == ("+Inf", 10.0)
    values = [v for _, v in les]
    assert values == sorted(values) and values[2] == 0 and values[3] == 4 and values[5] == 10
    assert float(les[3][0]) == pytest.approx(metrics.BUCKET_BASE_SECONDS * 8)
    count = next(s.value for s in rank0 if s.name.endswith("_count"))
    total = next(s.value for s in rank0 if s.name.endswith("_sum"))
    assert count == 10 and total == pytest.approx(0.0015)


def test_engine_counts_every_call_by_kind():
    """tests/mpi/monitor_job.py: per (op, algorithm, size class) on 2 ranks, read without communicating."""
    script_job("mpi/monitor_job.py", 2, *UNREACHABLE).check("call_counters", min_checks=4)


def test_unreachable_monitor_leaves_the_job_alone():
    """The same job publishing to a monitor that is not there: same results, one warning, no wait."""
    job = script_job("mpi/monitor_job.py", 2, *UNREACHABLE)
    job.check("publish", min_checks=40)
    out = job.finished.output
    assert 1 <= out.count("cannot publish to") <= 2, out  # one warning per rank at most
