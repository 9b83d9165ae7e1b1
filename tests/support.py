"""Helpers used inside rank processes (failure collection, op mapping, known gaps), and the import
policy of the CLI tests."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from reference import PREMUL_FACTOR

# PYCOMM_TEST_TRACE=1 prints every case label before it runs: with a hang, the
# last label printed by each rank (in the captured stderr) names the culprit.
TRACE = os.environ.get("PYCOMM_TEST_TRACE") == "1"
FULL_SWEEP = os.environ.get("PYCOMM_FULL_SWEEP") == "1"


def import_pycomm_or_skip(command: str) -> ModuleType:
    """pycomm, for tests that run ``command`` (a CLI). If it does not import, that is an error,
    unless PYCOMM_ALLOW_SKIP=1 asks to skip the calling module instead."""
    import importlib

    import pytest

    try:
        return importlib.import_module("pycomm")
    except Exception as error:  # ImportError, or a broken extension
        if os.environ.get("PYCOMM_ALLOW_SKIP") == "1":
            pytest.skip(f"import pycomm failed ({error!r}) and PYCOMM_ALLOW_SKIP=1", allow_module_level=True)
        raise RuntimeError(
            f"import pycomm failed, so `{command}` cannot run; build it "
            "(pip install --no-build-isolation -e .) or set PYCOMM_ALLOW_SKIP=1"
        ) from error


def reduce_op(name: str) -> Any:
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return {
        "sum": dist.ReduceOp.SUM,
        "avg": dist.ReduceOp.AVG,
        "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR,
        "bxor": dist.ReduceOp.BXOR,
    }[name]


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return [value]


def future_value(work: Any) -> list[Any]:
    """The (waited) future value of an async op; all_reduce_coalesced returns a Future itself."""
    fut = work if isinstance(work, torch.futures.Future) else work.get_future()
    value = fut.wait()
    if not isinstance(value, list):
        raise TypeError(f"future value is {type(value).__name__}, expected a list")
    return value


def future_tensors(work: Any) -> list[torch.Tensor]:
    """Future value flattened (all_gather returns a list of lists)."""
    return _flatten(future_value(work))


# Features the reference backend (gloo) does not implement on CPU. They are
# skipped for gloo only; pycomm must pass all of them. Each entry was observed
# with torch 2.13 gloo, not assumed.
_GLOO_GAPS: dict[str, str] = {
    # gloo sums bools as bytes: True + True is stored as the invalid bool 2.
    "bool_sum": "gloo: bool SUM yields non-canonical bools (byte value 2)",
    "premul_sum": "gloo: Cannot use ReduceOp.PREMUL_SUM with Gloo",
    "int16": "gloo: Invalid scalar type (no int16 support)",
    "strided_inplace": "gloo writes non-contiguous outputs as if they were contiguous",
    "reduce_scatter_future": "gloo: Work::getFuture not implemented for reduce_scatter",
    "all_gather_future_nesting": "gloo's all_gather future is a flat list, not [[tensors]]",
    "into_tensor_stacked": "gloo: all_gather_into_tensor/reduce_scatter_tensor reject the stacked (world, *shape) layout",
    "all_to_all_uneven_list": "gloo: all_to_all (list form) requires equal tensor sizes",
    "all_to_all_single_in_place": "gloo: all_to_all_single(x, x) overwrites blocks before peers read them",
    "timeout_names_peer": "gloo timeout messages do not name the peer rank",
    "mismatch_aborts": "gloo aborts the process (gloo::EnforceNotMet) on a count/dtype mismatch",
}


# PYCOMM_TEST_NO_GLOO_GAPS=1 runs the gap cases on gloo too, to re-verify that
# each listed gap is real (those cases must then fail on gloo).
_IGNORE_GAPS = os.environ.get("PYCOMM_TEST_NO_GLOO_GAPS") == "1"


def gloo_gap(backend: str, *features: str) -> bool:
    """True if ``backend`` is gloo and any of ``features`` is a known gloo gap."""
    return (
        backend == "gloo"
        and not _IGNORE_GAPS
        and any(f in _GLOO_GAPS for f in features)
    )


def dtype_feature(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _log(message: str) -> None:
    # One write per line so lines of concurrent ranks do not interleave.
    sys.stderr.write(f"[pycomm-test] {message}\n")
    sys.stderr.flush()


def problem_notes() -> tuple[list[str], Callable[[str, str | None], None]]:
    """A rank's list of problems and `note(what, outcome)`, which keeps "what: outcome" when a check
    returned an outcome (a check returns None when it passed)."""
    problems: list[str] = []

    def note(what: str, outcome: str | None) -> None:
        if outcome:
            problems.append(f"{what}: {outcome}")

    return problems, note


class Failures:
    """Collects failed checks of one rank; printed as they happen (survives a later hang)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.prefix = (
            ""  # prepended to labels, e.g. which process group a sweep runs on
        )
        self.items: list[str] = []
        self.checks = 0

    def add(self, label: str, message: str) -> None:
        line = f"rank {self.rank}: {self.prefix}{label}: {message}"
        self.items.append(line)
        _log(f"FAIL {line}")

    def check(self, label: str, message: str | None) -> None:
        self.checks += 1
        if message is not None:
            self.add(label, message)

    @contextlib.contextmanager
    def guard(self, label: str) -> Iterator[None]:
        """Record an exception from one case and go on with the next.

        This keeps one failing case from hiding all the others; if the backend
        raised on some ranks only, the next collective hangs and run_ranks'
        timeout reports it (with these failures already on stderr).
        """
        if TRACE:
            _log(f"rank {self.rank}: {self.prefix}{label}")
        try:
            yield
        except Exception as exc:  # noqa: BLE001
            tb = traceback.format_exc(limit=4)
            self.add(label, f"raised {type(exc).__name__}: {exc}\n{tb}")

    def result(self) -> tuple[list[str], int]:
        return self.items, self.checks


