"""The corpus: the standard library's own .py files, as bytes.

Every machine with Python has this text, so the trainer needs no download.
Tokens are bytes (vocabulary 256): the stdlib is nearly all ASCII, so bytes are
characters, and a fixed vocabulary needs no tokenizer state shared between ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig
from pathlib import Path

import torch

VOCAB_SIZE = 256
VAL_FRACTION = 0.10

# Not the standard library (third-party installs live under the stdlib dir on
# most layouts) or not source; pruned while walking so site-packages is never read.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8, 1-D
    val: torch.Tensor  # uint8, 1-D
    train_files: int
    val_files: int
    sha256: str  # of the files' names and bytes, in order: ranks compare it

    def describe(self) -> dict[str, object]:
        return {
            "source": "stdlib .py files, sorted by path",
            "train_files": self.train_files,
            "val_files": self.val_files,
            "train_tokens": int(self.train.numel()),
            "val_tokens": int(self.val.numel()),
            "sha256": self.sha256,
        }


def stdlib_sources(root: str | None = None) -> list[Path]:
    """The stdlib's .py files, sorted by their path relative to the stdlib root."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for directory, subdirs, files in os.walk(base):
        subdirs[:] = [d for d in subdirs if d not in _SKIP_DIRS]
        for name in files:
            if name.endswith(".py"):
                path = Path(directory, name)
                found.append((path.relative_to(base).as_posix(), path))
    # Sort on the relative posix path, not os.walk order (filesystem-dependent).
    found.sort(key=lambda item: item[0])
    return [path for _, path in found]


def load_corpus(max_bytes: int, context: int, root: str | None = None) -> Corpus:
    """The first files (by path) up to ``max_bytes``; the last 10% of them are held out.

    The split is by file, not by offset, so validation text never shares a file
    with training text. Whole files only: the cap stops before the first file
    that would cross it, so the corpus does not depend on where a file is cut.
    """
    files = stdlib_sources(root)
    chosen: list[tuple[str, bytes]] = []
    total = 0
    base = Path(root or sysconfig.get_paths()["stdlib"])
    for path in files:
        data = path.read_bytes()
        if total + len(data) > max_bytes and chosen:
            break
        chosen.append((path.relative_to(base).as_posix(), data))
        total += len(data)
    if len(chosen) < 2:
        raise RuntimeError(f"standard library under {base} has too little source to train on")
    n_val = max(1, round(len(chosen) * VAL_FRACTION))
    digest = hashlib.sha256()
    for name, data in chosen:
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    train = _tokens(data for _, data in chosen[:-n_val])
    val = _tokens(data for _, data in chosen[-n_val:])
    for split, tokens in (("training", train), ("validation", val)):
        if tokens.numel() <= context + 1:
            raise RuntimeError(f"{split} split has {tokens.numel()} bytes, fewer than one context window")
    return Corpus(train, val, len(chosen) - n_val, n_val, digest.hexdigest())


def _tokens(chunks: object) -> torch.Tensor:
    blob = b"".join(chunks)  # type: ignore[arg-type]
    # bytearray: torch.frombuffer wants a writable buffer (bytes would warn).
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone()


def batch_seed(seed: int, rank: int, step: int) -> int:
    """The generator seed of rank's batch at step (0-based): a pure function of the three.

    So a run resumed at any step draws the batches an uninterrupted run would
    have, with no generator state to save. Ranks draw different windows (else
    data parallelism would be the same batch world times over). A hash, not
    arithmetic: nearby (seed, rank, step) triples get unrelated seeds.
    """
    digest = hashlib.blake2b(f"pycomm.train/{seed}/{rank}/{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # below 2**63: manual_seed takes int64-range values


def train_batch(
    tokens: torch.Tensor, batch_size: int, context: int, seed: int, rank: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows for (seed, rank, step): inputs and next-byte targets, both (batch, context) int64.

    ``step`` counts micro-batches from 0: with ``--accum-steps K`` optimizer step s draws
    s*K .. s*K+K-1, so with K = 1 it is the step, and the data position a checkpoint records is
    just the number of micro-batches drawn.
    """
    generator = torch.Generator().manual_seed(batch_seed(seed, rank, step))
    # A window is context + 1 bytes (inputs and the byte after each), so the
    # last start is numel - context - 1; randint's high is exclusive.
    starts = torch.randint(0, tokens.numel() - context, (batch_size,), generator=generator)
    return _windows(tokens, starts, context)


def val_batch(
    tokens: torch.Tensor, n_windows: int, context: int, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of a fixed set of evenly spaced validation windows.

    The same windows every evaluation and for every world size (ranks take
    every world-th one), so validation losses are comparable across runs.
    """
    span = tokens.numel() - context - 1
    starts = torch.linspace(0, span, n_windows).long()[rank::world]
    return _windows(tokens, starts, context)


def _windows(tokens: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = torch.arange(context + 1)
    rows = tokens[starts[:, None] + offsets[None, :]].long()
    return rows[:, :-1], rows[:, 1:]
