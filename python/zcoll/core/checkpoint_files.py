"""Checkpoint files on disk, without torch: atomic writes, the manifest that commits a checkpoint,
and the newest complete checkpoint of a directory. ``zcoll.torch.checkpoint`` writes and reads
through this module; ``zcoll run`` uses it to say where a restarted job resumes.

Layout of a checkpoint directory::

    DIR/step-0000000040.json                  the manifest, written last (the commit point)
    DIR/step-0000000040/replicated-<tag>.pt   the state every rank holds alike (written by rank 0)
    DIR/step-0000000040/rank00001-<tag>.pt    each rank's own state

1. Every file is written to a temporary name in its own directory, flushed and fsync'd, then
   renamed over its final name (and the directory fsync'd): a file is either absent or whole.
2. A part's name carries a random tag, so a later attempt at the same step writes beside an
   earlier attempt's files instead of over them: a manifest always names the files it was made for.
3. The manifest lists every part with its size and sha256. Rank 0 writes it only after every rank
   reported its part, so a crash in the middle of a save leaves no manifest: that step was never
   checkpointed and :func:`latest` returns the one before.
4. :func:`latest` is the newest manifest whose parts all exist with their sizes; reading a part
   (:func:`read_part`) checks its sha256 too.
5. :func:`prune` (rank 0, after a commit) keeps the newest `keep` checkpoints and deletes older
   ones, step directories that never got a manifest, and unlisted files of earlier attempts. It
   never touches steps above the one just committed: other ranks may be writing them already.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional

FORMAT = "zcoll-checkpoint-1"
_MANIFEST = re.compile(r"^step-(\d{10})\.json$")


def step_name(step: int) -> str:
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint step must be an integer >= 0, got {step!r}")
    return f"step-{step:010d}"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Writes data to path so that path is either its old self or all of data (step 1)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def write_part(directory: Path, step: int, name: str, data: bytes) -> Dict[str, object]:
    """Writes one part of the checkpoint of `step` (step 2); returns its manifest entry."""
    folder = Path(directory) / step_name(step)
    folder.mkdir(parents=True, exist_ok=True)
    rel = f"{folder.name}/{name}-{uuid.uuid4().hex[:12]}.pt"
    write_atomic(Path(directory) / rel, data)
    return {"file": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint: where its manifest is, its step and world size, and its parts."""

    path: Path
    step: int
    world_size: int
    created: float
    replicated: Dict[str, object]
    ranks: List[Dict[str, object]]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def parts(self) -> List[Dict[str, object]]:
        return [self.replicated, *self.ranks]

    def complete(self) -> bool:
        """Every part is present with the size the manifest gives (step 4)."""
        for part in self.parts():
            f = self.directory / str(part["file"])
            if not f.is_file() or f.stat().st_size != part["bytes"]:
                return False
        return True


def commit(directory: Path, step: int, replicated: Dict[str, object], ranks: List[Dict[str, object]]) -> Path:
    """Writes the manifest of `step` (step 3): from this moment the checkpoint exists."""
    body = {
        "format": FORMAT,
        "step": step,
        "world_size": len(ranks),
        "created": time.time(),
        "replicated": replicated,
        "ranks": ranks,
    }
    path = Path(directory) / f"{step_name(step)}.json"
    write_atomic(path, json.dumps(body, indent=1).encode())
    return path


def read_manifest(path: Path) -> Manifest:
    """The manifest at path; ValueError when it is not one of ours."""
    path = Path(path)
    try:
        body = json.loads(path.read_text())
        if body.get("format") != FORMAT:
            raise ValueError(f"format {body.get('format')!r}, expected {FORMAT!r}")
        return Manifest(
            path,
            int(body["step"]),
            int(body["world_size"]),
            float(body["created"]),
            body["replicated"],
            body["ranks"],
        )
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a zcoll checkpoint manifest: {e}") from None


def _manifests(directory: Path) -> List[Manifest]:
    """Every readable manifest in directory, oldest step first (incomplete ones included)."""
    found = []
    if Path(directory).is_dir():
        for f in Path(directory).iterdir():
            if _MANIFEST.match(f.name):
                try:
                    found.append(read_manifest(f))
                except ValueError:
                    continue  # not ours, or unreadable: not a checkpoint
    return sorted(found, key=lambda m: m.step)


def checkpoints(directory: Path) -> List[Manifest]:
    """The complete checkpoints in directory, oldest step first."""
    return [m for m in _manifests(directory) if m.complete()]


def latest(directory: Path) -> Optional[Manifest]:
    """The complete checkpoint with the highest step in directory, or None."""
    done = checkpoints(directory)
    return done[-1] if done else None


def newest_under(directory: Path) -> Optional[Manifest]:
    """The most recently written complete checkpoint in directory or any folder below it (for
    reports: a job may keep several checkpoint series in subdirectories)."""
    found = [m for d, _, _ in os.walk(directory) for m in checkpoints(Path(d))]
    return max(found, key=lambda m: m.created, default=None)


def read_part(manifest: Manifest, part: Dict[str, object]) -> bytes:
    """The bytes of one part; ValueError when they are not the ones the manifest lists."""
    f = manifest.directory / str(part["file"])
    data = f.read_bytes()
    if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
        raise ValueError(
            f"checkpoint part {f} does not match its manifest {manifest.path} (changed or truncated)"
        )
    return data


def _remove(paths: Iterable[Path]) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def prune(directory: Path, committed: int, keep: int) -> None:
    """Deletes what no kept checkpoint needs, at or below step `committed` (step 5)."""
    directory = Path(directory)
    done = [m for m in checkpoints(directory) if m.step <= committed]
    kept = done[-keep:] if keep > 0 else done
    kept_steps = {m.step for m in kept}
    for m in _manifests(directory):
        if m.step < committed and m.step not in kept_steps:
            _remove([m.path])  # the manifest first: a crash below leaves files, never a false checkpoint
    for folder in directory.glob("step-*"):
        match = re.fullmatch(r"step-(\d{10})", folder.name)
        if not match or not folder.is_dir() or int(match.group(1)) > committed:
            continue
        step = int(match.group(1))
        if step not in kept_steps:
            _remove([folder])
            continue
        listed = {Path(str(p["file"])).name for m in kept if m.step == step for p in m.parts()}
        _remove(f for f in folder.iterdir() if f.name not in listed)
