"""``--on-failure shrink``: carry on without a lost rank, at the smaller world size, with no restart.

When a step's gradient all-reduce fails because a rank died (SIGKILL: its connection closes) or
froze (SIGSTOP: the timeout names it), every survivor raises. Each then:

1. asks pycomm which ranks were lost (``pycomm.failed_ranks``; the survivors agree on it, and
   ``dist.shrink_group`` checks that they do) and shrinks the default group without them;
2. agrees with the others on the training state: a survivor whose all-reduce had completed
   before the loss took its optimizer step, one that had not did not, so the one furthest ahead
   sends its model and optimizer state to the rest (``agree_on_state``);
3. rebuilds DDP on the shrunk group (the caller: ``loop.train``) and goes on from that step.

The global batch shrinks with the world (each survivor keeps its batch size and its own batch
stream); the log says so. Error-feedback residuals start again from zero on the new group.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from pycomm.collectives import pycomm_backend


@dataclasses.dataclass(frozen=True)
class Shrunk:
    lost: list[int]  # ranks of the group before the shrink
    world: int  # after
    rank: int  # this rank's, after
    next_step: int  # 0-based: the step every survivor runs next
    seconds: float  # from the failure's detection here to the agreed state


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."


# A survivor whose op failed on another's report may hear of the lost rank a moment later (the
# rank that waited for a frozen one probes it first); a mismatch or a bad argument never names one.
SETTLE_S = 3.0


def lost_ranks(error: BaseException) -> list[int]:
    """The ranks the default group lost, as pycomm saw them; re-raises ``error`` if it lost none
    within SETTLE_S (a mismatch, a bad argument, another backend): no shrink recovers from those."""
    backend = pycomm_backend(None)
    if backend is None:
        raise error
    deadline = time.monotonic() + SETTLE_S
    while not (lost := [int(r) for r in backend.failed_ranks()]) and time.monotonic() < deadline:
        time.sleep(0.01)
    if not lost:
        raise error
    return lost


def shrink_and_agree(
    error: BaseException, model: torch.nn.Module, optimizer: torch.optim.Optimizer, failed_step: int
) -> Shrunk:
    """Steps 1 and 2 above. ``failed_step``: the 0-based step whose all-reduce raised here (this
    rank has done that many optimizer steps). Collective over the survivors."""
    detected = time.perf_counter()
    lost = lost_ranks(error)
    dist.shrink_group(lost)
    next_step = agree_on_state(model, optimizer, failed_step)
    return Shrunk(lost, dist.get_world_size(), dist.get_rank(), next_step, time.perf_counter() - detected)


def agree_on_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps_done: int) -> int:
    """Every rank takes the state of the lowest rank among those that did the most optimizer
    steps; returns that number of steps. Collective."""
    most = torch.tensor([steps_done], dtype=torch.int64)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    leader = torch.tensor([dist.get_rank() if steps_done == most.item() else dist.get_world_size()], dtype=torch.int64)
    dist.all_reduce(leader, op=dist.ReduceOp.MIN)
    state = [model.state_dict(), optimizer.state_dict()] if dist.get_rank() == leader.item() else [None, None]
    dist.broadcast_object_list(state, group_src=int(leader.item()))
    model.load_state_dict(state[0])
    optimizer.load_state_dict(state[1])
    return int(most.item())
