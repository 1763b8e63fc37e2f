"""Checkpoints of DDP training that resume bit-exactly: :func:`save`, :func:`load`, :func:`latest`.

One checkpoint holds everything the next step depends on:

- replicated (the same on every rank; rank 0 writes it): the model's parameters and buffers,
  the optimizer's state, the gradient-accumulation counter, the data position and ``extra``;
- per rank (each rank writes its own): the compression state (error-feedback residuals and call
  counts, ``CompressionState.state_dict()``; they differ between ranks) and the random number
  generators (torch, numpy, Python's ``random``; CUDA's when initialised).

Saving is atomic (``zcoll.checkpoint_files``: each part written to a temporary file, fsync'd and
renamed; a manifest listing every part, written by rank 0 after all ranks reported, commits the
checkpoint). A save interrupted anywhere leaves the previous checkpoint as the latest one. The
ranks report to each other through torch's default group when there is one, so a rank stopped
or killed in the middle of a save or load makes the others raise at the group's timeout (MPI's
own collectives would wait forever); the chaos run (docs/errors.md) kills and stops ranks there.

Resuming:

1. With the same number of ranks, rank r gets back exactly what it saved: the next step computes
   the same bits as the uninterrupted run would have.
2. With another number of ranks (``zcoll run --min-ranks``), the replicated state loads as is and
   each rank takes the random generators of the old rank with its number (new ranks beyond the
   old count keep their own). Per-rank compression state cannot map one to one: every floating
   point tensor in it becomes the **mean over the old ranks** on every new rank (a residual missing
   on a rank counts as zero); counters are taken from old rank 0. For error feedback under an
   average (what the DDP hooks compute) this keeps the correction still owed exactly: the next
   average would have added mean_r(e_r), and with every new rank holding mean_r(e_r) it still
   does. A warning says so. The data position is whatever the script saved; save it in samples
   (not batches) so that it stays right when the global batch changes with the rank count.
3. DDP puts all gradients in one bucket for its first synchronised backward and rebuilds its
   buckets afterwards (in the order gradients became ready). A resumed process would run its first
   step in that initial layout where the uninterrupted run used the rebuilt one, which changes
   compressed results (quantization blocks, the positions error-feedback residuals apply to).
   A CompressionState restored from a checkpoint handles that itself: until DDP has rebuilt its
   buckets, its hook compresses the initial bucket as the saved buckets it is made of (each
   under its own key, in its own order), so the resumed run computes bit for bit what the
   uninterrupted one did (tested). ``rebuild_buckets=`` (one forward and backward through the
   DDP model on any batch, run before the state is restored and then overwritten by it) is
   still accepted, for hooks of one's own that depend on the layout.
4. Save only between updates: with gradient accumulation, ``save`` refuses a call in the middle of
   an update (the accumulated gradients are not part of a checkpoint).

Example::

    ckpt_dir = zcoll._C.env_get("ZCOLL_CHECKPOINT_DIR") or "ckpt"      # set by `zcoll run`
    resumed = zcoll.torch.checkpoint.load(ckpt_dir, model=ddp, optimizer=opt, compression_state=state,
                                          rebuild_buckets=lambda: loss_fn(ddp(x0), y0).backward())
    start = resumed.data_position if resumed else 0
    for step, batch in enumerate(batches(start), start=resumed.step if resumed else 0):
        ...
        if step % 100 == 0:
            zcoll.torch.checkpoint.save(ckpt_dir, step, model=ddp, optimizer=opt,
                                        compression_state=state, data_position=...)
"""

from __future__ import annotations

import io
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from ..core import checkpoint_files as files
from ..core.checkpoint_files import Manifest
from . import _launch
from .accumulate import AccumulationSchedule

__all__ = ["Resumed", "latest", "load", "save"]


def latest(directory: Union[str, Path]) -> Optional[Manifest]:
    """The newest complete checkpoint in directory (its manifest: ``.step``, ``.world_size``,
    ``.path``), or None."""
    return files.latest(Path(directory))


