"""zcoll.observe.guard_metrics: guarded compression's JSON-lines log, the Prometheus text it
serves, ZCOLL_METRICS_PORT, and `zcoll report` on a log."""

from __future__ import annotations

import json
import math
import socket
import sys
import urllib.request

import pytest
from mpi_util import run
from zcoll.observe.guard_metrics import MetricsLog


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_log_and_prometheus(tmp_path):
    """Served by Starlette on uvicorn, rendered by prometheus_client, parsed back by its parser."""
    parser = pytest.importorskip("prometheus_client.parser", reason="pip install 'zcoll[monitor]'")
    pytest.importorskip("uvicorn", reason="pip install 'zcoll[monitor]'")
    port = _free_port()
    log = MetricsLog(str(tmp_path / "m.jsonl"), port=port)
    try:
        log.write("bucket", step=3, bucket="ddp/bucket0/10", ratio=3.9)
        log.set("zcoll_compression_ratio", 3.9, bucket="ddp/bucket0/10", method="int8")
        log.add("zcoll_compression_escalations_total", 1, bucket="ddp/bucket0/10")
        log.add("zcoll_compression_escalations_total", 1, bucket="ddp/bucket0/10")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        log.close()
    assert 'zcoll_compression_ratio{bucket="ddp/bucket0/10",method="int8"} 3.9' in text
    assert 'zcoll_compression_escalations_total{bucket="ddp/bucket0/10"} 2.0' in text
    fams = {s.name: f for f in parser.text_string_to_metric_families(text) for s in f.samples}
    assert fams["zcoll_compression_escalations_total"].type == "counter"
    assert fams["zcoll_compression_ratio"].samples[0].labels == {"bucket": "ddp/bucket0/10", "method": "int8"}
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert rows[0]["event"] == "bucket" and rows[0]["step"] == 3 and rows[0]["ratio"] == 3.9


def test_metrics_port_in_use_is_a_warning_not_an_error(tmp_path):
    """The training goes on without its metrics port (the log is still written)."""
    pytest.importorskip("uvicorn", reason="pip install 'zcoll[monitor]'")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        with pytest.warns(UserWarning, match="in use"):
            log = MetricsLog(str(tmp_path / "m.jsonl"), port=busy.getsockname()[1])
    assert log.server is None
    log.write("decision", step=1)
    log.close()
    assert (tmp_path / "m.jsonl").read_text().count("decision") == 1


def test_bucket_line_written_directly_is_the_json_one(tmp_path):
    """MetricsLog.write_bucket formats the per-step line by hand (json.dumps cost ~70 us a
    bucket): it must read back as write("bucket", ...) does, odd names and inf/nan included."""
    fields = [
        (3, "ddp/bucket0/10", "int8", 3.9, 0.02, 0, 1.5e-3),
        (4, 'odd "key"\\ é', "top1%", math.inf, math.nan, 7, 0.0),
    ]
    fast, slow = MetricsLog(str(tmp_path / "fast.jsonl")), MetricsLog(str(tmp_path / "slow.jsonl"))
    for step, bucket, method, ratio, residual, nonfinite, seconds in fields:
        fast.write_bucket(step, bucket, method, ratio, residual, nonfinite, seconds)
        slow.write(
            "bucket", step=step, bucket=bucket, method=method, ratio=ratio, residual_ratio=residual,
            nonfinite=nonfinite, seconds=seconds,
        )  # fmt: skip
    fast.close()
    slow.close()

    def rows(name):
        out = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        for r in out:
            r.pop("t")
        return json.dumps(out)  # nan != nan: compared as text

    assert rows("fast.jsonl") == rows("slow.jsonl")


def test_metrics_port_from_environment():
    # ZCOLL_METRICS_PORT is in the env table; a bad value is an error naming it
    code = "import zcoll; print(zcoll._C.env_get('ZCOLL_METRICS_PORT'))"
    rc, out = run([sys.executable, "-c", code], env={"ZCOLL_METRICS_PORT": "9400"}, timeout=60)
    assert rc == 0 and out.strip().endswith("9400"), out
    rc, out = run([sys.executable, "-c", code], env={"ZCOLL_METRICS_PORT": "x"}, timeout=60)
    assert rc != 0 and "ZCOLL_METRICS_PORT" in out, out


def test_zcoll_report_reads_a_metrics_log(tmp_path):
    log = MetricsLog(str(tmp_path / "m.jsonl"))
    log.write(
        "bucket",
        step=3,
        bucket="ddp/bucket0/10",
        method="int8",
        ratio=3.9,
        residual_ratio=0.01,
        nonfinite=0,
        seconds=1e-3,
    )
    log.write(
        "decision",
        step=2,
        bucket="ddp/bucket0/10",
        bytes=40,
        method="int8",
        reason="the least lossy",
        predicted_s=1e-3,
        predicted_gain_s=2e-3,
        predicted={"none": 3e-3, "int8": 1e-3},
        measured_trial={"none": 3.1e-3, "int8": 1.1e-3},
        predicted_error=0.0099,
    )
    log.write(
        "measured",
        step=5,
        measured_s=0.011,
        predicted_s=0.010,
        relative=0.1,
        typical_s=0.0103,
        typical_relative=0.03,
        trial_predicted_s=0.008,
        trial_relative=0.375,
        predicted_gain_s=0.02,
        measured_gain_s=0.019,
        per_bucket={"ddp/bucket0/10": [0.012, 0.010]},
    )
    log.write(
        "check",
        step=5,
        bucket="ddp/bucket0/10",
        method="int8",
        error=0.5,
        bound=1e-3,
        step_error=0.6,
        residual_ratio=0.01,
    )
    log.write(
        "escalate", step=5, bucket="ddp/bucket0/10", method="bf16", previous="int8", error=0.5, bound=1e-3
    )
    log.close()
    rc, out = run([sys.executable, "-m", "zcoll", "report", str(tmp_path)], timeout=120)
    assert rc == 0, out
    for want in (
        "int8: 1.00 / 1.10 (none 3.10), error 0.99%",
        "median |error| 10.0%",
        "typical calls (each bucket's median call times its calls): median |error| 3.0%",
        "the trials' model alone (no interval learned from): median |error| 37.5%",
        "int8 against the average gradient: 60.00% measured (median), 0.99% predicted by the trials",
        "exact checks, int8: 1, worst relative error 0.5",
        "escalate  ddp/bucket0/10 int8 -> bf16",
        "3.9x",
        "ddp/bucket0/10               predicted vs measured: median |error| 20.0%",
    ):
        assert want in out, f"{want!r} not in:\n{out}"
