"""zcoll.tune.drift: each check interval's measured communication against its prediction, and
new trials only when another method would win."""

from __future__ import annotations

import pytest
import zcoll
from cost_models import MIB, model


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
