"""How well ``compression="auto"`` predicted its communication, read from its metrics log.

The log (JSON lines, zcoll.observe.guard_metrics.MetricsLog; zcoll.tune.drift writes the
``measured`` events) holds per check interval the measured communication and what was predicted
for it: from what the checks before it measured (``predicted_s``) and from the trials' model
alone (``trial_predicted_s``). Here:

1. ``read(directory)``: the events of every ``zcoll-guard-auto-*.jsonl`` in a directory;
2. ``chains(rows)``: the ``measured`` events in runs with the same decisions (a decision,
   re-decision, escalation or relaxation ends a run);
3. ``block_errors(rows, size)``: |measured - predicted| / predicted summed over consecutive
   blocks of `size` intervals of one run (an incomplete block left out), for the logged
   predictions and for the trials' model alone: an error over the span a user compares;
4. ``interval_noise(rows, value)``: the median change of the measurement itself from one interval
   to the next of a run, the floor under any prediction's error;
5. ``median_percent(values)``: the median of relative errors, in percent.

bench/ddp_step.py judges its zcoll-auto targets with these.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import List, Optional, Tuple

CHANGES = ("decision", "redecide", "escalate", "relax")  # events after which the decisions differ


def read(directory: Path, pattern: str = "zcoll-guard-auto-*.jsonl") -> List[dict]:
    """Every event of the logs matching `pattern` in `directory`, file by file, in order."""
    return [
        json.loads(line)
        for p in sorted(Path(directory).glob(pattern))
        for line in p.read_text().splitlines()
        if line.strip()
    ]


def chains(rows: List[dict]) -> List[List[dict]]:
    """A log's `measured` events in runs with the same decisions (a decision, re-decision,
    escalation or relaxation between two ends a run)."""
    found: List[List[dict]] = [[]]
    for r in rows:
        if r["event"] in CHANGES:
            found.append([])
        elif r["event"] == "measured":
            found[-1].append(r)
    return [c for c in found if c]


def block_errors(rows: List[dict], size: int) -> Tuple[List[float], List[float]]:
    """|measured - predicted| / predicted summed over consecutive blocks of `size` check
    intervals with the same decisions, for the predictions logged (after a block's first
    interval they learned from the intervals before it) and for the trials' model alone (blocks
    whose every interval has its prediction)."""
    learned, trial = [], []
    for chain in chains(rows):
        for i in range(0, len(chain) - size + 1, size):
            block = chain[i : i + size]
            got, want = sum(r["measured_s"] for r in block), sum(r["predicted_s"] for r in block)
            learned.append(abs(got - want) / want)
            if all(r.get("trial_predicted_s") for r in block):
                alone = sum(r["trial_predicted_s"] for r in block)
                trial.append(abs(got - alone) / alone)
    return learned, trial


def interval_noise(rows: List[dict], value: str) -> Optional[float]:
    """The median relative change of `value` (a measured figure) from one check interval to the
    next with the same decisions: how well the measurement itself repeats; None without a pair."""
    changes = [
        abs(b[value] - a[value]) / a[value]
        for chain in chains(rows)
        for a, b in zip(chain, chain[1:])
        if value in a and value in b and a[value]
    ]
    return statistics.median(changes) if changes else None


def median_percent(values: List[float]) -> Optional[float]:
    """The median of relative errors, in percent (the upper one of an even count); None if none."""
    return 100 * sorted(values)[len(values) // 2] if values else None
