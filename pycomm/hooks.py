"""Drop-in DDP gradient-compression hooks: ``ddp.register_comm_hook(state, pycomm.hooks.fp8_hook)``.

Each hook averages the bucket over the group (it divides by the world size itself) and returns a
future holding one tensor of the bucket's shape. On a pycomm group it uses the compressed all-reduce
that rounds exactly twice (pycomm.all_reduce); on any other group (gloo, nccl) it falls back to
"round through the codec, then all_reduce in the wire dtype" for fp16/bf16, and for fp8 to rounding
through the block-scaled codec locally followed by an fp32 all_reduce (same numerics class, no
bandwidth saved: those backends cannot sum fp8).

With ``error_feedback=True`` the state keeps, per bucket, the fp32 residual between what this rank
wanted to send and what the codec let through, and adds it to the next step's gradient (one fp32
copy of the gradients in all). On a pycomm group with CPU tensors the core does it inside the
encoding (no extra passes over the bucket in Python); with several ranks a host what is encoded is
the host's sum of a slice, so the residual is that rounding's error, kept by the rank that made it.
For CUDA tensors (and on other backends) the residual stays in Python and is this rank's own
rounding error, which with several ranks a host is only an approximation of the rounding made.
"""

# No `from __future__ import annotations` here: DDP inspects the hooks' annotations at runtime
# and wants the real dist.GradBucket and torch.futures.Future[torch.Tensor] objects.
import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from pycomm import _C
from pycomm.collectives import pycomm_backend

FP8_CODECS = ("fp8_e4m3", "fp8_e5m2")


@dataclasses.dataclass
class CompressionState:
    """State shared by a DDP model's hook calls."""

    process_group: dist.ProcessGroup | None = None
    error_feedback: bool = False
    fp8_format: str = "fp8_e4m3"  # or "fp8_e5m2", for fp8_hook
    residuals: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fp8_format not in FP8_CODECS:
            raise ValueError(f"pycomm: fp8_format must be one of {', '.join(FP8_CODECS)}, got {self.fp8_format!r}")


def _roundtrip(codec: str, x: torch.Tensor) -> torch.Tensor:
    """What the codec lets through of x (fp32 in, fp32 out)."""
    if codec == "fp16":
        return x.to(torch.float16).to(torch.float32)
    if codec == "bf16":
        return x.to(torch.bfloat16).to(torch.float32)
    flat = x.detach().reshape(-1).contiguous()
    return _C.codec_decode(codec, _C.codec_encode(codec, flat), flat.numel()).view_as(x)


def _compressed_allreduce(state: "CompressionState", codec: str, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = state.process_group
    buffer: torch.Tensor = bucket.buffer()
    world = dist.get_world_size(group)
    original_dtype = buffer.dtype
    grad = buffer if buffer.dtype == torch.float32 else buffer.to(torch.float32)

    backend = pycomm_backend(group)
    in_core = backend is not None and grad.device.type == "cpu"
    residual: torch.Tensor | None = None
    if state.error_feedback:
        residual = state.residuals.get(bucket.index())
        if residual is None or residual.shape != grad.shape:
            residual = torch.zeros_like(grad)
            state.residuals[bucket.index()] = residual
        if not in_core:
            grad = grad + residual
            # The residual is what this rank's encoding drops; it is added back next step.
            state.residuals[bucket.index()] = grad - _roundtrip(codec, grad)
            residual = None

    if backend is not None:
        work = backend.allreduce_compressed(grad, dist.ReduceOp.AVG, codec, residual)
        fut = work.get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            result = f.value()[0]
            if original_dtype != torch.float32:
                result = result.to(original_dtype)
            buffer.copy_(result)
            return buffer

        return fut.then(done)

    # Another backend: cast to the wire dtype where the backend can sum it, else round locally.
    if codec in ("fp16", "bf16"):
        wire = grad.to(torch.float16 if codec == "fp16" else torch.bfloat16).div_(world)
    else:
        wire = _roundtrip(codec, grad).div_(world)
    fut = dist.all_reduce(wire, group=group, async_op=True).get_future()

    def cast_back(f: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(cast_back)


def fp16_hook(state: CompressionState | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average gradients over the group, sent as fp16."""
    return _compressed_allreduce(state or CompressionState(), "fp16", bucket)


def bf16_hook(state: CompressionState | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average gradients over the group, sent as bf16."""
    return _compressed_allreduce(state or CompressionState(), "bf16", bucket)


def fp8_hook(state: CompressionState | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average gradients over the group, sent as block-scaled fp8 (state.fp8_format)."""
    state = state or CompressionState()
    return _compressed_allreduce(state, state.fp8_format, bucket)
