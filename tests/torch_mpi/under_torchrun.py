"""Runs a script of this directory under torchrun when it starts MPI at import (the harness
imports mpi4py.MPI): first creates and destroys the default zcoll group, which joins the workers
into one MPI job through torch's store (zcoll.core.store_launch), then runs the script as
__main__ with the remaining arguments. MPI stays initialised, so the script finds its world.

Run: torchrun --standalone --nproc-per-node 3 tests/torch_mpi/under_torchrun.py \
         tests/torch_mpi/dist_suite.py [test_name ...]
"""

import runpy
import sys

import torch.distributed as dist
import zcoll.torch  # noqa: F401  (registers the backend)

dist.init_process_group("zcoll")
dist.destroy_process_group()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