def assert_no_failures(
    per_rank: Sequence[tuple[list[str], int]], *, limit: int = 40
) -> None:
    """Parent side: fail with the (first ``limit``) failures of all ranks.

    Also fails if a rank ran no check at all, so a sweep that silently skips
    everything cannot pass.
    """
    __tracebackhide__ = True
    failures = [f for rank_failures, _ in per_rank for f in rank_failures]
    idle = [rank for rank, (_, checks) in enumerate(per_rank) if checks == 0]
    if idle and not failures:
        raise AssertionError(f"ranks {idle} ran no checks")
    if failures:
        shown = "\n".join(failures[:limit])
        more = (
            f"\n... and {len(failures) - limit} more" if len(failures) > limit else ""
        )
        raise AssertionError(f"{len(failures)} failed checks:\n{shown}{more}")


def formation_keys(marker: str) -> list[str]:
    """The keys groups formed with `marker` in their store prefix ("pycomm/group/", "pycomm/split/")
    left in the default group's store, each without its prefix ("pycomm/addr/1")."""
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    keys = {k[k.index("pycomm/", k.index(marker) + len(marker)):] for k in store.list_keys() if marker in k}
    return sorted(keys)


def store_barrier(name: str, world: int, timeout_s: float = 60.0) -> None:
    """Line the ranks up in time through the rendezvous store, independently of the backend."""
    import time

    store = dist.distributed_c10d._get_default_store()
    key = f"test-barrier/{name}"
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while int(store.add(key, 0)) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"store barrier {name!r} incomplete after {timeout_s}s")
        time.sleep(0.005)


CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


def private_mounts() -> Any:
    """This thread (a rank's main thread, which creates groups) gets a mount namespace of its own,
    private, so that what it mounts next shows nowhere else. Returns libc, whose mount() is typed."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    # Private first, or a mount made next would show in the parent namespace too.
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    return libc
