"""compression="auto": the per-bucket cost model and decision on synthetic costs (no MPI), the
metrics log and Prometheus text, the refusals; the multi-rank behaviour (identical decisions,
escalation on a corrupting codec, the metrics a run writes, recommend) in
tests/torch_mpi/auto_compression.py, and without DDP (comm.allreduce) in tests/mpi/auto_calls.py."""

from __future__ import annotations

import json
import math
import socket
import sys
import time
import urllib.request

import numpy as np
import pytest
import zcoll
from mpi_util import case_names, run, script_job
from zcoll.tune import compression_model as cm
from zcoll.tune.auto_compression import resolve
from zcoll.observe.guard_metrics import MetricsLog
from zcoll.observe.step_model import LinkModel

MIB = 1 << 20


def codecs(encode_gbs: float = 4.0):
    """Synthetic kernel rates: every codec encodes and decodes at encode_gbs GB/s."""
    rate = 1.0 / (encode_gbs * 1e9)
    out = {}
    for m, payload in (
        ("bf16", 0.5),
        ("int8", 0.2578),
        ("int4", 0.1328),
        ("sign", 0.0352),
        ("top10%", 0.2),
        ("top1%", 0.02),
    ):
        out[m] = {
            "encode_s_per_byte": rate,
            "decode_s_per_byte": rate,
            "payload_ratio": payload,
            "exchange": "allgather" if m.startswith("top") else "ring",
        }
    return out


def model(
    gbps: float, alpha: float = 50e-6, compressed_alpha: float = 150e-6, ranks: int = 2
) -> cm.CostModel:
    link = LinkModel(alpha, 8.0 / (gbps * 1e9), 2.0 * (ranks - 1) / ranks, "none", codecs(), ranks)
    return cm.CostModel(link, {m: compressed_alpha for m in codecs()} | {"none": alpha})


def test_fast_link_stays_uncompressed():
    # shared memory, ~80 Gbit/s: the kernels cost more than the bytes they save
    d = cm.decide(model(80.0), [("b0", MIB, 0.0), ("b1", 25 * MIB, 0.0)])
    assert [x.method for x in d] == ["none", "none"], cm.render(d)


def test_slow_link_compresses_large_buckets_only():
    # 1 Gbit/s: a 25 MiB bucket takes ~0.2 s uncompressed; a 4 KiB one is all per-call cost
    d = cm.decide(model(1.0), [("small", 4096, 0.0), ("large", 25 * MIB, 0.0)])
    assert d[0].method == "none", cm.render(d)
    assert d[1].method not in ("none", "bf16"), cm.render(d)
    assert d[1].predicted_s < 0.5 * d[1].predicted_none_s
    # the least lossy within the margin of the fastest
    fastest = min(d[1].predicted.values())
    assert d[1].predicted_s <= fastest * 1.05
    for m in cm.LOSSINESS[: cm.LOSSINESS.index(d[1].method)]:
        assert d[1].predicted[m] > fastest * 1.05


def test_margin_prefers_less_lossy():
    d = cm.decide(model(1.0), [("large", 25 * MIB, 0.0)], margin=10.0)
    assert d[0].method == "bf16"  # int8 and beyond are faster, but within 10x bf16 is enough


def test_overlap_hides_a_bucket():
    # bucket 0 is handed over 1 s before the last: its uncompressed time (~0.2 s) is hidden
    buckets = [("early", 25 * MIB, 0.0), ("late", 25 * MIB, 1.0)]
    d = cm.decide(model(1.0), buckets)
    assert d[0].method == "none" and "overlap" in d[0].reason, cm.render(d)
    assert d[1].method not in ("none", "bf16")


def test_deterministic_and_methods_respected():
    b = [("a", 3 * MIB, 0.0), ("b", 25 * MIB, 0.01), ("c", 100, 0.02)]
    one = [x.as_dict() for x in cm.decide(model(1.0), b)]
    two = [x.as_dict() for x in cm.decide(model(1.0), b)]
    assert one == two
    only = cm.decide(model(80.0), b, methods=("int8",))
    assert {x.method for x in only} == {"int8"}  # none is not a candidate unless listed


