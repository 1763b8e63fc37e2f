"""The one reader of what zcoll_*_perf writes: its printed table and its --csv file.

Both give the same `Row`s, fields named as the CSV header names them:

    collective ranks size count type redop algorithm time_us algbw_gbs busbw_gbs wrong iters vs_mpi
    wire_bytes ratio max_abs_err rel_err       (the last four: -z runs, or any CSV; else None)

The printed table (bench/harness.cc) is parsed from mpirun output with or without -prepend-rank
(only rank 0's lines count):

    # zcoll_allreduce_perf: 2 ranks, MPICH ..., dtype float32, op sum, ...      -> collective, ranks
    # size count type redop algorithm time(us) algbw busbw #wrong iters vs_mpi [wire ratio maxerr relerr]
          4096   1024  float32  sum  ring  12.3  0.333  0.499  0  2  1.10x  [3072  1.33x  0.01  0.001]
    # Out of bounds values : 0 OK
    # Avg bus bandwidth ring              : 0.499 GB/s

A line whose first field is a number is a row and must parse (11 or 15 fields), so a garbled row
is an error, not a silently missing one; other lines (warnings from MPI, say) are skipped.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

FIELDS = (
    "collective ranks size count type redop algorithm time_us algbw_gbs busbw_gbs wrong iters vs_mpi "
    "wire_bytes ratio max_abs_err rel_err"
).split()
_TITLE = re.compile(r"^# zcoll_(\w+)_perf: (\d+) ranks")
_OUT_OF_BOUNDS = re.compile(r"^# Out of bounds values : (\d+) (OK|FAILED)$")
_AVG_BUSBW = re.compile(r"^# Avg bus bandwidth (\S+)\s*: ([0-9.eE+-]+) GB/s$")
# What the launcher puts before each chunk: hydra's `mpirun -prepend-rank` "[r] ", Open MPI's
# `mpirun --output tag` "[jobid,r]<stdout>: " (tests/mpi_util.py under ./dev.sh --engine openmpi).
_MARKER = re.compile(r"\[(?:\d+,)?(\d+)\](?:<std(?:out|err|diag)>: ?| )")
_CSV_TYPES = {"collective": str, "type": str, "redop": str, "algorithm": str, "ranks": int, "size": int,
              "count": int, "wrong": int, "iters": int}  # the others are floats


@dataclass(frozen=True)
class Row:
    collective: str
    ranks: int
    size: int
    count: int
    type: str
    redop: str
    algorithm: str
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int
    iters: int
    vs_mpi: float
    wire_bytes: Optional[float] = None  # 0: not measured for this row (printed as "-")
    ratio: Optional[float] = None
    max_abs_err: Optional[float] = None
    rel_err: Optional[float] = None


@dataclass
class Table:
    collective: str
    ranks: int
    rows: List[Row]
    out_of_bounds: Optional[int]  # the `# Out of bounds values : N` line; None if missing
    avg_busbw: dict  # algorithm -> GB/s, from the `# Avg bus bandwidth` lines

    @property
    def algorithms(self) -> set:
        return {r.algorithm for r in self.rows}

    @property
    def compression_columns(self) -> bool:
        """Every row has wire, ratio, maxerr and relerr (a -z run)."""
        return bool(self.rows) and all(r.rel_err is not None for r in self.rows)


def _number(text: str) -> float:
    return 0.0 if text == "-" else float(text.rstrip("x"))


def _row(fields: List[str], collective: str, ranks: int, line: str) -> Row:
    if len(fields) not in (11, 15):
        raise ValueError(f"a zcoll_*_perf row has 11 or 15 fields, this one {len(fields)}: {line!r}")
    size, count, dtype, redop, algorithm, time_us, algbw, busbw, wrong, iters, vs_mpi = fields[:11]
    z = [_number(f) for f in fields[11:]] or [None] * 4
    return Row(
        collective, ranks, int(size), int(count), dtype, redop, algorithm, float(time_us), float(algbw),
        float(busbw), int(wrong), int(iters), _number(vs_mpi), *z,
    )


def split_ranks(output: str) -> Dict[Optional[int], str]:
    """What each rank wrote, from `mpirun -prepend-rank` output (text before any `[r] ` marker,
    or all of it without -prepend-rank, under None). hydra marks the start of every line and of
    every chunk it reads from a rank, and a chunk can end mid-line (a row written by several
    printf calls), so a rank's own marker in the middle of its line is cut out; a marker of
    another rank there is taken as text (hydra does not switch ranks mid-line in practice)."""
    streams: Dict[Optional[int], List[str]] = {}
    rank, start = None, 0
    for m in _MARKER.finditer(output):
        at_line_start = m.start() == 0 or output[m.start() - 1] == "\n"
        if at_line_start or int(m.group(1)) == rank:
            streams.setdefault(rank, []).append(output[start : m.start()])
            rank, start = int(m.group(1)), m.end()
    streams.setdefault(rank, []).append(output[start:])
    return {r: "".join(texts) for r, texts in streams.items() if r is not None or any(texts)}


def parse(output: str) -> Table:
    """The table in a zcoll_*_perf run's output (rank 0's, if rank-prefixed). Raises ValueError
    without a title line or on a garbled row."""
    streams = split_ranks(output)
    text = streams.get(0, streams.get(None, ""))
    collective, ranks = None, 0
    rows, out_of_bounds, avg = [], None, {}
    for line in text.splitlines():
        line = line.strip()
        if (m := _TITLE.match(line)) is not None:
            collective, ranks = m.group(1), int(m.group(2))
        elif (m := _OUT_OF_BOUNDS.match(line)) is not None:
            out_of_bounds = int(m.group(1))
        elif (m := _AVG_BUSBW.match(line)) is not None:
            avg[m.group(1)] = float(m.group(2))
        elif line[:1].isdigit():
            if collective is None:
                raise ValueError(f"a row before the `# zcoll_<name>_perf: N ranks` title: {line!r}")
            rows.append(_row(line.split(), collective, ranks, line))
    if collective is None:
        raise ValueError("no `# zcoll_<name>_perf: N ranks` title line in the output")
    return Table(collective, ranks, rows, out_of_bounds, avg)


def read_csv(path) -> List[Row]:
    """The rows of a `zcoll_*_perf --csv` file."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != FIELDS:
            raise ValueError(f"{path}: header {reader.fieldnames}, expected {FIELDS}")
        return [Row(**{k: _CSV_TYPES.get(k, float)(v) for k, v in r.items()}) for r in reader]


def write_csv(path, rows: List[Row]) -> None:
    """Rows in the format of `zcoll_*_perf --csv` (read_csv reads it back)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        w.writerows(dataclasses.astuple(r) for r in rows)
