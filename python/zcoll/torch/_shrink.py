"""``torch.distributed.shrink_group`` on zcoll groups (torch 2.13).

torch's ``shrink_group(ranks_to_exclude, group)`` validates its arguments with its own messages
(not a list, empty, out of range, duplicates, every rank excluded: ValueError / TypeError; called
on an excluded rank: RuntimeError), asks the group's backend for ``supports_shrinking`` and for a
backend of the remaining ranks (``shrink``), destroys the old group and registers a new
ProcessGroup around that backend (the new default group when the default was shrunk). A zcoll
group *is* its process group (a Python ``ProcessGroup``, not a C++ ``Backend`` torch could wrap),
so two private steps of torch's are routed for zcoll groups only, as backend.py routes
``monitored_barrier``: finding the backend returns the group itself, and wrapping the result
returns the new zcoll group itself. Every other group goes through torch's functions unchanged.

The new group's communicator: ``MPI_Comm_create_group`` over the old group's ranks minus the
excluded ones, which is collective over exactly the ranks that call shrink_group (the excluded
ranks never do), so it works whether those ranks are dead (with Open MPI under ``mpirun --with-ft
ulfm``, which keeps the survivors of a lost rank running; MPICH's launcher may end them) or alive
and merely left out. The old group is retired: its calls raise BrokenError and destroying it
frees nothing through MPI (its peers may be gone). ``SHRINK_ABORT`` first aborts the old group's
running collective (zcoll.TimeoutError on every rank still in it). Where some excluded ranks
are failed and others alive (one SIGKILLed, one stopped), create_group refuses the old
communicator (it holds a failed rank) and MPI's shrink would wait for the stopped one, so the
remaining ranks build theirs with ``MPI_Comm_create_from_group`` (MPI-4: no parent communicator).
``pg_options=ShrinkOptions(alive=True)`` says the caller already knows the excluded ranks are not
all failed (it gave MPI its grace: ElasticLoop), so the survivors skip FAILURE_GRACE_S.
docs/recovery.md.
"""

from __future__ import annotations

import time
import zlib
from typing import Any, Callable

from torch.distributed import distributed_c10d as c10d

from .. import _C

FAILURE_GRACE_S = 3.0  # how long a survivor waits for MPI to hold the excluded ranks failed (ULFM)
_PROBE_TAG = 32766  # probed, never sent: the group's base communicator carries no messages


class ShrinkOptions:
    """``pg_options`` of ``torch.distributed.shrink_group`` on a zcoll group. ``timeout``: the new
    group's (a datetime.timedelta; default: the old group's). ``alive``: the caller knows that not
    every excluded rank is failed (it already gave MPI the grace to say so, as ElasticLoop does), so
    the remaining ranks build their group at once instead of waiting FAILURE_GRACE_S for MPI again.
    Every remaining rank must pass the same ``alive``."""

    __slots__ = ("_timeout", "alive")

    def __init__(self, timeout: Any = None, alive: bool = False):
        self._timeout, self.alive = timeout, bool(alive)


def _ranks_in(group: Any, other: Any) -> list[int]:
    """The ranks in MPI group `other` of `group`'s members, in `group`'s order; frees both groups."""
    try:
        return list(group.Translate_ranks(list(range(group.size)), other))
    finally:
        group.Free()
        other.Free()


def failed_ranks(comm: Any) -> set:
    """The ranks of mpi4py communicator `comm` that MPI (ULFM) holds failed now."""
    return set(_ranks_in(comm.Get_failed(), comm.Get_group()))


def known_failed(comm: Any, ranks: list, grace: float) -> bool:
    """Whether MPI (ULFM) holds every one of `ranks` of mpi4py communicator `comm` failed within
    `grace` seconds (probing each drives MPI's progress, where it learns of failures; it learns of
    a killed process within tens of ms here). True as well when `comm` was revoked: a survivor that
    knew sooner revoked it and is shrinking it, which this one must join."""
    from mpi4py import MPI

    deadline = time.monotonic() + grace
    while True:
        for r in ranks:
            try:
                comm.Iprobe(source=r, tag=_PROBE_TAG)
            except MPI.Exception as e:  # MPI_ERR_PROC_FAILED: what we wait for
                if MPI.Get_error_class(e.Get_error_code()) == getattr(MPI, "ERR_REVOKED", None):
                    return True
        if set(ranks) <= failed_ranks(comm):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