def test_fit_per_method_and_bucket():
    cal = [
        (256.0, 256.0, 40e-6),
        (float(MIB), float(MIB), 40e-6 + MIB * 1e-9),
        (4.0 * MIB, 4.0 * MIB, 40e-6 + 4 * MIB * 1e-9),
    ]
    physics = cm.fit(cal, codecs(), 2)
    assert physics.link.beta == pytest.approx(1e-9, rel=1e-3)  # least squares over the three sizes
    assert physics.link.alpha == pytest.approx(40e-6 - 256e-9, rel=1e-3)
    assert physics.predict("none", MIB) == pytest.approx(physics.link.alpha + MIB * physics.link.beta)
    # trials: a per-call cost per method plus a per-bucket offset (exactly additive here)
    alpha = {"none": 1e-4, "int8": 3e-4, "top1%": 5e-4}
    offset = {"b0": 2e-3, "b1": 0.0, "b2": 5e-4}
    size = {"b0": MIB, "b1": 4 * MIB, "b2": 2 * MIB}
    trials = {
        m: [(k, size[k], a + offset[k] + physics.transfer(m, size[k])) for k in size]
        for m, a in alpha.items()
    }
    m = cm.fit(cal, codecs(), 2, trials)
    for method, pts in trials.items():
        for k, n, s in pts:
            assert m.predict(method, n, k) == pytest.approx(s, rel=1e-9), (method, k)
    # one wild measurement moves the additive terms little (medians); the model reproduces it as
    # that pair's own term
    before = (dict(m.alpha), dict(m.offset))
    trials["int8"][0] = ("b0", MIB, 1.0)
    m = cm.fit(cal, codecs(), 2, trials)
    for fitted, was in zip((m.alpha, m.offset), before):
        assert all(fitted[k] == pytest.approx(v, abs=2e-4) for k, v in was.items()), (fitted, was)
    assert m.predict("int8", MIB, "b0") == pytest.approx(1.0)
    # a pair not measured (here: a bucket the trials did not see): the additive terms alone
    assert m.predict("int8", MIB, "new") == pytest.approx(physics.transfer("int8", MIB) + m.alpha["int8"])
    # a pair measured faster than its transfer term (a token bucket's burst) is still reproduced;
    # an unmeasured one is never predicted below its kernels plus the smallest allreduce
    fast = {"int8": [("b0", MIB, 0.25 * physics.transfer("int8", MIB))], "none": [("b0", MIB, 1e-5)]}
    m = cm.fit(cal, codecs(), 2, fast)
    assert m.predict("int8", MIB, "b0") == pytest.approx(fast["int8"][0][2], rel=1e-9)
    assert m.predict("none", MIB, "b0") == pytest.approx(1e-5, rel=1e-9)
    floor = physics.link.codec_time("int8", 4 * MIB) + physics.link.alpha
    assert m.predict("int8", 4 * MIB, "new") >= floor
    assert m.predict("none", 4 * MIB, "new") >= physics.link.alpha > 0


def test_finalists_near_the_fastest_and_the_plan():
    screened = {"none": 0.100, "int8": 0.060, "sign": 0.050, "top1%": 0.058, "bf16": 0.080}
    # within a quarter of a 40 ms step of sign's 50 ms: sign, top1% (58), int8 (60); the plan
    # mixes, so it takes a place
    final = cm.finalists(screened, {"b0": "none", "b1": "sign"}, cap=3, step_s=0.040)
    assert [c.name for c in final] == ["sign", "top1%", cm.PLAN]
    assert final[-1].method("b0") == "none" and final[-1].method("b1") == "sign"
    assert final[-1].method("new") == "none"  # a bucket the plan has not seen goes uncompressed
    # a plan that sends everything with a method already in the final adds nothing
    final = cm.finalists(screened, {"b0": "sign", "b1": "sign"}, cap=3, step_s=0.040)
    assert [c.name for c in final] == ["sign", "top1%", "int8"]
    assert [c.name for c in cm.finalists(screened, {}, cap=3, step_s=0.020)] == ["sign"]  # 5 ms: sign alone
    assert cm.finalists({}, {}, cap=4, step_s=0.1) == []


