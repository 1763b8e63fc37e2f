"""Starting torch.distributed on MPI: no MASTER_ADDR, no network store.

zcoll's process group talks through MPI, so it needs neither torch's TCP rendezvous nor a shared
store: rank and size come from MPI and a process-local store satisfies torch's bookkeeping.

1. ``zcoll.torch.init_process_group()`` (optionally on an mpi4py communicator) calls
   ``dist.init_process_group("zcoll", store=ProcessLocalStore(), rank=..., world_size=...)``.
2. Plain ``dist.init_process_group("zcoll")`` uses torch's ``env://`` rendezvous. Importing
   ``zcoll.torch`` wraps that handler: under an MPI launcher (mpirun/mpiexec/srun: PMI_*, OMPI_*,
   PMIX_*, SLURM_* variables) with MASTER_ADDR unset, it answers with MPI's rank and size and a
   :class:`ProcessLocalStore` instead of failing on the missing variable. In every other case
   the stock handler runs unchanged.
3. torchrun starts processes that MPI cannot join (MPICH singletons cannot connect to each other:
   checked, ``MPI_Comm_accept`` fails in ``MPIDI_check_disjoint_lpids``). Creating the process
   group there with more than one rank raises a RuntimeError saying to launch with mpirun or srun.

Example::

    # mpirun -n 4 python train.py
    import zcoll.torch
    zcoll.torch.init_process_group()          # or: dist.init_process_group("zcoll")
"""

from __future__ import annotations

import importlib
import os
from datetime import timedelta
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

# the module (torch.distributed.rendezvous, the attribute, is a function of the same name)
_rdzv = importlib.import_module("torch.distributed.rendezvous")

_MPI_LAUNCHER_VARS = (
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "MV2_COMM_WORLD_SIZE",
    "SLURM_PROCID",
)

_stores: List["ProcessLocalStore"] = []
_world_comm: Any = None  # the mpi4py communicator the default group is built on (None: COMM_WORLD)


def under_mpi_launcher() -> bool:
    """True when an MPI launcher (or srun) started this process."""
    return any(v in os.environ for v in _MPI_LAUNCHER_VARS)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def world_comm() -> Any:
    """The mpi4py communicator torch's global ranks refer to."""
    if _world_comm is not None:
        return _world_comm
    from mpi4py import MPI

    return MPI.COMM_WORLD


def launch_error(torch_rank: int, torch_size: int, comm: Any) -> RuntimeError:
    how = "started by torchrun, " if under_torchrun() else ""
    return RuntimeError(
        f"zcoll: torch.distributed says rank {torch_rank} of {torch_size} but MPI says rank {comm.rank} of "
        f"{comm.size}. The zcoll backend communicates through MPI, so every process must be {how}"
        "part of one MPI job: launch with `mpirun -n N python script.py` (or `srun`), not torchrun "
        "(MPI cannot join processes it did not start). Then zcoll.torch.init_process_group() needs no "
        "MASTER_ADDR."
    )


class ProcessLocalStore(dist.Store):
    """A key-value store that lives in this process only.

    Enough for zcoll (which never exchanges anything through the store). A read of a key this
    process did not write fails at once with an explanation instead of waiting for a peer that
    will never write it (what a backend needing a real store, gloo for example, would do).
    """

    def __init__(self) -> None:
        super().__init__()
        self._data: Dict[str, bytes] = {}
        # torch keeps only the C++ half (inside a PrefixStore); without a reference to the Python
        # half its methods vanish ("fn INTERNAL ASSERT FAILED ... Not implemented").
        _stores.append(self)

    def _missing(self, key: str) -> RuntimeError:
        return RuntimeError(
            f"zcoll.torch.ProcessLocalStore: key {key!r} was never set in this process. This store does "
            "not reach other processes: it serves the zcoll backend started under mpirun without "
            "MASTER_ADDR. For other backends set MASTER_ADDR and MASTER_PORT."
        )

    def set(self, key: str, value: Any) -> None:
        self._data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key: str) -> bytes:
        if key not in self._data:
            raise self._missing(key)
        return self._data[key]

    def add(self, key: str, amount: int) -> int:
        n = int(self._data.get(key, b"0")) + amount
        self._data[key] = str(n).encode()
        return n

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        cur = self._data.get(key)
        exp = expected if isinstance(expected, bytes) else str(expected).encode()
        if (cur is None and not exp) or cur == exp:
            self.set(key, desired)
        return self._data.get(key, exp)

    def check(self, keys: List[str]) -> bool:
        return all(k in self._data for k in keys)

    def wait(self, keys: List[str], timeout: Optional[timedelta] = None) -> None:
        for k in keys:
            if k not in self._data:
                raise self._missing(k)

    def delete_key(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self._data)


def _mpi_env_handler(stock):
    def handler(url: str, **kwargs):
        if "MASTER_ADDR" in os.environ or not under_mpi_launcher():
            yield from stock(url, **kwargs)
            return
        comm = world_comm()
        q = {k: int(v[0]) for k, v in parse_qs(urlparse(url).query).items() if k in ("rank", "world_size")}
        if q.get("rank", -1) not in (-1, comm.rank) or q.get("world_size", -1) not in (-1, comm.size):
            raise launch_error(q.get("rank", -1), q.get("world_size", -1), comm)
        yield ProcessLocalStore(), comm.rank, comm.size
        raise RuntimeError("zcoll: no re-rendezvous under MPI")

    handler.__zcoll__ = True  # type: ignore[attr-defined]
    return handler


def install_env_rendezvous() -> None:
    """Wraps torch's env:// handler (see the module docstring). Idempotent."""
    stock = _rdzv._rendezvous_handlers.get("env")
    if stock is not None and not getattr(stock, "__zcoll__", False):
        _rdzv._rendezvous_handlers["env"] = _mpi_env_handler(stock)


def init_process_group(comm: Any = None, timeout: Optional[timedelta] = None, **kwargs: Any) -> None:
    """Initialises torch.distributed's default group on zcoll, ranks and size from MPI.

    comm: an mpi4py intracommunicator (default MPI.COMM_WORLD); torch's global ranks are its ranks.
    Other keyword arguments go to ``dist.init_process_group``.

    Example::

        import torch.distributed as dist, zcoll.torch
        zcoll.torch.init_process_group()
        t = torch.ones(4); dist.all_reduce(t)
    """
    global _world_comm
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if under_torchrun() and comm.size != int(os.environ.get("WORLD_SIZE", comm.size)):
        raise launch_error(int(os.environ.get("RANK", -1)), int(os.environ["WORLD_SIZE"]), comm)
    _world_comm = comm
    dist.init_process_group(
        "zcoll", store=ProcessLocalStore(), rank=comm.rank, world_size=comm.size, timeout=timeout, **kwargs
    )


def init_gloo_beside_zcoll(comm: Any = None, timeout: Any = None) -> Dict[str, Any]:
    """Under mpirun: gloo as the default group and zcoll as a second group on the same ranks, for
    side-by-side comparisons. gloo needs an address: MASTER_ADDR when set (rank 0's, e.g. on a
    multi-node test bed; GLOO_SOCKET_IFNAME picks the interface), else localhost; rank 0 picks a
    free port there and shares it through MPI. timeout: the groups' (a datetime.timedelta).
    Returns {"gloo": group, "zcoll": group}.
    """
    import socket

    world = comm if comm is not None else world_comm()
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(world.bcast(port)))
    extra = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group("gloo", rank=world.rank, world_size=world.size, **extra)
    return {"gloo": dist.group.WORLD, "zcoll": dist.new_group(backend="zcoll", **extra)}
