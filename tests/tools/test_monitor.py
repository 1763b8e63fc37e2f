"""zcoll.tools.monitor_server and `zcoll monitor` / `zcoll history`: the routes (Prometheus text
parsed back, server push, publishing, the token), and bad input: a port in use, an address off
loopback, a corrupt history file, a directory with nothing to show."""

from __future__ import annotations

import json
import socket
import sqlite3
import sys
import time
import urllib.error
import urllib.request

import pytest
from mpi_util import run
from zcoll.observe import history as hist
from zcoll.observe import live, serve
from zcoll.observe.monitor_state import MonitorState

pytest.importorskip(
    "starlette", reason="pip install 'zcoll[monitor]' (starlette, uvicorn, prometheus_client, plotly)"
)
parser = pytest.importorskip("prometheus_client.parser", reason="pip install 'zcoll[monitor]'")
monitor_server = pytest.importorskip("zcoll.tools.monitor_server")
cli = pytest.importorskip("zcoll.tools.cli")
ZCOLL = [sys.executable, "-m", "zcoll.tools.cli"]


def zcoll(capsys, *argv):
    """`zcoll ARGV` in this process (the entry point's own parser and function; no interpreter
    start per call): (exit status, stdout + stderr). Only for commands that return at once."""
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


def snapshot_doc(rank, run="r1", event=None):
    d = {"format": "zcoll-monitor/1", "run": run, "rank": rank, "size": 2, "t": 1.0, "event": event, "steps": [],
         "calls": [{"op": "allreduce", "algorithm": "ring", "size_class": "1MiB", "calls": 3, "bytes": 3 << 20,
                    "seconds": 0.003, "buckets": [0, 0, 0, 0, 0, 0, 0, 3] + [0] * 16}], "buckets": []}  # fmt: skip
    if rank == 0:
        d.update(links={"bandwidth": [[None, 2e8], [1e8, None]], "latency": [[None, 5e-5], [9e-5, None]],
                        "arrival_delay": [0.0, 1e-4]},
                 verdict={"label": "slow link", "who": "1->0", "text": "slow link 1->0"},
                 setup={"ranks": 2, "hosts": "fp", "compression": ["none"], "labels": {}, "algorithms": []})  # fmt: skip
    return d


def request(url, data=None, token=None):
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def server():
    state = MonitorState()
    s = serve.serve(monitor_server.make_app(state, token="s3cret"), "127.0.0.1", 0)
    yield s, state
    s.close()


def test_the_publisher_posts_on_one_connection_with_its_token(server):
    """LiveMonitor's publisher: its snapshots on one kept-alive connection (the server's answer
    read back whole each time), the token in its header; a wrong token is an HTTP 401 it warns
    about once, and the job would go on."""
    s, state = server
    good = live.Publisher(s.url, token="s3cret")
    good.put(snapshot_doc(0))
    good.put(snapshot_doc(1))
    good.put(snapshot_doc(1))
    time.sleep(0.5)
    sock = good._conn.sock
    good.put(snapshot_doc(0))
    time.sleep(0.5)
    assert sock is not None and good._conn.sock is sock  # the fourth went on the same connection
    good.close()
    assert (good.sent, good.failed) == (4, 0)
    assert (
        state.snapshot()["ranks"]["0"]["publishes"] == 2 and state.snapshot()["ranks"]["1"]["publishes"] == 2
    )
    step = {
        "step_s": 0.02,
        "communication": 0.005,
        "compute": None,
        "exposed_communication": None,
        "overlap": None,
    }
    for n in range(1, 4):  # /metrics reads each rank's last step
        doc = dict(snapshot_doc(1), steps=[dict(step, step=i, step_s=0.01 * i) for i in range(n * 3)])
        assert request(f"{s.url}/publish", doc, token="s3cret")[0] == 200
    text = request(f"{s.url}/metrics", token="s3cret")[1]
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    rank1 = {x.labels["part"]: x.value for x in fams["zcoll_step_seconds"].samples if x.labels["rank"] == "1"}
    assert rank1 == {"step": pytest.approx(0.08), "communication": pytest.approx(0.005)}
    bad = live.Publisher(s.url, token="wrong")
    with pytest.warns(UserWarning, match="HTTP 401"):
        bad.put(snapshot_doc(0))
        bad.close()
    assert (bad.sent, bad.failed) == (0, 1)


def test_routes_publish_metrics_and_token(server):
    s, _ = server
    assert request(f"{s.url}/api/state")[0] == 401  # no token
    assert request(f"{s.url}/publish", snapshot_doc(0), token="wrong")[0] == 401
    assert request(f"{s.url}/publish", snapshot_doc(0), token="s3cret") == (200, "ok\n")
    assert request(f"{s.url}/publish", snapshot_doc(1), token="s3cret")[0] == 200
    code, text = request(f"{s.url}/publish", {"format": "nope"}, token="s3cret")
    assert code == 400 and "not a rank's snapshot" in text
    code, text = request(f"{s.url}/metrics", token="s3cret")
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    calls = {s.labels["rank"]: s.value for s in fams["zcoll_collective_calls"].samples}
    assert calls == {"0": 3.0, "1": 3.0}
    assert fams["zcoll_verdict"].samples[0].labels["who"] == "1->0"
    code, page = request(f"{s.url}/?token=s3cret")
    assert code == 200 and 'src="static/plotly.js"' in page and "cdn" not in page.lower()
    code, js = request(f"{s.url}/static/plotly.js", token="s3cret")
    assert code == 200 and len(js) > 1_000_000  # the whole library, served locally
    assert json.loads(request(f"{s.url}/api/state", token="s3cret")[1])["verdict"]["who"] == "1->0"