def test_finalists_seat_uncompressed_when_near():
    # a noisy screen on shared memory: everything within a quarter of a 50 ms step, uncompressed
    # fifth; the cap would leave it out, but it takes the last of the methods' seats
    screened = {"top1%": 0.024, "bf16": 0.027, "int4": 0.027, "sign": 0.0275, "none": 0.0315, "int8": 0.033}
    final = cm.finalists(screened, {"b0": "none", "b1": "sign"}, cap=4, step_s=0.050)
    assert [c.name for c in final] == ["top1%", "bf16", "none", cm.PLAN]
    final = cm.finalists(screened, {"b0": "top1%", "b1": "top1%"}, cap=4, step_s=0.050)
    assert [c.name for c in final] == ["top1%", "bf16", "int4", "none"]
    # a plan sending everything uncompressed is the uncompressed candidate
    final = cm.finalists(screened, {"b0": "none", "b1": "none"}, cap=4, step_s=0.050)
    assert [c.name for c in final].count("none") == 1 and cm.PLAN not in [c.name for c in final]
    # far behind (over a slow link) it takes no seat: the fastest near ones do
    screened["none"] = 0.080
    final = cm.finalists(screened, {}, cap=4, step_s=0.050)
    assert [c.name for c in final] == ["top1%", "bf16", "int4", "sign"]
    # with the gain rule (choose) judged inside the final: top-1% must beat uncompressed there
    cands = final[:1] + [cm.Candidate("none")]
    pick, why = cm.choose(cands, {"top1%": 0.0300, "none": 0.0305}, 0.0305, 0.050)
    assert pick.name == "none" and "top1% 30.00, none 30.50" in why  # 0.5 ms is not 5% of 50


def test_choose_fastest_or_least_lossy_within_a_margin_never_slower_than_uncompressed():
    cands = [cm.Candidate(m) for m in ("none", "int8", "sign")]
    # times: medians of the candidates' windows; the scale: a typical step of 100 ms
    # sign fastest, int8 1.5% of a step behind: by default the fastest
    times = {"none": 0.100, "int8": 0.0515, "sign": 0.050}
    pick, why = cm.choose(cands, times, 0.100, 0.100)
    assert pick.name == "sign" and "int8 51.50" in why and why.endswith("the fastest")
    # with a margin of 2% of a step, int8 is within it and less lossy; at 3% behind it is not
    pick, why = cm.choose(cands, times, 0.100, 0.100, margin=0.02)
    assert pick.name == "int8" and "within 2% of a 100.00 ms step" in why
    pick, _ = cm.choose(cands, {"none": 0.100, "int8": 0.053, "sign": 0.050}, 0.100, 0.100, margin=0.02)
    assert pick.name == "sign"
    # equal times: the least lossy
    pick, _ = cm.choose(cands, {"none": 0.100, "int8": 0.050, "sign": 0.050}, 0.100, 0.100)
    assert pick.name == "int8"
    # nothing saving 5% of a step against uncompressed: uncompressed, even when it was not in the final
    pick, why = cm.choose(cands[1:], {"int8": 0.096, "sign": 0.098}, 0.100, 0.100)
    assert pick.name == "none" and "5%" in why
    # ... measured against a step, not against the window: 4 ms of a 50 ms window is 8%, of a
    # 100 ms step 4%
    pick, _ = cm.choose(cands, {"none": 0.050, "sign": 0.046}, 0.050, 0.100)
    assert pick.name == "none"
    # no uncompressed reference (methods without none): the fastest
    pick, _ = cm.choose(cands[1:], {"int8": 0.097, "sign": 0.060}, None, 0.100)
    assert pick.name == "sign"
    # a plan is as lossy as its lossiest method
    plan = cm.Candidate(cm.PLAN, {"b0": "none", "b1": "int4"})
    assert plan.lossiness == cm.LOSSINESS.index("int4") and plan.methods() == ["int4", "none"]
    pick, _ = cm.choose([plan, cands[2]], {cm.PLAN: 0.051, "sign": 0.050}, 0.100, 0.100, margin=0.02)
    assert pick.name == cm.PLAN
    with pytest.raises(ValueError, match="no candidate"):
        cm.choose(cands, {}, None, 0.100)


