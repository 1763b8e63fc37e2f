"""Start-up to a first allreduce, as a torchrun worker sees it, for bench/launchers.py startup.

Each rank prints one line (seconds since this script began, after Python itself started):

    ZCOLL-STARTUP backend=<b> rank=<r> import=<s> init=<s> first=<s>

import: torch and zcoll.torch imported; init: init_process_group(<backend>) returned (for zcoll
under torchrun that includes MPI's start-up through torch's store); first: the first
all_reduce of 1024 float32 completed.

Run: torchrun --standalone --nproc-per-node 2 tests/torch_mpi/first_allreduce.py --backend=zcoll
"""

import sys
import time

T0 = time.monotonic()

# isort: split
import torch
import torch.distributed as dist
import zcoll.torch  # noqa: F401  (registers the backend)

BACKEND = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--backend=")), "zcoll")
t_import = time.monotonic() - T0
dist.init_process_group(BACKEND)
t_init = time.monotonic() - T0
t = torch.ones(1024)
dist.all_reduce(t)
t_first = time.monotonic() - T0
assert t[0].item() == dist.get_world_size()
print(
    f"ZCOLL-STARTUP backend={BACKEND} rank={dist.get_rank()} import={t_import:.3f} init={t_init:.3f} "
    f"first={t_first:.3f}",
    flush=True,
)
dist.destroy_process_group()