class ShrinkOps:
    """The shrink half of ProcessGroupZcoll (a mixin: backend.py)."""

    supports_shrinking = True

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0, opts_override: Any = None) -> Any:
        """A new ProcessGroupZcoll of this group's ranks but `ranks_to_exclude` (group ranks),
        collective over those remaining ranks; what torch's shrink_group calls."""
        from mpi4py import MPI

        excluded = sorted({int(r) for r in ranks_to_exclude})
        if not excluded or excluded[0] < 0 or excluded[-1] >= self.size() or len(excluded) >= self.size():
            raise ValueError(
                f"zcoll shrink: ranks_to_exclude must name 1..{self.size() - 1} distinct ranks of this group "
                f"(0..{self.size() - 1}), got {list(ranks_to_exclude)}"
            )
        if self.rank() in excluded:
            raise RuntimeError(
                f"zcoll shrink: rank {self.rank()} is excluded and must not take part in the shrink"
            )
        if shrink_flags & getattr(c10d, "SHRINK_ABORT", 1):
            self._comm.abort("torch.distributed.shrink_group(shrink_flags=SHRINK_ABORT)")
        keep = [r for r in range(self.size()) if r not in set(excluded)]
        name = f"{self.getGroupName()}:shrunk"
        alive = bool(getattr(opts_override, "alive", False))
        comm = self._remaining(keep, zlib.crc32(name.encode()) % 32768, name, alive)
        if comm == MPI.COMM_NULL:  # pragma: no cover - every caller is in `keep`
            raise RuntimeError(f"zcoll shrink: rank {self.rank()} is not among the remaining ranks {keep}")
        timeout = getattr(opts_override, "_timeout", None)
        seconds = timeout.total_seconds() if timeout is not None else self._comm.timeout
        new = type(self)(comm, comm.rank, comm.size, name, seconds)
        self._retire(f"it was shrunk to its ranks {keep} (torch.distributed.shrink_group)")
        return new

    def _remaining(self, keep: list[int], tag: int, name: str, alive: bool) -> Any:
        """The communicator of `keep`. Where MPI knows of failed ranks (ULFM, `mpirun --with-ft
        ulfm`) it refuses to create a communicator from one that holds them (MPI_ERR_PROC_FAILED),
        and one survivor may know before another, which would leave it alone in create_group.
        So with fault tolerance on, each survivor first gives MPI up to FAILURE_GRACE_S to learn
        of the excluded ranks' failure (none when `alive`: the caller gave it already): when all
        are failed, the survivors revoke the old communicator and shrink it (MPI's fault-tolerant
        agreement on who is left, which must be exactly `keep`); when some are failed and others
        alive, MPI_Comm_create_from_group over `keep` (no parent communicator to refuse);
        otherwise (excluded ranks alive, merely left out) MPI_Comm_create_group, collective over
        `keep` only."""
        from mpi4py import MPI

        lost = sorted(set(range(self.size())) - set(keep))
        if not _C.shrink_unavailable_reason():
            if not alive and known_failed(self._base, lost, FAILURE_GRACE_S):
                return self._revoke_and_shrink(keep)
            if failed_ranks(self._base) & set(lost):
                return self._from_group(keep, name)
        everyone = self._base.Get_group()
        group = everyone.Incl(keep)
        try:
            return self._base.Create_group(group, tag=tag)
        except MPI.Exception as e:
            # another survivor learnt of the failure first and revoked: it waits in the shrink
            if MPI.Get_error_class(e.Get_error_code()) != getattr(MPI, "ERR_REVOKED", None):
                raise
            return self._revoke_and_shrink(keep)
        finally:
            group.Free()
            everyone.Free()

    def _from_group(self, keep: list[int], name: str) -> Any:
        """MPI_Comm_create_from_group of `keep` (MPI-4), collective over `keep` alone and needing
        no parent communicator: the old one holds a failed rank (create_group refuses it) and an
        alive excluded one (MPI's shrink would wait for it). The string tag names the new group and
        its ranks, unique per shrink."""
        from mpi4py import MPI

        everyone = self._base.Get_group()
        group = everyone.Incl(keep)
        try:
            return MPI.Intracomm.Create_from_group(
                group, f"zcoll:{name}:{keep}", MPI.INFO_NULL, MPI.ERRORS_RETURN
            )
        finally:
            group.Free()
            everyone.Free()

    def _revoke_and_shrink(self, keep: list[int]) -> Any:
        """MPI's fault-tolerant shrink of the old communicator, which must keep exactly `keep`."""
        self._base.Revoke()
        comm = self._base.Shrink()
        kept = members_in(comm, self._base)
        if kept != keep:
            comm.Free()
            raise RuntimeError(
                f"zcoll shrink: MPI's fault-tolerant shrink kept ranks {kept} of this group, torch's "
                f"shrink_group asked for {keep}: ranks {sorted(set(keep) - set(kept))} were lost as well "
                "(MPI_ERR_PROC_FAILED); shrink_group them out too"
            )
        return comm

    def _retire(self, why: str) -> None:
        """Broken from now on, and nothing of it freed through MPI (its peers may be gone)."""
        self._comm._retire(why)
        self._comm.free()  # releases nothing through MPI once retired; shutdown() then frees nothing


def members_in(comm: Any, parent: Any) -> list[int]:
    """The ranks in `parent` of comm's members, in comm's order."""
    return _ranks_in(comm.Get_group(), parent.Get_group())


def install() -> None:
    """Routes torch's shrink_group through zcoll groups (see the module docstring). Idempotent;
    nothing where torch has no shrink_group."""
    validate = getattr(c10d, "_validate_shrink_backend_requirements", None)
    create = getattr(c10d, "_create_shrunk_process_group", None)
    if validate is None or create is None or getattr(validate, "_zcoll", False):
        return
    c10d._validate_shrink_backend_requirements = _backend_of(validate)
    c10d._create_shrunk_process_group = _group_of(create)


def _backend_of(torchs: Callable[[dict], Any]) -> Callable[[dict], Any]:
    def validate(group_info: dict) -> Any:
        pg = group_info["process_group"]
        return pg if isinstance(pg, ShrinkOps) else torchs(group_info)

    validate._zcoll = True
    return validate


def _group_of(torchs: Callable[..., Any]) -> Callable[..., Any]:
    def create(new_backend: Any, remaining_ranks: list[int], metadata: dict, is_default_group: bool) -> Any:
        if not isinstance(new_backend, ShrinkOps):
            return torchs(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend.setGroupName(metadata["new_group_name"])
        new_backend.setGroupDesc(
            "default:shrunken" if is_default_group else f"{metadata['original_group_name']}:shrunk"
        )
        return new_backend

    create._zcoll = True
    return create