@dataclass
class Resumed:
    """What :func:`load` restored: the step and data position to continue from, ``extra`` as
    saved, and the world sizes (``resized``: the rank count changed since the save)."""

    path: Path
    step: int
    data_position: Any
    extra: Any
    saved_world_size: int
    world_size: int

    @property
    def resized(self) -> bool:
        return self.saved_world_size != self.world_size


# -- how the ranks agree ----------------------------------------------------------------------------
class _GroupExchange:
    """gather / bcast of small objects through torch.distributed's default group, in the shape of
    mpi4py's: its collectives run under the group's timeout, so a rank that stops in the middle of
    a save or load makes the others raise instead of waiting in MPI forever."""

    def __init__(self) -> None:
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out if self.rank == root else None

    def bcast(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=root)
        return box[0]


def _exchange(comm: Any) -> Any:
    """`comm` when given (an mpi4py communicator), else torch's default group when there is one,
    else the MPI world that torch's ranks refer to."""
    if comm is not None:
        return comm
    if dist.is_available() and dist.is_initialized():
        return _GroupExchange()
    return _launch.world_comm()


# -- what goes into a checkpoint ------------------------------------------------------------------
def _module(model: Any) -> torch.nn.Module:
    """The module inside DDP (its state_dict keys carry no ``module.`` prefix)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _schedule(accumulator: Any, optimizer: Any) -> Optional[AccumulationSchedule]:
    """The accumulation counter of `accumulator`, else of `optimizer` (zcoll.torch.optim and
    GradientAccumulator carry one); None when neither accumulates."""
    obj = accumulator if accumulator is not None else optimizer
    if isinstance(obj, AccumulationSchedule):
        return obj
    for attr in ("schedule", "_accumulation"):  # GradientAccumulator, zcoll.torch.optim
        found = getattr(obj, attr, None)
        if isinstance(found, AccumulationSchedule):
            return found
    if accumulator is not None:
        raise TypeError(
            f"accumulator: expected a zcoll accumulating optimizer, got {type(accumulator).__name__}"
        )
    return None


def _tensors_for_numpy(obj: Any) -> Any:
    """numpy arrays and scalars as tensors and numbers, so the file loads with weights_only=True."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _tensors_for_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tensors_for_numpy(v) for v in obj)
    return obj


