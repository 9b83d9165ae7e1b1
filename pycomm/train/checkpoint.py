"""Checkpoints of a training run: written atomically by rank 0, read by every rank on resume.

A checkpoint directory holds:

- ``step-NNNNNN.pt``: a complete checkpoint after NNNNNN optimizer steps (``torch.save`` of a
  dict: the header below, model, optimizer, RNG states, data position, error-feedback
  residuals, and the run's history so far).
- ``latest``: JSON naming the newest complete checkpoint, its SHA-256 and its header. It is
  replaced only after the checkpoint it names is on disk, so it never names a partial file.
- ``.tmp-*``: a write in progress, or one that a crash interrupted; never read, and removed by
  the next write.

Every write goes to a temporary file in the directory, is fsynced, then renamed onto its final
name (``os.replace``, atomic on POSIX), and the directory is fsynced: a crash at any point
leaves the previous ``latest`` and the file it names intact. The directory must be the same
one for every rank (a shared filesystem across hosts): every rank reads the checkpoint itself.

The header is what a resume must agree with (model preset, world size, pycomm version and the
settings that shape the batches); the CLI checks it before any rank starts, so a mismatch is a
one-line usage error, as is a checkpoint whose bytes do not match the recorded SHA-256.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import random
import re
import sys
import tempfile
from typing import Any

import torch

import pycomm
from pycomm.train.config import TrainConfig

FORMAT = "pycomm.train.checkpoint/1"
LATEST = "latest"
KEEP = 2  # complete checkpoints kept: the newest, and one before it
_NAME = re.compile(r"^step-(\d{6,})\.pt$")
_TMP_PREFIX = ".tmp-"


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed from; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Header:
    """What a checkpoint is from. A run resumes only from one whose header agrees with it."""

    step: int  # optimizer steps done
    model: str
    world_size: int
    pycomm_version: str
    accum_steps: int
    batch_size: int
    seed: int
    hook: str
    error_feedback: bool
    format: str = FORMAT

    @classmethod
    def of_run(cls, config: TrainConfig, world: int, step: int) -> Header:
        of_config = ("model", "accum_steps", "batch_size", "seed", "hook", "error_feedback")
        return cls(
            step=step, world_size=world, pycomm_version=pycomm.__version__,
            **{name: getattr(config, name) for name in of_config},
        )

    def mismatch(self, config: TrainConfig, world: int) -> str | None:
        """What in this checkpoint disagrees with the run about to start, or None."""
        if self.format != FORMAT:
            return f"format {self.format!r}, this trainer reads {FORMAT!r}"
        if self.pycomm_version != pycomm.__version__:
            return f"pycomm {self.pycomm_version}, this is pycomm {pycomm.__version__}"
        ours = Header.of_run(config, world, self.step)
        for field, flag in (
            ("model", "--model"),
            ("world_size", "world size"),
            ("accum_steps", "--accum-steps"),
            ("batch_size", "--batch-size"),
            ("seed", "--seed"),
            ("hook", "--hook"),
            ("error_feedback", "--error-feedback"),
        ):
            theirs, mine = getattr(self, field), getattr(ours, field)
            if theirs != mine:
                return f"{flag} {theirs}, this run has {mine}"
        if self.step > config.steps:
            return f"{self.step} steps done, past this run's --steps {config.steps}"
        return None


@dataclasses.dataclass(frozen=True)
class Latest:
    """The newest complete checkpoint of a directory, as ``latest`` names it."""

    path: str
    sha256: str
    header: Header


def find_latest(directory: str) -> Latest | None:
    """The checkpoint ``latest`` names, or None when the directory holds none."""
    pointer = os.path.join(directory, LATEST)
    try:
        with open(pointer, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        entry = json.loads(text)
        name = entry["file"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"bad file name {name!r}")
        header = Header(**entry["header"])
        digest = str(entry["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{pointer} is corrupt ({' '.join(str(exc).split())})") from None
    return Latest(os.path.join(directory, name), digest, header)


def resume_point(directory: str, config: TrainConfig, world: int, required: bool) -> Latest | None:
    """The checkpoint a run with ``config`` at ``world`` ranks resumes from, checked; None: none.

    Raises CheckpointError for a checkpoint from another run or one whose bytes are damaged,
    and when ``required`` (``--resume``) but the directory holds no checkpoint.
    """
    latest = find_latest(directory)
    if latest is None:
        if required:
            raise CheckpointError(f"--resume: no checkpoint in {directory} (no {LATEST} file)")
        return None
    problem = latest.header.mismatch(config, world)
    if problem is not None:
        raise CheckpointError(
            f"checkpoint {latest.path} is from another run: {problem} (use another --checkpoint-dir to start afresh)"
        )
    read_verified(latest)
    return latest


def read_verified(latest: Latest) -> bytes:
    """The checkpoint's bytes, after checking them against the SHA-256 recorded in ``latest``."""
    try:
        with open(latest.path, "rb") as f:
            blob = f.read()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {latest.path} cannot be read: {exc.strerror or exc}") from None
    digest = hashlib.sha256(blob).hexdigest()
    if digest != latest.sha256:
        raise CheckpointError(
            f"checkpoint {latest.path} is truncated or corrupt: {len(blob)} bytes with sha256 {digest[:12]}..., "
            f"{LATEST} records {latest.sha256[:12]}..."
        )
    return blob