def test_choose_by_the_calls_where_the_final_does_not_resolve_the_windows():
    """Windows (six rounds) that scatter by more than their gap: the calls decide (all in ms)."""
    cands = [cm.Candidate(m) for m in ("none", "sign", "top1%")]
    windows = {
        "none": [180.0, 175.0, 190.0, 170.0, 185.0, 178.0],
        "sign": [60.0, 45.0, 52.0, 70.0, 41.0, 55.0],
        "top1%": [50.0, 58.0, 43.0, 62.0, 49.0, 47.0],  # 2-4 ms ahead of sign, scattered by 10
    }
    times = cm.paired_medians(windows)
    assert times["top1%"] < times["sign"]
    final = cm.FinalRounds(windows, {"none": 150.0, "sign": 7.4, "top1%": 9.6})
    d, resolution = final.gap("sign", "top1%")
    assert 0 < d < resolution and not final.resolved_slower("sign", "top1%")
    assert final.resolved_slower("none", "sign") and final.resolved_slower("none", "top1%")
    pick, why = cm.choose(cands, times, times["none"], 100.0, final=final)
    assert pick.name == "sign", why
    assert "do not resolve sign +" in why and "against top1%" in why and "the least calls" in why
    # the same calls, windows that resolve top-1%'s lead (every round 8-10 ms ahead): the windows decide
    steady = dict(windows, **{"top1%": [w - 9.0 + (r % 2) for r, w in enumerate(windows["sign"])]})
    steady_final = cm.FinalRounds(steady, final.calls)
    pick, why = cm.choose(cands, cm.paired_medians(steady), 180.0, 100.0, final=steady_final)
    assert pick.name == "top1%" and why.endswith("ahead beyond the final's resolution")
    # without the final's rounds (the screen decided): the fastest median
    pick, _ = cm.choose(cands, times, times["none"], 100.0)
    assert pick.name == "top1%"
    # fewer than three rounds resolve nothing
    assert cm.FinalRounds({"a": [1.0, 2.0], "b": [3.0, 4.0]}).gap("a", "b") == (0.0, math.inf)


def test_choose_compresses_only_on_a_gain_the_final_resolves():
    """Uncompressed and sign in the same rounds (shared memory): sign's median is 6% of a step
    ahead, but one round in three has it behind: not resolved, so uncompressed."""
    cands = [cm.Candidate("none"), cm.Candidate("sign")]
    windows = {"none": [40.0, 42.0, 41.0, 40.0, 43.0, 41.0], "sign": [30.0, 52.0, 33.0, 50.0, 34.0, 36.0]}
    times = cm.paired_medians(windows)
    assert times["sign"] <= times["none"] - 0.05 * 100.0
    final = cm.FinalRounds(windows, {"none": 10.0, "sign": 5.0})
    pick, why = cm.choose(cands, times, times["none"], 100.0, final=final)
    assert pick.name == "none" and "beyond the final's resolution" in why
    # steadily 8 ahead: resolved, compressed
    steady = dict(windows, sign=[w - 8.0 for w in windows["none"]])
    steady_final = cm.FinalRounds(steady, final.calls)
    pick, _ = cm.choose(cands, cm.paired_medians(steady), 41.0, 100.0, final=steady_final)
    assert pick.name == "sign"
    # uncompressed not in the final (far behind over a slow link): the screen's median, as before
    alone = cm.FinalRounds({"sign": windows["sign"]})
    pick, _ = cm.choose(cands[1:], {"sign": 36.0}, 80.0, 100.0, final=alone)
    assert pick.name == "sign"


def test_paired_medians_cancel_what_slows_a_round():
    # b is 1 ms faster than a but for one round; rounds 2 and 3 were slowed as a whole (a
    # neighbour's burst), round 4 only b's step: plain medians (a 10, b 29) would pick a
    rounds = {"a": [10.0, 30.0, 30.0, 10.0, 10.0], "b": [9.0, 29.0, 29.0, 29.0, 9.0]}
    assert np.median(rounds["a"]) < np.median(rounds["b"])
    got = cm.paired_medians(rounds)
    assert got["a"] - got["b"] == pytest.approx(1.0)
    # rounds a candidate lacks are left out; a candidate not measured is absent
    got = cm.paired_medians({"a": [10.0, 12.0, 99.0], "b": [11.0, 13.0], "c": []})
    assert set(got) == {"a", "b"} and got["b"] - got["a"] == pytest.approx(1.0)
    assert cm.paired_medians({}) == {} and cm.paired_medians({"a": []}) == {}


