"""pycomm's own entry points beside torch.distributed's: per-group settings and fused all-reduce."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pycomm import _C
from pycomm.options import ALGORITHMS


def _backend(group: dist.ProcessGroup | None) -> _C.PycommBackend:
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, _C.PycommBackend):
        raise TypeError(f"pycomm: the group's backend is {pg._get_backend_name()}, not pycomm")
    return backend


def set_algorithm(algorithm: str, group: dist.ProcessGroup | None = None) -> None:
    """Use `algorithm` for the all-reduces issued on `group` after this call (on every rank alike)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"pycomm: unknown algorithm {algorithm!r}; valid values: {', '.join(ALGORITHMS)}")
    _backend(group).set_algorithm(algorithm)


def bucketed_all_reduce(
    tensors: list[torch.Tensor],
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> dist.Work | None:
    """All-reduce many tensors at once, fused in C++ into buckets of the group's bucket_bytes.

    One collective per bucket instead of one per tensor; any process group works (gloo and nccl
    have their own coalesced all-reduce).
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    opts = dist.AllreduceCoalescedOptions()
    opts.reduceOp = op
    work = pg.allreduce_coalesced(tensors, opts)
    if async_op:
        return work
    work.wait()
    return None
