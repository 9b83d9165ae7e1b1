"""Turning local failures into decisions every rank shares.

Lock-step rule of the bench: all ranks make the same sequence of collective
calls on every group. A local event (an exception in one rank) may only
change that sequence after the ranks agreed on it here, over the control
group; otherwise one rank would wait forever in a collective the others skip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from pycomm.bench.backends import one_line

T = TypeVar("T")


def guard(fn: Callable[..., T], *args: object) -> tuple[T | None, str | None]:
    """Run ``fn(*args)``; an exception becomes a one-line message to agree on."""
    try:
        return fn(*args), None
    except Exception as exc:  # reported as an error row; the sweep goes on
        return None, one_line(exc)


def agree(local: list[str | None], control: dist.ProcessGroup) -> list[str | None]:
    """Per slot (variant): None if no rank failed, else the message of the
    lowest failing rank. Every rank returns the same list. Cheap when nothing
    failed: one small all-reduce."""
    flags = torch.tensor([0 if m is None else 1 for m in local], dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=control)
    if not any(flags.tolist()):
        return [None] * len(local)
    gathered: list[list[str | None] | None] = [None] * dist.get_world_size(control)
    dist.all_gather_object(gathered, local, group=control)
    agreed: list[str | None] = []
    for slot, flag in enumerate(flags.tolist()):
        if not flag:
            agreed.append(None)
            continue
        first = next(((r, g[slot]) for r, g in enumerate(gathered) if g is not None and g[slot] is not None), None)
        agreed.append(f"rank {first[0]}: {first[1]}" if first else "failed on another rank")
    return agreed