def test_exposed():
    assert cm.exposed([1.0, 1.0], [0.0, 5.0]) == 1.0  # the first is hidden
    assert cm.exposed([3.0, 1.0], [0.0, 1.0]) == 3.0  # the second waits for the first
    assert cm.exposed([], []) == 0.0


def test_resolve_and_refusals():
    assert isinstance(resolve("auto"), zcoll.AutoCompression)
    with pytest.raises(ValueError, match="'auto'"):
        resolve("int8")
    with pytest.raises(ValueError, match="unknown methods"):
        zcoll.AutoCompression(methods=("int3",))
    with pytest.raises(ValueError, match="_test_corrupt_fraction"):
        zcoll.AutoCompression(_test_corrupt_fraction=2.0)
    c = zcoll.Communicator()
    with pytest.raises(TypeError, match="'int8'"):
        c.allreduce(np.ones(4, np.float32), op="avg", compression="int8", key="k")
    for what in ("auto", zcoll.AutoCompression()):  # without DDP: its own cases in tests/mpi/auto_calls.py
        with pytest.raises(ValueError, match="key="):
            c.allreduce(np.ones(4, np.float32), op="avg", compression=what)
    assert isinstance(c.auto_compression, zcoll.AutoCompression)


def test_driven_without_the_hook_through_every_method():
    """AutoCompression.allreduce called directly (the hook is one caller, not a precondition):
    every method's compressor exists by the time a bucket's residual moves to it (a switch from
    one compressed method to the next, bf16 -> int8 in the screen, once failed with a KeyError
    when nothing else had asked for the next compressor), the trials end in a decision, and a
    decided bucket still averages (one rank: the average is the input). Every method enters the
    final (screen_band): on one rank the screen's windows are tens of microseconds apart, and
    which come within the default band of the fastest is noise."""
    auto = zcoll.AutoCompression(check_every=2, screen_band=math.inf)
    rng = np.random.default_rng(5)
    bufs = {
        "b0": rng.standard_normal(6007).astype(np.float32),
        "b1": rng.standard_normal(97).astype(np.float32),
    }
    with zcoll.Communicator() as comm:
        step = 0
        while auto.decided_step is None:
            assert step < auto.trials.first + 100, "the trials never ended"
            for i, (key, b) in enumerate(bufs.items()):
                auto.allreduce(comm, b, key, step, i == len(bufs) - 1, time.perf_counter())
            step += 1
        assert set(auto.calls_by_method) >= set(auto.config.methods)  # every method ran in the screen
        for _ in range(4):  # decided, with the drift checks of check_every=2
            for i, key in enumerate(bufs):
                x = rng.standard_normal(bufs[key].size).astype(np.float32)
                old, carried = auto.residuals.method_of.get(key, "none"), auto.residual(key)
                method = auto.method(key, step, x.nbytes)
                # going dense sends what the last compressed method still owed
                want = x + carried if method == "none" and old != "none" and carried is not None else x.copy()
                out = np.asarray(auto.allreduce(comm, x, key, step, i == len(bufs) - 1, time.perf_counter()))
                if method == "none":
                    np.testing.assert_array_equal(out, want)
                assert out.shape == want.shape and np.isfinite(out).all()
            step += 1
    assert set(auto.decisions) == set(bufs)
    # the final's evidence is logged: its windows round by round, and per candidate the sum over
    # buckets of each bucket's typical trial call (what decides where the windows do not resolve)
    decided = [e for e in auto.events if e["event"] == "decision"]
    rounds, calls = decided[0]["final_rounds_s"], decided[0]["final_calls_s"]
    assert set(rounds) == set(calls) and len(calls) >= 2
    assert all(len(w) == auto.config.final_rounds for w in rounds.values())
    for name in set(calls) - {cm.PLAN}:
        assert calls[name] == pytest.approx(sum(e["measured_trial"][name] for e in decided))
    # the drift check ran on the decided calls, whichever path they took (check_every=2)
    measured = [e for e in auto.events if e["event"] == "measured"]
    assert len(measured) == 2 and all(e["measured_s"] > 0 and e["predicted_s"] > 0 for e in measured)
    # resumed from a checkpoint: decided, but sizes and model unknown until each bucket's first
    # call (the uncompressed path once skipped that call's bookkeeping: KeyError at the check)
    resumed = zcoll.AutoCompression(check_every=2)
    resumed.load_state_dict(auto.state_dict())
    with zcoll.Communicator() as comm:
        for _ in range(4):
            for i, key in enumerate(bufs):
                x = rng.standard_normal(bufs[key].size).astype(np.float32)
                resumed.allreduce(comm, x, key, step, i == len(bufs) - 1, time.perf_counter())
            step += 1
    assert len([e for e in resumed.events if e["event"] == "measured"]) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_log_and_prometheus(tmp_path):
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
    assert "# TYPE zcoll_compression_escalations_total counter" in text
    assert 'zcoll_compression_escalations_total{bucket="ddp/bucket0/10"} 2.0' in text
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert rows[0]["event"] == "bucket" and rows[0]["step"] == 3 and rows[0]["ratio"] == 3.9


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


