"""pycomm's own entry points beside torch.distributed's: per-group settings and fused all-reduce."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from pycomm import _C
from pycomm.options import ALGORITHMS, COMPRESSIONS


def pycomm_backend(group: dist.ProcessGroup | None) -> _C.PycommBackend | None:
    """The group's pycomm backend, or None if the group runs another backend."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if isinstance(backend, _C.PycommBackend) else None


def _backend(group: dist.ProcessGroup | None) -> _C.PycommBackend:
    backend = pycomm_backend(group)
    if backend is None:
        raise TypeError("pycomm: this process group does not run the pycomm backend")
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


def all_reduce(
    tensor: torch.Tensor,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    compression: str = "none",
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    residual: torch.Tensor | None = None,
) -> dist.Work | None:
    """All-reduce with an optional codec for this call (float32, SUM or AVG when compressed).

    Compressed, the result is rounded exactly twice whatever the world size: each rank encodes its
    input once (with several ranks a host: each host's fp32 sum, slice by slice), and the sum of
    each segment is encoded once.

    ``residual`` (CPU, compressed only): a float32 tensor of the input's size, zeros at first, that
    this rank passes again on every call: error feedback. What the first encoding drops is kept
    there and added to what is encoded next time. After a call that raised, the tensor and the
    residual hold no defined value.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"pycomm: unknown compression {compression!r}; valid values: {', '.join(COMPRESSIONS)}")
    if compression == "none":
        if residual is not None:
            raise ValueError("pycomm: residual= (error feedback) needs a compression")
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    work = _backend(group).allreduce_compressed(tensor, op, compression, residual)
    if async_op:
        return work
    work.wait()
    return None


# The default op, compared by identity: hashing or naming a ReduceOp per call costs more than the
# rest of the wrapper.
_SUM = dist.ReduceOp.SUM


def direct_all_reduce(
    tensor: torch.Tensor,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """`tensor` (CPU) all-reduced in place on a pycomm group, synchronously, with no Work: the same
    result as `dist.all_reduce`, in less time for small tensors. It runs the torch op
    `torch.ops.pycomm.direct_all_reduce_(tensor, op_name, group_name)` (`op_name` one of sum, avg,
    product, min, max, band, bor, bxor; it returns nothing), which torch.compile traces as one
    node; in eager mode this function calls that op from C++, in about half the time of a call
    through torch.ops from Python (docs/PERFORMANCE.md). Not recorded by the flight recorder; a
    profiler sees the torch op, not a c10d Work. Unlike `dist.all_reduce` it takes no complex
    tensors (pass `torch.view_as_real(t)`) and no PREMUL_SUM, and it refuses a group that torch
    wraps (TORCH_DISTRIBUTED_DEBUG=DETAIL). Returns `tensor`."""
    # The op checks the name (and names the valid ones); PREMUL_SUM has none and is refused there.
    if op is _SUM:
        name = "sum"
    else:
        name = op.name.lower() if isinstance(op, dist.ReduceOp.RedOpType) else str(op)
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if (type(tensor) is torch.Tensor and not torch.compiler.is_compiling()
            and not torch._C._is_torch_function_mode_enabled()):
        # The same op, called from C++ (csrc/torch/backend.h): a call through torch.ops parses its
        # arguments against the schema in Python, which is most of a 4 KiB op's time. What sees a
        # torch.ops call in Python (a subclass's __torch_function__, a TorchFunctionMode, tracing by
        # torch.compile) gets one.
        _C.direct_all_reduce_(tensor, name, pg)
    else:
        torch.ops.pycomm.direct_all_reduce_.default(tensor, name, pg.group_name)
    return tensor



def stats(group: dist.ProcessGroup | None = None) -> dict[str, dict[str, float]]:
    """Per op and codec ("allreduce", "allreduce/fp16", "send", ...): calls, bytes_sent,
    bytes_received and seconds since the group was created, on this rank. "transport/socket" and
    "transport/shm_ring" count the frame bytes this rank sent through sockets and through
    shared-memory rings, and "transport/socket" also those it received from sockets;
    "transport/socket_by_waiter" counts the received ones that the thread waiting for them read
    itself (short receives), rather than the transport's event loop. Collectives of CUDA tensors on
    the NCCL route count under the same keys the bytes their schedule posts on the NCCL link, and
    the seconds until their stream finished."""
    return dict(_backend(group).stats())


def monitored_barrier(
    group: dist.ProcessGroup | None = None,
    timeout: timedelta | None = None,
    wait_all_ranks: bool = False,
) -> None:
    """`dist.monitored_barrier` for pycomm groups: torch's wrapper refuses every backend but gloo by
    name, so this calls the group's own `monitored_barrier`, which pycomm implements. Rank 0 raises
    naming the first rank that did not arrive within `timeout` (the group's by default), or every
    such rank with `wait_all_ranks`; the other ranks raise once rank 0 does not release them."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    _backend(pg)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
