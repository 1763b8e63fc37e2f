"""Prometheus metrics of a zcoll job, through prometheus_client's registry, metric families and
exposition (names and units by Prometheus' conventions: base units, ``_total`` counters,
``_seconds`` durations, ``_bytes`` sizes).

What a rank reads without communicating (``call_rows(comm)``, from the engine's per-call
counters, csrc/comm/call_stats.h): per (collective, algorithm, size class) the calls, the bytes
of its input and a histogram of the seconds the calls took. What the monitor renders
(:class:`JobCollector`, over the state ``zcoll monitor`` aggregates from every rank):

=============================================  =========  =========================================
name                                           type       labels
=============================================  =========  =========================================
zcoll_collective_calls_total                   counter    rank, op, algorithm, size_class
zcoll_collective_bytes_total                   counter    rank, op, algorithm, size_class
zcoll_collective_duration_seconds              histogram  rank, op, algorithm, size_class
zcoll_link_bandwidth_bytes_per_second          gauge      src, dst (last window; queueing included)
zcoll_link_latency_seconds                     gauge      src, dst (per message, last window)
zcoll_rank_arrival_delay_seconds               gauge      rank
zcoll_verdict                                  gauge      verdict, who (1 for the current verdict)
zcoll_verdict_changes_total                    counter
zcoll_step_seconds                             gauge      rank, part (step, compute, communication,
                                                          exposed_communication)
zcoll_step_overlap_ratio                       gauge      rank
zcoll_compression_*                            gauge      rank, bucket, method (the guard's metrics)
zcoll_monitor_publishes_total                  counter    rank
=============================================  =========  =========================================

Size classes: this rank's input bytes up to 4 KiB, 64 KiB, 1 MiB, 16 MiB, and larger.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SIZE_CLASSES = ("4KiB", "64KiB", "1MiB", "16MiB", "larger")
BUCKET_BASE_SECONDS = 8192e-9  # csrc/comm/call_stats.h: bucket k < 8192 ns * 2^k
BUCKETS = 24
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# part label -> key of a published step (zcoll.observe.live.step_figures)
STEP_PARTS = {"step": "step_s", "compute": "compute", "communication": "communication",
              "exposed_communication": "exposed_communication"}  # fmt: skip


def bucket_bounds() -> list[float]:
    """The upper bounds (seconds) of the engine's duration buckets, the last one +Inf."""
    return [BUCKET_BASE_SECONDS * 2**k for k in range(BUCKETS - 1)] + [float("inf")]


def call_rows(comm: Any) -> list[dict[str, Any]]:
    """This rank's per-call counters (not collective; safe while another thread runs a call):
    one dict per (op, algorithm, size_class) with calls, bytes, seconds and buckets (counts per
    bucket, not cumulative). [] when the extension has no counters (an older build)."""
    read = getattr(comm, "_call_stats", None)
    if read is None or getattr(comm, "freed", False):
        return []
    merged: dict[tuple, dict[str, Any]] = {}
    for op, algorithm, size_class, calls, nbytes, sum_ns, buckets in read():
        key = (op, algorithm, SIZE_CLASSES[size_class])
        row = merged.setdefault(
            key, {"op": op, "algorithm": algorithm, "size_class": key[2], "calls": 0, "bytes": 0,
                  "seconds": 0.0, "buckets": [0] * BUCKETS},
        )  # fmt: skip
        row["calls"] += calls
        row["bytes"] += nbytes
        row["seconds"] += sum_ns * 1e-9
        row["buckets"] = [a + b for a, b in zip(row["buckets"], buckets)]
    return list(merged.values())


def _families() -> Any:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    return CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily


class JobCollector:
    """A prometheus_client collector over a job's state (``state()`` returns the dict that
    zcoll.observe.monitor_state.MonitorState.snapshot() builds), read at every scrape."""

    def __init__(self, state: Any):
        self.state = state

    def collect(self) -> Iterator[Any]:
        s = self.state()
        yield from collective_families(s.get("ranks", {}))
        yield from link_families(s.get("links") or {})
        yield from verdict_families(s.get("verdict") or {}, s.get("verdict_changes", 0))
        yield from step_families(s.get("steps", {}))
        yield from guard_families(s.get("ranks", {}))
        counter, _, _ = _families()
        c = counter("zcoll_monitor_publishes", "snapshots received from each rank", labels=["rank"])
        for rank, r in sorted(s.get("ranks", {}).items()):
            c.add_metric([str(rank)], r.get("publishes", 0))
        yield c


