"""One MPI job from processes that a torch launcher started (torchrun, or anything setting
MASTER_ADDR / RANK / WORLD_SIZE): MPI_Init learns the job from the launcher's store.

1. ``arrive()``: each rank writes ``<prefix>arrive/<rank>`` = "size node host pid" and waits until
   every rank of ``size`` has. It fails at once when a rank states another size (mismatched
   WORLD_SIZE) and, after ``timeout`` seconds, names the ranks that never came; never a hang.
2. ``join()``: after ``arrive()``, a ``PmiServer`` (``pmi_server``) answers MPICH from the store;
   ``PMI_FD`` / ``PMI_RANK`` / ``PMI_SIZE`` are set, ``MPI_Init_thread(MPI_THREAD_MULTIPLE)`` is
   called through ctypes, then the variables are removed (child processes must not think an MPI
   launcher started them). ctypes releases the GIL during the call, so the server thread answers
   while MPI_Init waits; mpi4py initialises MPI holding the GIL, which would deadlock it. mpi4py,
   imported afterwards, finds MPI initialised and uses it (its error handlers included).
3. ``finalize()`` (the torch layer registers it at exit, after its process groups are shut down):
   frees zcoll's communicators, then ``MPI_Finalize`` through ctypes (MPICH may hold a PMI
   barrier there). PMI's finalize, which MPICH sends from its C exit hook when Python threads
   no longer run, is answered in advance. Only when ``join()`` initialised MPI.

Nodes: ranks with equal ``node`` labels share a node (PMI_process_mapping), so MPICH's shared
memory, ``MPI_Comm_split_type(SHARED)`` and zcoll's shm and hierarchical algorithms see the
launcher's nodes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import time
from typing import Any

from .. import _C
from . import communicator
from .pmi_server import PmiError, PmiServer

MPI_THREAD_MULTIPLE = 3  # MPICH's and Open MPI's value (mpi.h)

_server: PmiServer | None = None  # set when join() initialised MPI
_keep: list = []  # servers after MPI_Finalize, answering until the process ends


@functools.cache
def _libmpi() -> ctypes.CDLL:
    """The MPI library zcoll's extension is linked to (loaded with it), through ctypes."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libmpi" in line and ".so" in line}
    paths = {p for p in paths if os.path.basename(p).startswith(("libmpi.so", "libmpi_abi.so"))}
    if not paths:
        raise RuntimeError("zcoll: no libmpi is loaded in this process (the extension links one)")
    return ctypes.CDLL(min(paths))


def mpi_initialized() -> bool:
    flag = ctypes.c_int(0)
    _libmpi().MPI_Initialized(ctypes.byref(flag))
    return bool(flag.value)


def _record(size: int, node: str) -> str:
    return f"{size} {node} {socket.gethostname()} {os.getpid()}"


def arrive(store: Any, rank: int, size: int, node: str, timeout: float, prefix: str) -> list[str]:
    """Every rank's node label, once all `size` ranks wrote theirs (module docstring, 1)."""
    if not 0 <= rank < size:
        raise PmiError(f"rank {rank} is outside a world of size {size} (RANK / WORLD_SIZE)")
    mine = _record(size, node)
    store.set(f"{prefix}arrive/{rank}", mine)
    seen: dict[int, list[str]] = {}
    deadline = time.monotonic() + timeout
    pause = 0.002
    while len(seen) < size:
        for r in range(size):
            if r not in seen and store.check([f"{prefix}arrive/{r}"]):
                seen[r] = _decode(store.get(f"{prefix}arrive/{r}")).split(" ")
                if int(seen[r][0]) != size:
                    raise PmiError(
                        f"rank {r} (host {seen[r][2]}, pid {seen[r][3]}) says WORLD_SIZE={seen[r][0]}, "
                        f"rank {rank} says {size}: every process must be started with the same world size"
                    )
        if len(seen) == size:
            break
        if time.monotonic() > deadline:
            missing = [r for r in range(size) if r not in seen]
            raise PmiError(
                f"rank(s) {missing} of {size} did not arrive within {timeout:g} s "
                f"(arrived: {sorted(seen)}): a worker that was not started, crashed before "
                "init_process_group, or runs with another RANK / WORLD_SIZE"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    if " ".join(seen[rank]) != mine:
        raise PmiError(f"two processes claim rank {rank}: {' '.join(seen[rank][2:])} and this one")
    return [seen[r][1] for r in range(size)]


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def join(
    store: Any, rank: int, size: int, node: str, timeout: float, prefix: str, describe_store: str
) -> None:
    """Initialises MPI as rank `rank` of a job of `size` ranks (module docstring, 2)."""
    global _server
    if mpi_initialized():
        raise RuntimeError("zcoll: MPI is already initialised; it cannot join the launcher's job any more")
    _require_pmi1_engine()
    labels = arrive(store, rank, size, node, timeout, prefix)
    index: dict[str, int] = {}
    nodes = [index.setdefault(label, len(index)) for label in labels]
    server = PmiServer(
        store,
        rank,
        size,
        nodes,
        timeout,
        prefix=prefix,
        kvsname=_kvsname(prefix),
        describe_store=describe_store,
    )
    saved = {k: os.environ.get(k) for k in server.environ()}
    os.environ.update(server.environ())
    try:
        provided = ctypes.c_int(0)
        rc = _libmpi().MPI_Init_thread(None, None, MPI_THREAD_MULTIPLE, ctypes.byref(provided))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if rc != 0 or server.error:
        raise RuntimeError(f"zcoll: MPI_Init_thread failed (error {rc}): {server.error or 'see stderr'}")
    _server = server


def _require_pmi1_engine() -> None:
    """The join answers MPICH's PMI-1 wire protocol; Open MPI starts through PMIx (a prterun or
    a PMIx server of the launcher), and without one MPI_Init makes each process a singleton
    job of one rank. Said before any rank waits for the others."""
    version = _C.mpi_library_version()
    if "Open MPI" not in version:
        return
    raise RuntimeError(
        "zcoll: this zcoll is built against Open MPI ("
        + version.split(",")[0].strip()
        + "), which torchrun cannot start: zcoll joins a torchrun job by serving MPICH's PMI-1 "
        "start-up protocol, and Open MPI starts only through PMIx (its mpirun / prterun). Launch "
        "with `mpirun -n N python train.py` (init_process_group takes mpirun's ranks), or use "
        "zcoll built against MPICH (the default `pip install`) to keep torchrun"
    )


def _kvsname(prefix: str) -> str:
    return "zcoll_" + "".join(c if c.isalnum() else "_" for c in prefix)[:200]


def default_timeout() -> float:
    """Seconds to wait for the other ranks when the caller gave no timeout: ZCOLL_TIMEOUT."""
    return float(_C.env_get("ZCOLL_TIMEOUT"))


def joined() -> bool:
    """True when join() initialised MPI in this process."""
    return _server is not None


def finalize() -> None:
    """At exit, when join() initialised MPI (module docstring, 3). Idempotent."""
    global _server
    if _server is None:
        return
    server, _server = _server, None
    communicator._free_all()
    lib = _libmpi()
    finalized = ctypes.c_int(0)
    lib.MPI_Finalized(ctypes.byref(finalized))
    if not finalized.value:
        lib.MPI_Finalize()
    server.answer_finalize_in_advance()
    _keep.append(server)  # its sockets stay open until the process ends
