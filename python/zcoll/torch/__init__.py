"""zcoll for PyTorch: the "zcoll" torch.distributed backend, DDP communication hooks with
gradient compression, and gradient accumulation that communicates once per N micro-batches.

Importing this package registers the backend (and starts nothing: MPI starts with the first
process group). Under mpirun no MASTER_ADDR is needed::

    # mpirun -n 4 python -m mpi4py train.py
    import torch, torch.distributed as dist, zcoll, zcoll.torch
    zcoll.torch.init_process_group()              # or dist.init_process_group("zcoll")
    model = torch.nn.parallel.DistributedDataParallel(net)
    zcoll.torch.apply_gradient_compression(model, zcoll.GradientQuantizer(bits=8))
    opt = zcoll.torch.optim.Adam(model.parameters(), lr=1e-3, gradient_accumulation_steps=4, model=model)

Modules: ``backend`` (the process group), ``hooks`` (DDP communication hooks), ``accumulate`` and
``optim`` (gradient accumulation), ``lr_scaling`` (the learning-rate rule for a changed global
batch), ``checkpoint`` (save and resume bit-exactly, for ``zcoll run``),
``profiler`` (the step profiler: ``zcoll.torch.profile(ddp)``,
or ``ZCOLL_TRACE=dir`` for every DDP model of a program; read with ``zcoll report dir``).
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as e:  # pragma: no cover - torch is a declared extra
    raise ImportError("zcoll.torch needs PyTorch: pip install 'zcoll[torch]'") from e

from . import _launch, backend, checkpoint, hooks, optim, profiler
from ._launch import ProcessLocalStore, init_gloo_beside_zcoll, init_process_group
from ._work import ZcollWork
from .accumulate import GradientAccumulator
from .backend import ProcessGroupZcoll
from .hooks import CompressionState, allreduce_hook, apply_gradient_compression, compression_hook
from .lr_scaling import LRScaling, global_batch
from .profiler import StepProfiler, profile
from .recommend import recommend

backend.register()
_launch.install_env_rendezvous()
profiler.trace_from_environment()

__all__ = [
    "init_gloo_beside_zcoll",
    "CompressionState",
    "GradientAccumulator",
    "LRScaling",
    "ProcessGroupZcoll",
    "ProcessLocalStore",
    "ZcollWork",
    "allreduce_hook",
    "apply_gradient_compression",
    "checkpoint",
    "compression_hook",
    "hooks",
    "global_batch",
    "init_process_group",
    "optim",
    "profile",
    "profiler",
    "recommend",
    "StepProfiler",
]