@pytest.mark.parametrize("case", case_names("torch_mpi/auto_compression.py"))
def test_auto_compression_two_ranks(case):
    script_job("torch_mpi/auto_compression.py", 2).check(case)


@pytest.mark.parametrize("case", case_names("mpi/auto_calls.py"))
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_auto_compression_without_ddp(nprocs, case):
    """comm.allreduce(x, op="avg", compression="auto", key=k) in a loop of steps (tests/mpi/auto_calls.py)."""
    script_job("mpi/auto_calls.py", nprocs, timeout=300).check(case)


ON_FOUR = ["decisions_identical_on_every_rank", "corrupting_codec_escalates_within_one_interval"]


@pytest.mark.parametrize("case", ON_FOUR)
def test_auto_compression_four_ranks(case):
    script_job("torch_mpi/auto_compression.py", 4, *ON_FOUR, timeout=400).check(case)


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
        "screen",
        step=1,
        window_s={"none": 3.5e-3, "int8": 1.5e-3},
        typical_step_s=0.01,
        plan={"ddp/bucket0/10": "int8"},
        finalists=[],
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
        "int8: 1.00 / 1.10 (none 3.10)",
        "median |error| 10.0%",
        "typical calls (each bucket's median call times its calls): median |error| 3.0%",
        "the trials' model alone (no interval learned from): median |error| 37.5%",
        "screen at step 1 (median windows, ms; a step 10.00): int8 1.50, none 3.50; final: -",
        "exact checks, int8: 1, worst relative error 0.5",
        "escalate  ddp/bucket0/10 int8 -> bf16",
        "3.9x",
        "ddp/bucket0/10               predicted vs measured: median |error| 20.0%",
    ):
        assert want in out, f"{want!r} not in:\n{out}"


def test_guard_overhead_bench_runs():
    """bench/guard_overhead.py in short: both models train in A B B A blocks and it prints the
    overhead and the guard's own time (the figures are measurements, not judged here); with
    --compare auto-none, plain zcoll against auto decided uncompressed."""
    from mpi_util import ROOT, python_mpirun

    bench = ROOT / "bench" / "guard_overhead.py"
    rc, out = run([sys.executable, str(bench), "--help"], timeout=60)
    assert rc == 0 and "A B B A" in out, out
    rc, out = python_mpirun(2, bench, "--blocks", "2", "--block", "3", "--model", "cnn", timeout=300)
    assert rc == 0, out
    assert (
        "cnn, sign, 2 ranks, 4 + 4 timed steps" in out and "overhead" in out and "the guard's own time" in out
    ), out
    rc, out = python_mpirun(
        2, bench, "--compare", "auto-none", "--blocks", "2", "--block", "3", "--model", "cnn", timeout=300
    )
    assert rc == 0, out
    assert (
        "cnn, 2 ranks, 4 + 4 timed steps" in out and "plain zcoll" in out and "auto (decided none)" in out
    ), out
    assert "auto decided at step 4" in out and "the guard's own time" not in out, out