def load(latest: Latest) -> dict[str, Any]:
    """The checkpoint's contents (tensors on the CPU), its bytes checked first."""
    blob = read_verified(latest)
    try:
        # weights_only: tensors, containers and numbers only; a checkpoint runs no code.
        state: dict[str, Any] = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a malformed archive; all mean the same here
        raise CheckpointError(f"checkpoint {latest.path} cannot be loaded: {' '.join(str(exc).split())[:200]}") from None
    if Header(**state.get("header", {})) != latest.header:
        raise CheckpointError(f"checkpoint {latest.path} does not match the header in {LATEST}")
    return state


def rng_states() -> dict[str, Any]:
    """This process's random generators: torch's, Python's, and numpy's when numpy is loaded.

    The trainer draws its batches from generators seeded per step (data.batch_seed), so none of
    these decides a batch; they are saved so that anything else drawing from them resumes too.
    Stored as tensors and numbers: a weights_only load takes nothing else.
    """
    version, internal, gauss = random.getstate()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                           "has_gauss": int(has_gauss), "cached": float(cached)}
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    python = states["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    if "numpy" in states:
        import numpy

        saved = states["numpy"]
        keys = saved["keys"].numpy().astype(numpy.uint32)
        numpy.random.set_state((saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached"]))


def save(directory: str, header: Header, state: dict[str, Any]) -> str:
    """Write a checkpoint and point ``latest`` at it; returns its path. Rank 0 only."""
    os.makedirs(directory, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({"header": dataclasses.asdict(header), **state}, buffer)
    blob = buffer.getvalue()
    name = f"step-{header.step:06d}.pt"
    _remove_stale_temporaries(directory)
    _write_atomically(directory, name, blob)
    pointer = {"file": name, "sha256": hashlib.sha256(blob).hexdigest(), "header": dataclasses.asdict(header)}
    _write_atomically(directory, LATEST, (json.dumps(pointer, indent=1) + "\n").encode())
    _prune(directory, keep=name)
    return os.path.join(directory, name)


def _write_atomically(directory: str, name: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename itself is durable only once the directory is.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _remove_stale_temporaries(directory: str) -> None:
    # Only rank 0 writes, one checkpoint at a time: any temporary here is a crashed write's.
    for entry in os.listdir(directory):
        if entry.startswith(_TMP_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))


def _prune(directory: str, keep: str) -> None:
    """Remove all but the KEEP newest checkpoints (``keep``, just written, always stays)."""
    steps = sorted((int(m.group(1)), entry) for entry in os.listdir(directory) if (m := _NAME.match(entry)))
    for _, entry in steps[:-KEEP]:
        if entry != keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))
