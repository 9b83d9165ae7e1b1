"""Error-feedback residuals by parameter, so that they survive a checkpoint and DDP's re-bucketing.

``pycomm.hooks`` keeps one residual per DDP bucket (``CompressionState.residuals``, keyed by
the bucket's index): a flat fp32 tensor laid out as the bucket's gradients. That layout is
DDP's, made anew in every process and made again once after the first step (by the order in
which gradients became ready), so a bucket index means nothing to another process, and after
the re-layout not even to this one. This module records which parameter each slice of a
bucket belongs to, on every hook call, and keeps the residuals attached to their parameters:

- a checkpoint stores each parameter's slice (``by_parameter``), not the buckets;
- a resumed run puts the slices back (``restore``) into whichever bucket holds each parameter,
  at that bucket's first hook call;
- when DDP re-lays the buckets, the residuals are moved to the new layout the same way,
  so a run and its resumed copy apply the same residual to the same parameter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist

HookFn = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
Slice = tuple[int, int, int]  # (parameter index, offset in the bucket, elements)


class ResidualLayout:
    """Tracks the bucket layout of one DDP model's error-feedback hook (see the module doc)."""

    def __init__(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        self._index = {p.data_ptr(): i for i, p in enumerate(parameters)}
        self._buckets: dict[int, list[Slice]] = {}
        self._pending: dict[int, torch.Tensor] = {}  # parameter index -> its residual slice
        self._paused = False

    def wrap(self, hook: HookFn) -> HookFn:
        # Unannotated, as in hooks.CommTimer.wrap: DDP inspects a hook's annotations.
        def tracked_hook(state, bucket):  # type: ignore[no-untyped-def]
            if not self._paused:
                self._observe(state.residuals, bucket)
            return hook(state, bucket)

        return cast(HookFn, tracked_hook)

    def _observe(self, residuals: dict[int, torch.Tensor], bucket: dist.GradBucket) -> None:
        slices: list[Slice] = []
        offset = 0
        # A bucket's buffer is its gradients back to back, in the order of its parameters.
        for param in bucket.parameters():
            slices.append((self._index[param.data_ptr()], offset, param.numel()))
            offset += param.numel()
        buffer = bucket.buffer()
        if offset != buffer.numel():
            raise RuntimeError(f"DDP bucket {bucket.index()} holds {buffer.numel()} elements, its parameters {offset}")
        known = self._buckets.get(bucket.index())
        if known is not None and known != slices:
            # DDP re-laid its buckets: every residual goes back to its parameters first.
            self._detach(residuals)
            self._buckets = {}
        self._buckets[bucket.index()] = slices
        if any(index in self._pending for index, _, _ in slices):
            residual = torch.zeros(buffer.numel(), dtype=torch.float32)
            for index, start, count in slices:
                piece = self._pending.pop(index, None)
                if piece is not None:
                    residual[start : start + count] = piece.reshape(-1)
            residuals[bucket.index()] = residual

    def _detach(self, residuals: dict[int, torch.Tensor]) -> None:
        for bucket_index, slices in self._buckets.items():
            residual = residuals.pop(bucket_index, None)
            if residual is not None:
                flat = residual.reshape(-1)
                for index, start, count in slices:
                    self._pending[index] = flat[start : start + count].clone()

    def by_parameter(self, residuals: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Each parameter's residual slice (copies), for a checkpoint."""
        pieces = {index: piece.clone() for index, piece in self._pending.items()}
        for bucket_index, slices in self._buckets.items():
            residual = residuals.get(bucket_index)
            if residual is not None:
                flat = residual.reshape(-1)
                for index, start, count in slices:
                    pieces[index] = flat[start : start + count].clone()
        return pieces

    @contextlib.contextmanager
    def set_aside(self, state: Any) -> Iterator[None]:
        """Hook calls inside neither read nor change the residuals (nor this layout)."""
        kept, self._paused = state.residuals, True
        state.residuals = {}
        try:
            yield
        finally:
            state.residuals, self._paused = kept, False

    def restore(self, pieces: dict[int, torch.Tensor]) -> None:
        """Residuals from a checkpoint: each goes into its parameter's bucket at its next hook call."""
        unknown = set(pieces) - set(self._index.values())
        if unknown:
            raise RuntimeError(f"checkpoint has residuals for parameters {sorted(unknown)} this model lacks")
        self._pending = dict(pieces)
