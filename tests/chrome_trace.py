"""A checker of the Chrome trace event format (the JSON object form that chrome://tracing and
ui.perfetto.dev open), for the traces zcoll writes.

validate(obj) returns the problems found (an empty list: valid):
1. the object form: {"traceEvents": [...], ...}, "displayTimeUnit" "ms" or "ns" if present;
2. every event: a string name, a known phase, integer pid and tid, a numeric ts (microseconds)
   except on metadata; "X" a dur >= 0; "i" a scope s in g/p/t; "M" one of the metadata names
   with its argument; "B"/"E" balanced per thread;
3. complete events on one thread nest (a child ends before its parent), as the viewers draw
   one stack per thread.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

PHASES = set("XBEiIMCbensft") | {"P", "O", "N", "D"}
METADATA = {
    "process_name": "name",
    "process_labels": "labels",
    "process_sort_index": "sort_index",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}
SLACK_US = 0.002  # rounding of ts and dur to nanoseconds


def validate(obj: Any) -> List[str]:
    problems: List[str] = []
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        return ["not the JSON object format: expected {'traceEvents': [...]}"]
    if obj.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append(f"displayTimeUnit {obj['displayTimeUnit']!r} is neither 'ms' nor 'ns'")
    open_b: Dict[Tuple[int, int], int] = {}
    complete: Dict[Tuple[int, int], List[Tuple[float, float, str]]] = {}
    for i, e in enumerate(obj["traceEvents"]):
        where = f"event {i} ({e.get('name')!r})" if isinstance(e, dict) else f"event {i}"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if not isinstance(e.get("name"), str):
            problems.append(f"{where}: name must be a string")
        if ph not in PHASES:
            problems.append(f"{where}: unknown phase {ph!r}")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            problems.append(f"{where}: pid and tid must be integers")
        if ph != "M" and not isinstance(e.get("ts"), (int, float)):
            problems.append(f"{where}: ts (microseconds) must be a number")
            continue
        key = (e.get("pid"), e.get("tid"))
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"{where}: a complete event needs dur >= 0, got {dur!r}")
            else:
                complete.setdefault(key, []).append((e["ts"], e["ts"] + dur, e["name"]))
        elif ph in "iI" and e.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"{where}: instant scope {e.get('s')!r} is not g, p or t")
        elif ph == "M":
            arg = METADATA.get(e.get("name"))
            if arg is None:
                problems.append(f"{where}: unknown metadata event")
            elif arg not in e.get("args", {}):
                problems.append(f"{where}: metadata needs args.{arg}")
        elif ph == "B":
            open_b[key] = open_b.get(key, 0) + 1
        elif ph == "E":
            open_b[key] = open_b.get(key, 0) - 1
            if open_b[key] < 0:
                problems.append(f"{where}: E without B on pid/tid {key}")
    problems += [f"pid/tid {k}: {n} B events never ended" for k, n in open_b.items() if n > 0]
    for key, spans in complete.items():
        stack: List[Tuple[float, float, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1][1] - SLACK_US:
                stack.pop()
            if stack and end > stack[-1][1] + SLACK_US:
                problems.append(
                    f"pid/tid {key}: {name!r} [{start}, {end}] overlaps {stack[-1][2]!r} "
                    f"[{stack[-1][0]}, {stack[-1][1]}] without nesting"
                )
            stack.append((start, end, name))
    return problems
