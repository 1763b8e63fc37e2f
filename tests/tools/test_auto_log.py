"""zcoll.tools.auto_log: compression="auto"'s prediction errors read from its metrics log, per
block of check intervals with the same decisions, and the measurement's own repeatability."""

import json

import pytest
from zcoll.tools import auto_log


def measured_log() -> list:
    """A decision, ten 10-step intervals predicted at 10 (the trials' model 8) and measured at 11,
    three measured at 20 in a block an escalation cuts short, then five at 9 without the trials'
    prediction."""
    rows = [dict(event="decision", step=45)]
    rows += [dict(event="measured", measured_s=11.0, predicted_s=10.0, trial_predicted_s=8.0)] * 10
    rows += [dict(event="measured", measured_s=20.0, predicted_s=10.0, trial_predicted_s=8.0)] * 3
    rows += [dict(event="escalate")]
    rows += [dict(event="measured", measured_s=9.0, predicted_s=10.0)] * 5  # before trial_predicted_s
    return rows


def test_blocks_of_intervals_with_the_same_decisions():
    """Blocks of five intervals: a decision ends a block, an incomplete block is left out, the
    trials' model only where every interval has its prediction."""
    rows = measured_log()
    assert [len(c) for c in auto_log.chains(rows)] == [13, 5]
    learned, trial = auto_log.block_errors(rows, 5)
    assert learned == pytest.approx([0.1, 0.1, 0.1]) and trial == pytest.approx([0.375, 0.375])
    assert auto_log.median_percent(learned) == pytest.approx(10.0)
    assert auto_log.median_percent(trial) == pytest.approx(37.5) and auto_log.median_percent([]) is None


def test_interval_noise_within_runs_only():
    """The measurement's change from one interval to the next of a run: 11 -> 11 is 0, 11 -> 20
    is 82%, 9 -> 9 is 0; the jump across the escalation is not counted."""
    changes = [0.0] * 9 + [9 / 11] + [0.0] * 2 + [0.0] * 4
    median = sorted(changes)[len(changes) // 2]
    assert auto_log.interval_noise(measured_log(), "measured_s") == pytest.approx(median)
    assert auto_log.interval_noise([dict(event="measured", measured_s=1.0)], "measured_s") is None


def test_read_every_log_of_a_directory(tmp_path):
    rows = measured_log()
    (tmp_path / "zcoll-guard-auto-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]) + "\n")
    (tmp_path / "zcoll-guard-auto-2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[5:]))
    (tmp_path / "zcoll-guard-sign-1.jsonl").write_text(json.dumps(dict(event="guard_cost")) + "\n")
    assert auto_log.read(tmp_path) == rows
    assert auto_log.read(tmp_path, "zcoll-guard-sign-*.jsonl") == [dict(event="guard_cost")]
