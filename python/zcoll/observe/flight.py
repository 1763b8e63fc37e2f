"""Reading flight-recorder dumps (csrc/comm/dump.h): where did the ranks diverge?

Every rank's communicator keeps its last collectives in a ring buffer and writes them as
``zcoll-flight-<comm>-rank<R>.json`` when a call fails, on SIGUSR1 and on ``zcoll.dump()``.
:func:`report` lines the ranks' dumps up, per communicator, in the manner of torch's
flight-recorder analyzer:

1. each rank's frontier: the last call it entered and its state (posted, in_progress, done,
   failed), and whom it was waiting for;
2. the ranks grouped by frontier ("ranks 0-2 are in allreduce #5312 (in_progress, waiting for
   rank 3); rank 3 is in broadcast #5311 (done)");
3. the first sequence number at which two ranks made different calls (collective, size, dtype,
   op, root or algorithm), which is a bug in the program rather than a slow rank;
4. the ranks that left no dump (stopped or dead: a stopped process cannot write one).

    zcoll report /tmp/zcoll-dumps          # the command line
    print(zcoll.flight.report(["/tmp/zcoll-dumps"]))
"""

from __future__ import annotations

import glob
import json
import os
from typing import Dict, Iterable, List, Sequence, Tuple

FORMAT = "zcoll-flight-recorder"
PATTERN = "zcoll-flight-*.json"
_CALL_FIELDS = ("collective", "count", "dtype", "op", "root", "algorithm")


def find_dumps(paths: Iterable[str]) -> List[str]:
    """The dump files among `paths` (files, or directories searched for zcoll-flight-*.json)."""
    found: List[str] = []
    for path in paths:
        if os.path.isdir(path):
            found.extend(sorted(glob.glob(os.path.join(path, PATTERN))))
        elif os.path.basename(path).startswith("zcoll-flight-") and path.endswith(".json"):
            found.append(path)
    return found


def is_flight_dump(path: str) -> bool:
    """True when `path` is a dump file or a directory holding one (for `zcoll report`)."""
    return bool(find_dumps([path]))


def load(paths: Iterable[str]) -> List[dict]:
    """The dumps found under `paths`, parsed (files of another format are skipped)."""
    dumps = []
    for path in find_dumps(paths):
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if d.get("format") == FORMAT:
            d["path"] = path
            dumps.append(d)
    return dumps


def ranks_text(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'; [3] -> 'rank 3'."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def _describe(call: dict) -> str:
    size = f"{call['bytes']} bytes {call['dtype']}" if call["collective"] != "barrier" else ""
    extra = [x for x in (call.get("algorithm"), call.get("op")) if x]
    if call.get("root", -1) >= 0:
        extra.append(f"root {call['root']}")
    detail = ", ".join([s for s in [size] + extra if s])
    return f"{call['collective']} #{call['seq']}" + (f" ({detail})" if detail else "")


def _frontier_text(call: dict) -> str:
    return f"in {call['collective']} #{call['seq']} ({call['state']})"


def _wait_chain_ends(frontiers: Dict[int, dict], last: int) -> List[int]:
    """Following 'rank a waits for rank b' from every waiting rank: the ranks the chains end at
    (no dump, behind the last call, or done with it), the ones holding the others up."""
    def waiting(rank: int) -> bool:
        call = frontiers.get(rank)
        return (call is not None and call["seq"] == last and call["state"] in ("posted", "in_progress")
                and call.get("waiting_for", -1) >= 0)

    ends = set()
    for start in frontiers:
        rank, seen = start, set()
        while waiting(rank) and rank not in seen:
            seen.add(rank)
            rank = frontiers[rank]["waiting_for"]
        if seen and rank not in seen:  # the chain left the waiting ranks (not a cycle)
            ends.add(rank)
    return sorted(ends)


def _first_mismatch(calls: Dict[int, Dict[int, dict]]) -> Tuple[int, str]:
    """(seq, text) of the first call that two ranks made differently; (0, '') when none."""
    common = sorted(set.intersection(*(set(c) for c in calls.values()))) if calls else []
    for seq in common:
        groups: Dict[tuple, List[int]] = {}
        for rank, by_seq in calls.items():
            call = by_seq[seq]
            groups.setdefault(tuple(call.get(k) for k in _CALL_FIELDS), []).append(rank)
        if len(groups) > 1:
            parts = [f"{ranks_text(r)} called {_describe(calls[r[0]][seq])}" for r in groups.values()]
            return seq, f"the ranks made different calls at #{seq}: " + "; ".join(parts)
    return 0, ""


def analyze(dumps: List[dict]) -> List[str]:
    """The report's lines, one block per communicator."""
    lines: List[str] = []
    by_comm: Dict[str, Dict[int, dict]] = {}
    for d in dumps:
        by_comm.setdefault(d["comm"], {})[d["rank"]] = d  # a later dump of a rank replaces one
    for comm, ranks in sorted(by_comm.items()):
        size = max(d["size"] for d in ranks.values())
        lines.append(f"communicator {comm}: {size} ranks, dumps from {ranks_text(list(ranks))}")
        reasons: Dict[str, List[int]] = {}
        for r, d in ranks.items():  # the first sentence of each reason
            reasons.setdefault(d["reason"].split(". ")[0].rstrip("."), []).append(r)
        for reason, rs in sorted(reasons.items(), key=lambda kv: kv[1]):
            lines.append(f"  {ranks_text(rs)} dumped: {reason}")
        calls = {r: {c["seq"]: c for c in d["calls"]} for r, d in ranks.items() if d["calls"]}
        frontiers = {r: d["calls"][-1] for r, d in ranks.items() if d["calls"]}
        groups: Dict[tuple, List[int]] = {}
        for rank, call in frontiers.items():
            groups.setdefault((call["seq"], call["collective"], call["state"]), []).append(rank)
        ordered = sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[1]))
        lines.append(
            "  where they are: "
            + "; ".join(f"{ranks_text(r)} {'is' if len(r) == 1 else 'are'} {_frontier_text(frontiers[r[0]])}"
                        for _, r in ordered)
        )
        last = max((c["seq"] for c in frontiers.values()), default=0)
        behind = sorted(r for r, c in frontiers.items() if c["seq"] < last)
        if behind:
            lines.append(f"  {ranks_text(behind)} never entered #{last}: the others wait for them")
        silent = sorted(set(range(size)) - set(ranks))
        if silent:
            lines.append(
                f"  no dump from {ranks_text(silent)}: stopped, dead, or outside zcoll when the others failed "
                "(a stopped process writes nothing; SIGUSR1 reaches only running ones)"
            )
        waits = [f"rank {r} for rank {c['waiting_for']}" for r, c in sorted(frontiers.items())
                 if c["state"] in ("posted", "in_progress") and c.get("waiting_for", -1) >= 0]
        if waits:
            lines.append(f"  waiting: {', '.join(waits)}")
            ends = _wait_chain_ends(frontiers, last)
            if ends:
                lines.append(f"  the waits lead to {ranks_text(ends)}")
        seq, mismatch = _first_mismatch(calls)
        if mismatch:
            lines.append(f"  MISMATCH: {mismatch}")
        if not behind and not silent and not mismatch and len(groups) == 1:
            lines.append("  no divergence: every rank is at the same call")
    return lines


def report(paths: Iterable[str]) -> str:
    """The report for the dumps under `paths` (see the module docstring)."""
    dumps = load(paths)
    if not dumps:
        return "no zcoll flight-recorder dumps (zcoll-flight-*.json) found"
    return "\n".join(analyze(dumps))
