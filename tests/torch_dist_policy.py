"""What the zcoll backend claims of torch's own distributed test suite, in one place for both sides
of tests/torch/test_dist_suite.py (the rank script tests/torch_mpi/dist_suite.py and pytest).

torch 2.13's torch/testing/_internal/distributed/distributed_test.py decides many of its skips by
the backend's *name* when the module is imported ("Only MPI supports all_to_all", "Test requires
backend zcoll to be one of {'gloo', ...}"). Those gates say which features the built-in backends
have, not what the test needs of the machine. The tests behind the reasons in CLAIMED exercise
features zcoll has on CPU, so the adapter runs them anyway; a test among them that needs CUDA
still skips itself at run time (skip_if_lt_x_gpu and friends exit with torch's TEST_SKIPS codes).
Every other skip torch decides (CUDA, NCCL, torchvision, open torch issues) stands, and is
reported with torch's own reason.

A test that runs and fails fails the pytest item, unless it is in EXCLUDED with the reason zcoll
cannot pass it (then an xfail; one that starts passing fails, so the list stays honest).
MUST_RUN names tests that must run and pass (a skip fails them): the issue's timeout,
monitored-barrier and any-source tests.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Dict, List

MODULE = "torch.testing._internal.distributed.distributed_test"

# Patterns of torch's name-based skip reasons (re.search) -> what zcoll has that the tests use.
CLAIMED: Dict[str, str] = {
    r"^Only gloo backend supports timeouts$": "the group's timeout= and Work.wait(timeout) are honoured",
    r"^Test requires backend zcoll to be one of \{.*'gloo'.*\}$": (
        "gloo's CPU features: monitored_barrier, all_reduce_coalesced, object collectives, DDP on CPU"
    ),
    r"^Only MPI supports all_to_all$": "all_to_all on CPU",
    r"^Only MPI supports CPU all_to_all_single$": "all_to_all_single on CPU",
    r"^GLOO Batch Send Recv CPU$": "batch_isend_irecv on CPU",
    r"^get_future is only supported on mpi, nccl and gloo$": "Work.get_future()",
    r"^The zcoll backend does not support DistributedDataParallel$": "DistributedDataParallel on CPU",
    r"^Only Nccl & Gloo backend support DistributedDataParallel$": "DistributedDataParallel on CPU",
    r"^Only Gloo backend supports sparse all reduce$": "all_reduce (SUM) of sparse COO tensors, as gloo's",
}

# Tests that run and cannot pass on zcoll: name -> why.
_NO_MODEL = (
    'its body builds the DDP model only `if BACKEND == "mpi" or BACKEND == "gloo"` (CPU) or '
    '"nccl" (GPU): under any other backend name it reaches `ddp_model` unset (UnboundLocalError); '
    "a limit of the test, not of the backend (DDP, its hooks and no_sync on zcoll: tests/torch_mpi/ddp.py)"
)
EXCLUDED: Dict[str, str] = {
    "test_accumulate_gradients_no_sync": _NO_MODEL,
    "test_accumulate_gradients_no_sync_allreduce_hook": _NO_MODEL,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": _NO_MODEL,
    "test_accumulate_gradients_no_sync_grad_is_view": _NO_MODEL,
}

MUST_RUN = (
    "test_barrier_timeout_global",
    "test_barrier_timeout_group",
    "test_barrier_timeout_full_group",
    "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_subgroup",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_monitored_barrier_failure_order",
    "test_monitored_barrier_wait_all_ranks",
    "test_send_recv_any_source",
    "test_send_recv_any_source_autograd_profiler",
    "test_send_recv_any_source_torch_profiler",
    "test_sparse_all_reduce_sum",
)


def claimed(reason: str) -> bool:
    """True when a skip for `reason` is one of torch's name gates that zcoll claims."""
    return any(re.search(pattern, reason) for pattern in CLAIMED)


def test_names() -> List[str]:
    """The test methods of DistributedTest._DistTestBase, sorted (unittest's order), read from
    the module's source without importing it (importing needs BACKEND and WORLD_SIZE set)."""
    spec = importlib.util.find_spec(MODULE)
    tree = ast.parse(Path(spec.origin).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "_DistTestBase":
            return sorted(
                n.name for n in node.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
            )
    raise LookupError(f"{MODULE} has no class _DistTestBase (torch changed its suite?)")
