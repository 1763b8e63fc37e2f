"""zcoll's flight-recorder dumps in the format of torch's flight recorder, so that torch's own analyzer
(``torch.distributed.flight_recorder``: ``torchfrtrace DIR`` or ``python -m
torch.distributed.flight_recorder.fr_trace DIR``) reads them, alone or beside torch's own dumps of
the same job.

    zcoll flight --to-torch /tmp/zcoll-dumps                 # writes /tmp/zcoll-dumps/torch-fr/
    torchfrtrace /tmp/zcoll-dumps/torch-fr                   # --allow-incomplete-ranks when a rank left none
    zcoll flight --to-torch DUMPS --merge TORCH_DUMPS --out MIXED     # a mixed job, one file per rank

1. Files: one pickle per global rank, ``<out>/<prefix><rank>`` (prefix ``zcoll_trace_rank_``, as
   torch's ``nccl_trace_rank_``), holding what torch's ``_dump_fr_trace`` holds: ``version``
   (torch 2.13's "2.10"), ``pg_config`` ({name: {name, desc, ranks}}), ``pg_status``,
   ``comm_lib_version`` and ``entries``.
2. Groups: each zcoll communicator is one process group. Its name and description come from
   `groups` ({communicator id: (name, desc)}; ``--group ID=NAME[:DESC]``), else the communicator id
   and "zcoll"; its global ranks are its own ranks (right for the world communicator and for torch
   groups of a zcoll default group of the whole world; sub-communicators need `ranks` in
   `groups`: {id: (name, desc, [global ranks])}).
3. Entries: one per zcoll call record, in the order the rank made them (record_id), with
   ``collective_seq_id`` = zcoll's sequence number (the same on every rank of a communicator), the
   profiling name ``<label>:<torch's name>`` (all_reduce, reduce_scatter, all_gather, broadcast,
   reduce, barrier; torch's analyzer accepts only its own backends' labels, so the label is
   "gloo" by default: zcoll is a CPU backend as gloo is), sizes as torch records them (allgather's
   output is the gathered tensor, reduce_scatter's one rank's block), dtypes by torch's names, and
   the state: posted -> scheduled, in_progress -> started, done -> completed, failed -> started
   (a call that raised never completed). Calls torch has no name for (zcoll's internal link
   probes) are left out.
4. Alignment: where a rank's ring buffer has dropped older calls than another's, each
   communicator's records start at the first sequence number every dumped rank still holds (torch
   aligns on record ids, which differ between zcoll communicators).
5. Merge (a mixed job): torch's own dumps (``--merge DIR``, files ending in the global rank) add
   their entries and groups to the same rank's file, all entries ordered by creation time.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Iterable, Sequence

from . import flight

VERSION = "2.10"  # torch 2.13's flight recorder format
PREFIX = "zcoll_trace_rank_"
TORCH_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_compressed": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "allgather": "all_gather",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
}
DTYPES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int8": "Char",
    "uint8": "Byte", "int32": "Int", "int64": "Long", "bool": "Bool", "complex32": "ComplexHalf",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}  # fmt: skip
STATES = {"posted": "scheduled", "in_progress": "started", "done": "completed", "failed": "started"}

Group = tuple  # (name, desc) or (name, desc, global ranks)


def _sizes(call: dict, size: int) -> tuple[str, list, list]:
    """(torch's collective name, input sizes, output sizes) of one zcoll call."""
    name, count = TORCH_NAMES[call["collective"]], int(call["count"])
    if name == "all_gather":
        return name, [[count]], [[count * size]]
    if name == "reduce_scatter":
        if count % size:  # uneven blocks: torch's _v variant checks no numel relation
            return "reduce_scatter_v", [[count]], [[count]]
        return name, [[count]], [[count // size]]
    if name == "barrier":
        return name, [[0]], [[0]]
    return name, [[count]], [[count]]


def entry(call: dict, dump: dict, pg: tuple[str, str], pg_id: int, label: str) -> dict:
    """torch's flight-recorder entry for one zcoll call record (module docstring, 3.)."""
    name, ins, outs = _sizes(call, int(dump["size"]))
    dtype = DTYPES.get(call["dtype"], call["dtype"])
    start = int(float(call["start"]) * 1e9)
    end = int(float(call["end"]) * 1e9) if call.get("end") else None
    state = STATES.get(call["state"], "started")
    e = {
        "record_id": 0, "pg_id": pg_id, "process_group": pg, "collective_seq_id": int(call["seq"]),
        "p2p_seq_id": 0, "op_id": int(call["seq"]), "profiling_name": f"{label}:{name}",
        "time_created_ns": start, "input_sizes": ins, "input_dtypes": [dtype] * len(ins),
        "output_sizes": outs, "output_dtypes": [dtype] * len(outs), "state": state,
        "time_discovered_started_ns": start if state != "scheduled" else None,
        "time_discovered_completed_ns": end if state == "completed" else None,
        "retired": call["state"] in ("done", "failed"), "timeout_ms": int(float(dump.get("timeout", 0)) * 1000),
        "is_p2p": False, "frames": [], "thread_id": "0", "thread_name": f"zcoll {call.get('algorithm', '')}".strip(),
    }  # fmt: skip
    if end is not None:
        e["duration_ms"] = (end - start) / 1e6
    return e


def _group(comm: str, size: int, groups: dict[str, Group]) -> tuple[str, str, list[int]]:
    given = groups.get(comm, ())
    name = given[0] if len(given) > 0 else comm
    desc = given[1] if len(given) > 1 else "zcoll"
    ranks = list(given[2]) if len(given) > 2 else list(range(size))
    if len(ranks) != size:
        raise ValueError(f"group of communicator {comm}: {len(ranks)} global ranks given for {size} ranks")
    return name, desc, ranks


def _aligned(dumps: list[dict]) -> dict[str, int]:
    """Per communicator, the first sequence number every dumped rank still holds (module docstring, 4.)."""
    first: dict[str, int] = {}
    for d in dumps:
        seqs = [int(c["seq"]) for c in d["calls"]]
        if seqs:
            first[d["comm"]] = max(first.get(d["comm"], 0), min(seqs))
    return first


def convert(
    dumps: list[dict], groups: dict[str, Group] | None = None, label: str = "gloo"
) -> dict[int, dict]:
    """global rank -> torch's dump dict (module docstring, 1.-4.) for zcoll dumps (flight.load)."""
    groups = groups or {}
    latest: dict[tuple[str, int], dict] = {}
    for d in dumps:  # a later dump of a rank replaces an earlier one, as in `zcoll report`
        latest[(d["comm"], int(d["rank"]))] = d
    dumps = list(latest.values())
    first = _aligned(dumps)
    ids = {comm: i for i, comm in enumerate(sorted({d["comm"] for d in dumps}))}
    out: dict[int, dict] = {}
    for d in dumps:
        name, desc, ranks = _group(d["comm"], int(d["size"]), groups)
        g = ranks[int(d["rank"])]
        mine = out.setdefault(g, {"version": VERSION, "pg_config": {}, "pg_status": {}, "entries": [],
                                  "comm_lib_version": "zcoll"})  # fmt: skip
        mine["pg_config"][name] = {"name": name, "desc": desc, "ranks": str(ranks)}
        calls = [
            c for c in d["calls"] if c["collective"] in TORCH_NAMES and int(c["seq"]) >= first[d["comm"]]
        ]
        mine["entries"] += [entry(c, d, (name, desc), ids[d["comm"]], label) for c in calls]
        seqs = {s: [int(c["seq"]) for c in calls if c["state"] in states] or [-1]
                for s, states in (("enqueued", STATES), ("started", ("in_progress", "done", "failed")),
                                  ("completed", ("done",)))}  # fmt: skip
        mine["pg_status"][name] = {f"last_{s}_collective": max(v) for s, v in seqs.items()}
    for mine in out.values():
        _renumber(mine)
    return out


def _renumber(dump: dict) -> None:
    dump["entries"].sort(key=lambda e: (e["time_created_ns"], e["pg_id"], e["collective_seq_id"]))
    for i, e in enumerate(dump["entries"]):
        e["record_id"] = i


def read_torch_dumps(directory: str) -> dict[int, dict]:
    """torch's own flight-recorder dumps in directory (pickles named <prefix><global rank>)."""
    found: dict[int, dict] = {}
    for name in sorted(os.listdir(directory)):
        m = re.search(r"(\d+)$", name)
        path = os.path.join(directory, name)
        if not m or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            d = pickle.load(f)
        if isinstance(d, dict) and "entries" in d and "pg_config" in d:
            found[int(m[1])] = d
    return found


def merge(ours: dict[int, dict], theirs: dict[int, dict]) -> dict[int, dict]:
    """One dump per global rank holding both jobs' groups and entries (module docstring, 5.)."""
    for rank, d in theirs.items():
        mine = ours.setdefault(rank, {"version": d.get("version", VERSION), "pg_config": {}, "pg_status": {},
                                      "entries": [], "comm_lib_version": "zcoll"})  # fmt: skip
        mine["pg_config"].update(d.get("pg_config", {}))
        mine["pg_status"].update(d.get("pg_status", {}))
        mine["entries"] += list(d.get("entries", []))
        _renumber(mine)
    return ours


def write(converted: dict[int, dict], out: str, prefix: str = PREFIX) -> list[str]:
    """The per-rank pickles (module docstring, 1.), each written whole (temporary file + rename)."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for rank, d in sorted(converted.items()):
        path = os.path.join(out, f"{prefix}{rank}")
        with open(path + ".tmp", "wb") as f:
            pickle.dump(d, f)
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


def to_torch(
    paths: Iterable[str], out: str | None = None, groups: dict[str, Group] | None = None,
    merge_dir: str | None = None, label: str = "gloo",
) -> list[str]:  # fmt: skip
    """Converts the zcoll dumps under `paths` (files or directories) for torch's analyzer; returns
    the files written (default directory: <first path's directory>/torch-fr)."""
    paths = list(paths)
    dumps = flight.load(paths)
    if not dumps:
        raise ValueError(f"no zcoll flight-recorder dumps (zcoll-flight-*.json) under {', '.join(paths)}")
    converted = convert(dumps, groups, label)
    if merge_dir:
        converted = merge(converted, read_torch_dumps(merge_dir))
    if out is None:
        first = paths[0] if os.path.isdir(paths[0]) else os.path.dirname(paths[0])
        out = os.path.join(first, "torch-fr")
    return write(converted, out)


def parse_group(text: str) -> tuple[str, Group]:
    """``ID=NAME[:DESC[:R0,R1,...]]`` (--group) -> (id, group)."""
    comm, sep, rest = text.partition("=")
    parts = rest.split(":")
    if not sep or not comm or not parts[0]:
        raise ValueError(
            f"--group {text!r}: expected COMMUNICATOR_ID=NAME[:DESC[:GLOBAL_RANKS]], e.g. 5a3-123-1=0:default_pg"
        )
    group: Sequence = parts[:2]
    if len(parts) > 2:
        group = (*parts[:2], [int(r) for r in parts[2].split(",")])
    return comm, tuple(group)