def _rng_state() -> Dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _serialise(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _deserialise(manifest: Manifest, part: Dict[str, object]) -> Any:
    return torch.load(io.BytesIO(files.read_part(manifest, part)), weights_only=True)


# -- save ---------------------------------------------------------------------------------------
def save(
    directory: Union[str, Path],
    step: int,
    *,
    model: Any = None,
    optimizer: Any = None,
    compression_state: Any = None,
    accumulator: Any = None,
    data_position: Any = None,
    extra: Any = None,
    keep: int = 2,
    comm: Any = None,
) -> Path:
    """Saves a checkpoint of `step` into directory, collectively (every rank calls it); returns
    the manifest's path on every rank.

    1. Each rank writes its part (RNG states, compression state); rank 0 also the replicated part
       (model, optimizer, accumulation counter, data position, extra). Atomic writes.
    2. The ranks report their parts to rank 0 (a gather on `comm`, an mpi4py communicator; by
       default torch's default group, under its timeout, or the MPI world when torch.distributed
       is not initialised); rank 0 writes the manifest (the commit), then keeps the newest
       `keep` checkpoints and deletes the rest.
    3. Every rank learns the outcome: a rank that failed to write makes every rank raise, and the
       checkpoint is not committed.

    data_position and extra: tensors, numbers, strings, lists, tuples, dicts (numpy arrays are
    stored as tensors). compression_state: anything with ``state_dict()`` (a CompressionState).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the checkpoint just written), got {keep}")
    files.step_name(step)  # validates
    schedule = _schedule(accumulator, optimizer)
    if schedule is not None and not schedule.at_boundary:
        raise ValueError(
            f"checkpoint.save at step {step}: {schedule.micro} of {schedule.steps} micro-batches are "
            "accumulated; save right after an update (optimizer.updated): accumulated gradients are not saved"
        )
    comm = _exchange(comm)
    directory = Path(directory)
    parts, error = _write_parts(
        directory, step, comm, model, optimizer, compression_state, schedule, data_position, extra
    )
    reports = comm.gather((parts, error), root=0)
    status, detail = comm.bcast(_commit(directory, step, keep, reports) if comm.rank == 0 else None, root=0)
    if status != "ok":
        raise RuntimeError(f"zcoll checkpoint of step {step} in {directory} not saved: {detail}")
    return Path(detail)


def _write_parts(directory: Path, step: int, comm: Any, model: Any, optimizer: Any, compression_state: Any,
                 schedule: Any, data_position: Any, extra: Any) -> tuple:  # fmt: skip
    """save()'s step 1: (this rank's part paths, None), or (None, what failed)."""
    try:
        rank_state = {
            "rank": comm.rank,
            "rng": _rng_state(),
            "compression": _tensors_for_numpy(compression_state.state_dict()) if compression_state else None,
        }
        parts = [files.write_part(directory, step, f"rank{comm.rank:05d}", _serialise(rank_state))]
        if comm.rank == 0:
            replicated = {
                "step": step,
                "world_size": comm.size,
                "model": _module(model).state_dict() if model is not None else None,
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "accumulation": {"steps": schedule.steps, "micro": schedule.micro} if schedule else None,
                "data_position": _tensors_for_numpy(data_position),
                "extra": _tensors_for_numpy(extra),
            }
            parts.append(files.write_part(directory, step, "replicated", _serialise(replicated)))
        return parts, None
    except Exception as e:  # reported to every rank below, so nobody waits for a rank that failed
        return None, f"rank {comm.rank}: {type(e).__name__}: {e}"


def _commit(directory: Path, step: int, keep: int, reports: List[Any]) -> tuple:
    """Rank 0: ("ok", manifest path) once the manifest is written, else ("error", why)."""
    errors = [error for _, error in reports if error]
    if errors:
        return ("error", "; ".join(errors))
    try:
        ranks, replicated = [parts[0] for parts, _ in reports], reports[0][0][1]
        path = files.commit(directory, step, replicated, ranks)
    except Exception as e:
        return ("error", f"rank 0: {type(e).__name__}: {e}")
    try:
        files.prune(directory, step, keep)
    except OSError as e:  # the checkpoint stands; older files stay behind
        warnings.warn(f"zcoll checkpoint: could not delete old checkpoints in {directory}: {e}", stacklevel=3)
    return ("ok", str(path))


# -- load -----------------------------------------------------------------------------------------
def _mean_over_ranks(states: List[Any]) -> Any:
    """Per-rank state for another rank count (module docstring, 2.): floating tensors averaged over
    the old ranks (missing = zero), everything else from the first rank that has it."""
    present = [s for s in states if s is not None]
    if not present:
        return None
    first = present[0]
    if isinstance(first, dict):
        keys = list(dict.fromkeys(k for s in present for k in s))
        return {
            k: _mean_over_ranks([s.get(k) for s in present] + [None] * (len(states) - len(present)))
            for k in keys
        }
    if isinstance(first, torch.Tensor) and first.is_floating_point():
        total = torch.zeros(first.shape, dtype=torch.float64)
        for s in present:
            if s.shape != first.shape:
                raise ValueError(
                    f"per-rank state of shapes {tuple(first.shape)} and {tuple(s.shape)} cannot be merged"
                )
            total += s.to(torch.float64)
        return (total / len(states)).to(first.dtype)
    return first


def _rebuild_ddp_buckets(model: Any, forward_backward: Callable[[], Any]) -> None:
    """Runs one synchronised backward so that DDP rebuilds its buckets at the next forward; the
    gradients it leaves are dropped (the caller restores everything else from the checkpoint)."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("rebuild_buckets needs model= to be the DistributedDataParallel module")
    sync = model.require_backward_grad_sync
    model.require_backward_grad_sync = True  # an accumulating optimizer may have switched it off
    try:
        forward_backward()
    finally:
        model.require_backward_grad_sync = sync
    for p in model.parameters():
        p.grad = None


