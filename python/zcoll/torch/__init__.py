"""zcoll for PyTorch: the "zcoll" torch.distributed backend, DDP communication hooks with
gradient compression, and gradient accumulation that communicates once per N micro-batches.

Importing this package registers the backend (and starts nothing: MPI starts with the first
process group). Under mpirun no MASTER_ADDR is needed::

    # mpirun -n 4 python -m mpi4py train.py
    import torch, torch.distributed as dist, zcoll, zcoll.torch
    zcoll.torch.init_process_group()              # or dist.init_process_group("zcoll")
    t = torch.ones(4); dist.all_reduce(t)

Modules: ``backend`` (the process group).
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as e:  # pragma: no cover - torch is a declared extra
    raise ImportError("zcoll.torch needs PyTorch: pip install 'zcoll[torch]'") from e

from . import _launch, backend
from ._launch import ProcessLocalStore, init_process_group
from ._work import ZcollWork
from .backend import ProcessGroupZcoll

backend.register()
_launch.install_env_rendezvous()

__all__ = [
    "ProcessGroupZcoll",
    "ProcessLocalStore",
    "ZcollWork",
    "init_process_group",
]
