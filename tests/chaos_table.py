"""The result tables of the chaos runs, shared by tests/chaos_run.py (restart recovery) and
tests/chaos_shrink.py (in-place recovery): faults grouped by signal and when, how many of them
training came back from, the seconds each lost (median, max), in aligned columns; the verdict, and where the results go.

A fault here is either script's Fault: anything with `signal`, `when`, `back` (when training was
back at its step, or None) and `lost` (seconds, or None)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Iterable, Sequence


def by_kind(faults: Iterable[Any]) -> dict[tuple[str, str], list]:
    """(signal, when) -> its faults, in sorted order of (signal, when)."""
    groups: dict[tuple[str, str], list] = {}
    for f in faults:
        groups.setdefault((f.signal, f.when), []).append(f)
    return dict(sorted(groups.items()))


def recovered(faults: Sequence[Any]) -> str:
    """How many of `faults` training came back from (back at the step it had reached)."""
    return str(sum(f.back is not None for f in faults))


def lost_cells(faults: Sequence[Any], digits: int) -> tuple[str, str]:
    """The median and the largest seconds lost to `faults`, "-" for both when none recovered."""
    lost = [f.lost for f in faults if f.lost is not None]
    if not lost:
        return "-", "-"
    return f"{statistics.median(lost):.{digits}f}", f"{max(lost):.{digits}f}"


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def verdict(problems: Sequence[str]) -> str:
    """The report's last line: PASS, or FAIL and the problems, one a line."""
    return "PASS" if not problems else "FAIL:\n  " + "\n  ".join(problems)


def write_results(out: Path, report: str, results: dict) -> None:
    """Prints the report, writes it to out/table.txt and `results` to out/results.json."""
    print("\n" + report, flush=True)
    (out / "table.txt").write_text(report + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n{out / 'table.txt'}, {out / 'results.json'}", flush=True)