def _choose(source: Path, comm: Any) -> Optional[str]:
    """Rank 0 picks the checkpoint (a manifest file, or the latest in a directory); all agree."""
    chosen = None
    if comm.rank == 0:
        if source.is_file():
            chosen = str(files.read_manifest(source).path)
        else:
            found = files.latest(source)
            chosen = str(found.path) if found else None
    return comm.bcast(chosen, root=0)


def load(
    source: Union[str, Path],
    *,
    model: Any = None,
    optimizer: Any = None,
    compression_state: Any = None,
    accumulator: Any = None,
    rebuild_buckets: Optional[Callable[[], Any]] = None,
    restore_rng: bool = True,
    comm: Any = None,
) -> Optional[Resumed]:
    """Restores the checkpoint at source (a manifest, or a directory: its latest complete
    checkpoint) into the objects given; collective. Returns None when the directory holds no
    complete checkpoint (a fresh start), else a :class:`Resumed`.

    Objects passed must have been saved (else ValueError); state saved but not asked for is left
    alone. Another rank count than at the save: see the module docstring (2.). rebuild_buckets:
    a forward and backward pass through the DDP `model`, run first when there is a checkpoint
    (module docstring, 3.). The ranks agree on the checkpoint as in :func:`save` (2.).
    """
    comm = _exchange(comm)
    chosen = _choose(Path(source), comm)
    if chosen is None:
        return None
    manifest = files.read_manifest(Path(chosen))
    if rebuild_buckets is not None:
        _rebuild_ddp_buckets(model, rebuild_buckets)
    replicated = _deserialise(manifest, manifest.replicated)
    old_size = manifest.world_size
    if old_size == comm.size:
        parts = [_deserialise(manifest, manifest.ranks[comm.rank])]
    else:
        parts = [_deserialise(manifest, part) for part in manifest.ranks]

    def saved(key: str, what: str) -> Any:
        if replicated[key] is None:
            raise ValueError(f"checkpoint {manifest.path} holds no {what}")
        return replicated[key]

    if model is not None:
        _module(model).load_state_dict(saved("model", "model state"))
    if optimizer is not None:
        optimizer.load_state_dict(saved("optimizer", "optimizer state"))
    schedule = _schedule(accumulator, optimizer)
    if schedule is not None and replicated["accumulation"] is not None:
        if replicated["accumulation"]["steps"] != schedule.steps:
            raise ValueError(
                f"checkpoint {manifest.path} accumulated over {replicated['accumulation']['steps']} "
                f"micro-batches, this optimizer over {schedule.steps}"
            )
        schedule.micro = int(replicated["accumulation"]["micro"])
        schedule._set_sync()
    if compression_state is not None:
        _load_compression(compression_state, manifest, parts, old_size, comm)
    if restore_rng:
        _restore_rng(parts, old_size, comm)
    return Resumed(
        manifest.path, manifest.step, replicated["data_position"], replicated["extra"], old_size, comm.size
    )


def _load_compression(
    compression_state: Any, manifest: Any, parts: List[Any], old_size: int, comm: Any
) -> None:
    """Each rank's saved compression state; on another rank count, the mean of the saved ones."""
    states = [p["compression"] for p in parts]
    if any(s is None for s in states):
        raise ValueError(f"checkpoint {manifest.path} holds no compression state")
    if old_size == comm.size:
        compression_state.load_state_dict(states[0])
    else:
        compression_state.load_state_dict(_mean_over_ranks(states))
        if comm.rank == 0:
            warnings.warn(
                f"zcoll checkpoint: saved by {old_size} ranks, resumed on {comm.size}: each rank's "
                f"compression state (error-feedback residuals) is the mean of the {old_size} saved ones",
                stacklevel=2,
            )


def _restore_rng(parts: List[Any], old_size: int, comm: Any) -> None:
    """This rank's saved RNG states (none for a rank the saving job did not have)."""
    own = parts[0] if old_size == comm.size else (parts[comm.rank] if comm.rank < old_size else None)
    if own is not None:
        _set_rng_state(own["rng"])
