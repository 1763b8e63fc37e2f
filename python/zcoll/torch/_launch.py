"""Starting torch.distributed on MPI, under any launcher: mpirun / srun, or torchrun.

zcoll's process group talks through MPI. How MPI learns the job depends on who started the
processes:

1. An MPI launcher (mpirun/mpiexec, srun: PMI_*, OMPI_*, PMIX_*, SLURM_* variables): MPI knows
   the job; no MASTER_ADDR and no network store are needed. ``zcoll.torch.init_process_group()``
   passes a :class:`ProcessLocalStore`; for plain ``dist.init_process_group("zcoll")``, importing
   ``zcoll.torch`` wraps torch's ``env://`` handler so that with MASTER_ADDR unset it answers with
   MPI's rank and size and a ``ProcessLocalStore``. In every other case the stock handler runs.
2. A torch launcher (torchrun, or anything that sets MASTER_ADDR / MASTER_PORT / RANK /
   WORLD_SIZE): the creator of the default zcoll group, before MPI is initialised, joins the
   processes into one MPI job through torch's own rendezvous store (``join_launcher_job``:
   zcoll.core.store_launch serves MPICH's PMI from the store). Nodes are torchrun's agents
   (GROUP_RANK), else host names, so shared memory and the hierarchical algorithms see them.
   MPI must not be initialised before (mpi4py.MPI imported first): then a RuntimeError says so.
3. At exit, after the process groups are shut down, MPI is finalised when step 2 started it.

Example::

    # mpirun -n 4 python train.py       or      torchrun --nproc-per-node 4 train.py
    import torch.distributed as dist, zcoll.torch
    dist.init_process_group("zcoll")          # or: zcoll.torch.init_process_group()
"""

from __future__ import annotations

import atexit
import importlib
import os
import socket
from datetime import timedelta
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from .._C import env_get
from ..core import store_launch

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
# At exit after the process groups (backend.py registers its handler after importing this module,
# so it runs first): MPI_Finalize when join_launcher_job started MPI.
atexit.register(store_launch.finalize)
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
    if store_launch.joined() or under_mpi_launcher():
        how = "Start every process with one launcher (`mpirun -n N`, `srun -n N`, or `torchrun`)."
    else:
        how = (
            "MPI was initialised before the zcoll process group (mpi4py.MPI imported, or a "
            "zcoll.Communicator made, first), so it could not join the launcher's job: create the "
            "group first (`import zcoll.torch; dist.init_process_group('zcoll')`), then use MPI."
        )
    return RuntimeError(
        f"zcoll: torch.distributed says rank {torch_rank} of {torch_size} but MPI says rank {comm.rank} of "
        f"{comm.size}. {how}"
    )


def _node_label() -> str:
    """Which ranks share a node: torchrun's agent (GROUP_RANK; one per node, also when a test bed
    puts several on one machine), else the host name (with ZCOLL_NODE_ID where set)."""
    if "GROUP_RANK" in os.environ:
        return "group" + os.environ["GROUP_RANK"]
    return socket.gethostname() + "/" + env_get("ZCOLL_NODE_ID")


def _store_address(store: Any) -> str:
    """host:port of the TCPStore under torch's prefix stores, else MASTER_ADDR:MASTER_PORT."""
    while getattr(store, "underlying_store", None) is not None:
        store = store.underlying_store
    if hasattr(store, "host") and hasattr(store, "port"):
        return f"{store.host}:{store.port}"
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def join_launcher_job(opts: Any, timeout: float | None) -> None:
    """For the default zcoll group: when no MPI launcher started this process and MPI is not
    initialised yet, makes the processes of torch's group one MPI job through torch's store
    (the module docstring, 2). timeout: seconds (None: ZCOLL_TIMEOUT)."""
    if opts.group_size == 1 or under_mpi_launcher() or store_launch.mpi_initialized():
        return  # one process: MPI starts as a singleton, as it always did
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"zcoll/pmi/{os.environ.get('TORCHELASTIC_RUN_ID', 'env')}/{restart}/"
    where = _store_address(opts.store)
    try:
        store_launch.join(
            opts.store,
            opts.group_rank,
            opts.group_size,
            _node_label(),
            store_launch.default_timeout() if timeout is None else timeout,
            prefix,
            f"torch's store at {where}",
        )
    except store_launch.PmiError as e:
        raise RuntimeError(
            f"zcoll: cannot start MPI for rank {opts.group_rank} of {opts.group_size}: {e}"
        ) from e
    except (RuntimeError, OSError) as e:
        if "zcoll" in str(e):
            raise
        raise RuntimeError(
            f"zcoll: rank {opts.group_rank} of {opts.group_size} lost torch's store at {where} while "
            f"starting MPI ({type(e).__name__}: {e})"
        ) from e


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
    """Initialises torch.distributed's default group on zcoll.

    Under an MPI launcher, ranks and size come from MPI: comm, an mpi4py intracommunicator
    (default MPI.COMM_WORLD), and torch's global ranks are its ranks. Under a torch launcher
    (torchrun: MASTER_ADDR set, no MPI launcher, MPI not initialised yet) this is
    ``dist.init_process_group("zcoll")``, which starts MPI from torch's store.
    Other keyword arguments go to ``dist.init_process_group``.

    Example::

        import torch.distributed as dist, zcoll.torch
        zcoll.torch.init_process_group()
        t = torch.ones(4); dist.all_reduce(t)
    """
    global _world_comm
    torch_launch = comm is None and "MASTER_ADDR" in os.environ and not under_mpi_launcher()
    if torch_launch and not store_launch.mpi_initialized():
        dist.init_process_group("zcoll", timeout=timeout, **kwargs)
        return
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