def collective_families(ranks: dict[Any, dict[str, Any]]) -> Iterator[Any]:
    counter, _, histogram = _families()
    labels = ["rank", "op", "algorithm", "size_class"]
    calls = counter("zcoll_collective_calls", "collective calls", labels=labels)
    nbytes = counter(
        "zcoll_collective_bytes", "bytes of this rank's input to collective calls", labels=labels
    )
    seconds = histogram("zcoll_collective_duration_seconds", "seconds in a collective call, per call",
                        labels=labels)  # fmt: skip
    bounds = bucket_bounds()
    for rank, r in sorted(ranks.items(), key=lambda kv: int(kv[0])):
        for row in r.get("calls", []):
            values = [str(rank), row["op"], row["algorithm"], row["size_class"]]
            calls.add_metric(values, row["calls"])
            nbytes.add_metric(values, row["bytes"])
            cumulative, total = [], 0
            for bound, n in zip(bounds, row["buckets"]):
                total += n
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), total))
            seconds.add_metric(values, cumulative, row["seconds"])
    yield from (calls, nbytes, seconds)


def link_families(links: dict[str, Any]) -> Iterator[Any]:
    _, gauge, _ = _families()
    bw = gauge("zcoll_link_bandwidth_bytes_per_second", "bytes/s of the link's messages in flight, last window",
               labels=["src", "dst"])  # fmt: skip
    lat = gauge(
        "zcoll_link_latency_seconds", "seconds per message of the link, last window", labels=["src", "dst"]
    )
    delay = gauge("zcoll_rank_arrival_delay_seconds", "mean arrival after the earliest rank, last window",
                  labels=["rank"])  # fmt: skip
    for name, fam in (("bandwidth", bw), ("latency", lat)):
        for i, row in enumerate(links.get(name) or []):
            for j, v in enumerate(row):
                if v is not None and i != j:
                    fam.add_metric([str(i), str(j)], v)
    for k, v in enumerate(links.get("arrival_delay") or []):
        if v is not None:
            delay.add_metric([str(k)], v)
    yield from (bw, lat, delay)


def verdict_families(verdict: dict[str, Any], changes: int) -> Iterator[Any]:
    counter, gauge, _ = _families()
    g = gauge("zcoll_verdict", "1 for the current link verdict (healthy, slow rank, slow link, slow node)",
              labels=["verdict", "who"])  # fmt: skip
    if verdict.get("label"):
        g.add_metric([verdict["label"], str(verdict.get("who") or "")], 1)
    c = counter("zcoll_verdict_changes", "times the confirmed verdict changed")
    c.add_metric([], changes)
    yield from (g, c)


def step_families(steps: dict[Any, list[dict[str, Any]]]) -> Iterator[Any]:
    """The last step each rank published: its parts (seconds) and overlap."""
    _, gauge, _ = _families()
    g = gauge(
        "zcoll_step_seconds", "seconds of the rank's last published step, by part", labels=["rank", "part"]
    )
    o = gauge(
        "zcoll_step_overlap_ratio", "share of communication hidden behind the backward pass", labels=["rank"]
    )
    for rank, series in sorted(steps.items()):
        if not series:
            continue
        last = series[-1]
        for part, key in STEP_PARTS.items():
            if last.get(key) is not None:
                g.add_metric([str(rank), part], last[key])
        if last.get("overlap") is not None:
            o.add_metric([str(rank)], last["overlap"])
    yield from (g, o)


GUARD_HELP = {
    "ratio": "dense bytes / bytes sent of the bucket's last allreduce",
    "residual_ratio": "norm of the error-feedback residual / norm of the bucket's gradient",
    "seconds": "seconds of the bucket's last allreduce",
}


def guard_families(ranks: dict[Any, dict[str, Any]]) -> Iterator[Any]:
    """The guard's per-bucket figures each rank published (compression per bucket)."""
    _, gauge, _ = _families()
    fams = {
        k: gauge(f"zcoll_compression_{'comm_seconds' if k == 'seconds' else k}", h,
                 labels=["rank", "bucket", "method"])
        for k, h in GUARD_HELP.items()
    }  # fmt: skip
    for rank, r in sorted(ranks.items(), key=lambda kv: int(kv[0])):
        for b in r.get("buckets", []):
            for k, fam in fams.items():
                if b.get(k) is not None:
                    fam.add_metric([str(rank), str(b["bucket"]), str(b["method"])], b[k])
    yield from fams.values()


def exposition(collector: Any) -> bytes:
    """The Prometheus text format of one collector (a fresh registry each time: cheap, and no
    global state shared with the user's own prometheus_client metrics)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
