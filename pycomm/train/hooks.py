"""Which DDP comm hook a run uses, and the timer that measures communication.

Compression hooks come from ``pycomm.hooks`` when pycomm has them, looked up
at run time so this file needs no change the day they land; until then fp16
and bf16 fall back to torch's own hooks, and fp8 (which torch lacks) is a
usage error.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

HookFn = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


class HookUnavailable(Exception):
    """The asked-for hook cannot be had here; a usage error (exit 2), message is one line."""


def pycomm_hooks() -> ModuleType | None:
    """``pycomm.hooks`` if this pycomm has it, else None."""
    import pycomm  # already imported: this package lives inside it

    hooks = getattr(pycomm, "hooks", None)
    if isinstance(hooks, ModuleType):
        return hooks
    # The submodule may exist without pycomm/__init__.py importing it.
    try:
        return importlib.import_module("pycomm.hooks")
    except ModuleNotFoundError as exc:
        if exc.name != "pycomm.hooks":
            raise  # pycomm.hooks exists but is broken: say so, do not fall back silently
        return None


@dataclasses.dataclass(frozen=True)
class HookChoice:
    state: Any
    hook: HookFn
    impl: str  # recorded in the JSON log: which code compressed the gradients


def check_hook(name: str, error_feedback: bool) -> ModuleType | None:
    """Raise HookUnavailable if ``--hook name [--error-feedback]`` cannot run here.

    Returns ``pycomm.hooks`` when it will provide the hook, None when torch's
    hooks will. Cheap and needs no process group: the CLI calls it before
    starting any rank, so a usage error costs no rendezvous.
    """
    if name == "none":
        if error_feedback:
            raise HookUnavailable("--error-feedback needs a compressing --hook (fp16, bf16 or fp8)")
        return None
    hooks = pycomm_hooks()
    if hooks is not None:
        if getattr(hooks, f"{name}_hook", None) is None:
            raise HookUnavailable(f"pycomm.hooks has no {name}_hook")
        return hooks
    if name == "fp8":
        raise HookUnavailable("fp8 hook needs pycomm.hooks")
    if error_feedback:
        raise HookUnavailable("--error-feedback needs pycomm.hooks")
    return None


def choose_hook(name: str, error_feedback: bool, group: dist.ProcessGroup | None = None) -> HookChoice:
    """The hook and its state for ``--hook name``; raises HookUnavailable for usage errors."""
    hooks = check_hook(name, error_feedback)
    if name == "none":
        # "none" is a plain fp32 all-reduce. torch's allreduce_hook does what
        # DDP's built-in reduction does (divide by world, sum); it is registered
        # explicitly only so that CommTimer can time it like the other hooks.
        return HookChoice(group, default_hooks.allreduce_hook, "torch.allreduce_hook")
    if hooks is not None:
        state = hooks.CompressionState(process_group=group, error_feedback=error_feedback)
        return HookChoice(state, getattr(hooks, f"{name}_hook"), f"pycomm.hooks.{name}_hook")
    fallback = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}[name]
    return HookChoice(group, fallback, f"torch.{fallback.__name__}")


@dataclasses.dataclass(frozen=True)
class StepComm:
    """One step's communication as CommTimer saw it (seconds)."""

    busy_s: float  # union of the buckets' intervals (hook call to future completion)
    exposed_s: float  # last bucket's hook call to the last future's completion (see CommTimer)
    buckets: int


class CommTimer:
    """Times communication by wrapping the comm hook.

    Each bucket's interval runs from the hook call (the bucket's gradients are
    ready) to the completion of the future the hook returns (reduced, and
    decompressed, gradients are back), so compression cost counts as
    communication. Two figures per step:

    busy: the union of the intervals. Where buckets overlap the rest of
    backward this counts time in which compute also ran.

    exposed: from the last hook call to the last future's completion. DDP
    calls the hooks in bucket order, each once its bucket is ready and the
    earlier ones are launched, so the last call marks the end of backward's
    gradient compute; what follows until every future is done is time the
    step spends only waiting for (and compressing, and decompressing)
    gradients: the communication that overlapping did not hide. With one
    bucket the two are equal.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # futures may complete on the backend's threads
        self._intervals: list[tuple[float, float]] = []

    def wrap(self, hook: HookFn) -> HookFn:
        # Unannotated on purpose: DDP compares the hook's annotations with the
        # real types, and `from __future__ import annotations` makes them
        # strings. Nor functools.wraps: DDP refuses hooks *named*
        # bf16_compress_hook without CUDA/NCCL, a guard that is about NCCL and
        # not about CPU backends, where bf16 all-reduce is the backend's job.
        def timed_hook(state, bucket):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            future = hook(state, bucket)

            def finished(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                end = time.perf_counter()
                with self._lock:
                    self._intervals.append((start, end))
                return done.value()  # re-raises a failed all-reduce into DDP

            return future.then(finished)

        return cast(HookFn, timed_hook)

    def take(self) -> StepComm:
        """The intervals recorded since the last take, summarized; resets."""
        with self._lock:
            intervals, self._intervals = sorted(self._intervals), []
        covered, reach = 0.0, float("-inf")
        for start, end in intervals:
            if end > reach:
                covered += end - max(start, reach)
                reach = end
        exposed = max(0.0, reach - intervals[-1][0]) if intervals else 0.0
        return StepComm(busy_s=covered, exposed_s=exposed, buckets=len(intervals))