def test_server_push_sends_each_change(server):
    s, state = server
    req = urllib.request.Request(f"{s.url}/events", headers={"Authorization": "Bearer s3cret"})
    with urllib.request.urlopen(req, timeout=10) as stream:
        first = json.loads(stream.readline().decode()[len("data: ") :])
        stream.readline()
        state.publish(snapshot_doc(0, run="pushed"))
        second = json.loads(stream.readline().decode()[len("data: ") :])
    assert first["run"] is None and second["run"] == "pushed" and second["version"] > first["version"]


def test_a_locked_history_file_does_not_stall_the_page(tmp_path):
    """Another process holds the history file's write lock (SQLite then waits up to 5 s per
    write): publishing, the state and the event stream still answer at once, and the writes land
    once the lock is gone."""
    h = hist.History(tmp_path / "h.sqlite")
    state = MonitorState(h)
    s = serve.serve(monitor_server.make_app(state, history=h), "127.0.0.1", 0)
    holder = sqlite3.connect(str(tmp_path / "h.sqlite"), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # released below, after the page was served
    try:
        req = urllib.request.Request(f"{s.url}/events")
        with urllib.request.urlopen(req, timeout=10) as stream:
            json.loads(stream.readline().decode()[len("data: ") :])
            stream.readline()
            t0 = time.monotonic()
            for doc in (snapshot_doc(0, run="locked", event="start"), snapshot_doc(1, run="locked", event="start"),
                        snapshot_doc(0, run="locked", event="end"), snapshot_doc(1, run="locked", event="end")):  # fmt: skip
                assert request(f"{s.url}/publish", doc) == (200, "ok\n")
            pushed = json.loads(stream.readline().decode()[len("data: ") :])
            code, body = request(f"{s.url}/api/state")
            took = time.monotonic() - t0
        assert pushed["run"] == "locked" and code == 200 and json.loads(body)["run"] == "locked"
        assert took < 2.0, f"4 publishes, a push and the state took {took:.2f} s behind a locked history"
    finally:
        holder.rollback()
        holder.close()
    assert state.flush(60.0) and state.history_error is None, state.history_error
    run = h.run("locked")
    assert run is not None and run["status"] == "finished" and run["ranks"] == 2, run
    s.close()


def test_help():
    for command, words in (("monitor", "--public"), ("history", "compare")):
        rc, out = run([*ZCOLL, command, "--help"], timeout=60)
        assert rc == 0 and words in out, out


def test_port_in_use_and_off_loopback(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        rc, out = zcoll(capsys, "monitor", "--port", port, "--no-history")
    assert rc == 2 and f"port {port} on 127.0.0.1 is in use" in out, out
    rc, out = zcoll(capsys, "monitor", "--host", "0.0.0.0", "--no-history")
    assert rc == 2 and "refusing to listen on 0.0.0.0" in out, out
    rc, out = zcoll(capsys, "monitor", "--host", "0.0.0.0", "--public", "--no-history")
    assert rc == 2 and "needs a token" in out, out


def test_corrupt_history_and_a_finished_run(tmp_path, capsys):
    bad = tmp_path / "h.sqlite"
    bad.write_bytes(b"garbage" * 1000)
    rc, out = run([*ZCOLL, "monitor", "--port", "0", "--history", str(bad), "--duration", "1"], timeout=60)
    assert (
        rc == 0
        and "move it aside" in out
        and "going on without a history" in out
        and "http://127.0.0.1:" in out
    )
    rc, out = zcoll(capsys, "monitor", tmp_path, "--port", "0", "--duration", "1")  # refused before serving
    assert rc == 2 and "no step traces" in out, out


def test_history_command(tmp_path, capsys):
    path = tmp_path / "h.sqlite"
    h = hist.History(path)
    for name, t, method, step in (("20260101-a", 100.0, "none", 0.050), ("20260101-b", 200.0, "int8", 0.030)):
        h.start_run(name, {"ranks": 2, "hosts": "fp", "compression": [method], "labels": {"model": "m"}}, t=t)
        h.update(name, {"step_s": step, "exposed_s": step / 2, "verdict": "healthy"}, t=t)
        h.finish(name, t=t + 1)
    h.close()
    rc, out = zcoll(capsys, "history", "--history", path)
    assert rc == 0 and out.index("20260101-b") < out.index("20260101-a") and "50.0" in out, out
    rc, out = zcoll(capsys, "history", "show", "20260101-b", "--history", path)
    assert rc == 0 and "int8 saved 40% of the step on this model" in out, out
    rc, out = zcoll(capsys, "history", "compare", "20260101-a", "20260101-b", "--history", path)
    assert rc == 0 and "(0.60x)" in out, out
    rc, out = zcoll(capsys, "history", "show", "2026", "--history", path)
    assert rc == 2 and "no single run matches 2026" in out, out


def test_history_command_on_a_corrupt_file(tmp_path, capsys):
    bad = tmp_path / "h.sqlite"
    bad.write_bytes(b"garbage" * 1000)
    rc, out = zcoll(capsys, "history", "--history", bad)
    assert rc == 2 and f"the history file {bad} cannot be used" in out and "move it aside" in out, out
