"""all_reduce (SUM) of a sparse COO tensor, as gloo does it: gather every rank's entries, add.

Sparse tensors of different ranks hold different indices, so no dense algorithm can add them in
place. Like gloo's sparse allreduce:

1. Coalesce the local tensor (one entry per index, sorted).
2. Allgather each rank's metadata: its nnz and its shape; every rank checks that the shapes
   agree (the same check on the same data: every rank raises, or none).
3. Allgather the indices (sparse_dim x nnz, int64) and the values (nnz x dense shape), each
   padded to the largest nnz (zcoll's allgather moves equal blocks).
4. Build one tensor from every rank's entries, coalesce it (adding entries of equal index, in
   rank order on every rank: the same bits everywhere), and copy it into the input tensor.

Cost: three allgathers; bytes on the wire (p - 1) * max_nnz * (8 * sparse_dim + value bytes) per
rank, against the dense size for a dense allreduce: worth it while tensors stay sparse.
"""

from __future__ import annotations

from typing import Any

import torch

_MAX_DIMS = 16  # the metadata block holds nnz, the number of dimensions and up to this many sizes


def allreduce_sum(comm: Any, t: torch.Tensor) -> None:
    """Sums the sparse COO tensor t over every rank of `comm` (a zcoll Communicator), in place."""
    if t.dim() > _MAX_DIMS:
        raise ValueError(f"zcoll all_reduce: a sparse tensor of {t.dim()} dimensions (at most {_MAX_DIMS})")
    local = t.coalesce()
    indices, values = local.indices().contiguous(), local.values().contiguous()
    meta = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64)
    meta[0], meta[1] = local._nnz(), t.dim()
    meta[2 : 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    every = comm.allgather(meta)  # (size, 2 + _MAX_DIMS)
    if not bool((every[:, 1:] == meta[1:]).all()):
        shapes = [tuple(row[2 : 2 + int(row[1])].tolist()) for row in every]
        raise ValueError(f"zcoll all_reduce: sparse tensors of different shapes on the ranks: {shapes}")
    counts = every[:, 0].tolist()
    most = max(counts)
    padded_indices = indices.new_zeros((indices.shape[0], most))
    padded_indices[:, : counts[comm.rank]] = indices
    padded_values = values.new_zeros((most, *values.shape[1:]))
    padded_values[: counts[comm.rank]] = values
    all_indices = comm.allgather(padded_indices)  # (size, sparse_dim, most)
    all_values = comm.allgather(padded_values)  # (size, most, *dense)
    summed = torch.sparse_coo_tensor(
        torch.cat([all_indices[r, :, :n] for r, n in enumerate(counts)], dim=1),
        torch.cat([all_values[r, :n] for r, n in enumerate(counts)]),
        t.shape,
        dtype=t.dtype,
    ).coalesce()
    t.copy_(summed)