def test_auto_calls_bench_runs():
    """bench/auto_calls.py in short: a manual loop per configuration, auto decided within its
    warm-up, the table printed (the figures are measurements, not judged here)."""
    from mpi_util import ROOT, python_mpirun

    bench = ROOT / "bench" / "auto_calls.py"
    rc, out = run([sys.executable, str(bench), "--help"], timeout=60)
    assert rc == 0 and "Horovod-style" in out, out
    args = (
        "--model",
        "cnn",
        "--configs",
        "none,sign,auto",
        "--warmup",
        "50",
        "--rounds",
        "2",
        "--block",
        "3",
    )
    rc, out = python_mpirun(2, bench, *args, timeout=300)
    assert rc == 0, out
    assert "cnn, 2 ranks, 4 timed steps each" in out and "| auto |" in out and "| sign |" in out, out
    assert "auto decided at step 4" in out, out


def test_drift_re_decides_only_when_another_method_would_win():
    """A bucket on sign measured at twice its prediction still beats int8 and none over a
    1 Gbit/s link: no new trials; measured at 20x, int8 would win: re-decide."""
    auto = zcoll.AutoCompression(methods=("none", "int8", "sign"))
    auto.model, auto.allowed = model(1.0), ["none", "int8", "sign"]
    path, nbytes = {"b": ["sign"]}, {"b": 25 * MIB}
    p = auto.model.predict("sign", 25 * MIB, "b")
    assert not auto.drift.another_would_win({"b": 2 * p}, auto.model, nbytes, path, auto.allowed)  # twice as slow
    assert auto.drift.another_would_win({"b": 20 * p}, auto.model, nbytes, path, auto.allowed)
    assert auto.model.predict("int8", 25 * MIB, "b") < 20 * p


def test_later_intervals_predicted_from_what_the_checks_measured():
    """The first interval after the decision is predicted by the trials' model; the next by the
    calls the first measured: their mean predicts the sum, their median the typical calls; the
    trials' model's prediction is logged beside it."""
    auto = zcoll.AutoCompression(methods=("none", "sign"))
    auto.model, auto.allowed = model(1.0), ["none", "sign"]
    path, nbytes = {"a": ["none"], "b": ["sign"]}, {"a": MIB, "b": 25 * MIB}
    trial = {k: auto.model.predict(m, nbytes[k], k) for k, m in (("a", "none"), ("b", "sign"))}
    slow = trial["b"] + 0.1  # one call of b stretched by 100 ms
    first = [("a", "none", 2 * trial["a"])] * 10 + [("b", "sign", trial["b"])] * 9 + [("b", "sign", slow)]
    assert auto.drift.judge(9, first, auto.model, nbytes, path, auto.allowed) is None
    assert auto.drift.judge(19, first, auto.model, nbytes, path, auto.allowed) is None
    one, two = [e for e in auto.events if e["event"] == "measured"]
    measured = 20 * trial["a"] + 10 * trial["b"] + 0.1
    assert one["measured_s"] == pytest.approx(measured) and two["measured_s"] == pytest.approx(measured)
    assert one["predicted_s"] == pytest.approx(10 * trial["a"] + 10 * trial["b"])
    assert one["trial_predicted_s"] == one["predicted_s"] == one["predicted_typical_s"]
    assert two["trial_predicted_s"] == one["predicted_s"]
    # learned: a at twice its trial time; b's mean carries the stretched call, its median not
    assert two["predicted_s"] == pytest.approx(measured) and two["relative"] == pytest.approx(0.0)
    assert two["predicted_typical_s"] == pytest.approx(20 * trial["a"] + 10 * trial["b"])
    assert two["typical_s"] == pytest.approx(two["predicted_typical_s"])
    assert two["typical_relative"] == pytest.approx(0.0)
    assert two["trial_relative"] == pytest.approx((measured - one["predicted_s"]) / one["predicted_s"])
    assert two["per_bucket"]["a"] == pytest.approx([20 * trial["a"], 20 * trial["a"]])
    assert auto.drift.learned[("b", "sign")][-1] == slow and len(auto.drift.learned[("b", "sign")]) == 20
