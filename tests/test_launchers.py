"""The bench and train launchers (pycomm.ranks.fork_ranks): the local ranks are forked before the
rendezvous store exists, so whatever fails after the fork must not leave them behind waiting."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import pytest
import torch.distributed as dist
from support import import_pycomm_or_skip

import_pycomm_or_skip("the launchers")

from pycomm.bench import launch as bench_launch  # noqa: E402
from pycomm.bench.config import BenchConfig, Variant  # noqa: E402
from pycomm.train import launch as train_launch  # noqa: E402
from pycomm.train.config import TrainConfig  # noqa: E402
import pycomm.ranks  # noqa: E402

# While set, every child forked from this process lingers in Python's after-fork hooks, where the
# exception of an inherited Python signal handler is swallowed: the window a loaded host opens.
_linger_after_fork_s = 0.0


def _linger_in_child() -> None:
    if _linger_after_fork_s:
        time.sleep(_linger_after_fork_s)


os.register_at_fork(after_in_child=_linger_in_child)


class StoreFailed(OSError):
    pass


def _failing_store(*args: Any, **kwargs: Any) -> Any:
    raise StoreFailed("no store today")


def _run_bench() -> None:
    config = BenchConfig(ops=("all_reduce",), sizes=(4096,), dtype="float32",
                         variants=(Variant(backend="gloo", label="gloo"),), timeout_s=30.0)
    bench_launch.run_local(config, 2)


def _run_train() -> None:
    train_launch.run_local(TrainConfig.for_model("small", nproc=2, steps=1, timeout_s=30.0))


@pytest.mark.parametrize("run", [_run_bench, _run_train], ids=["bench", "train"])
def test_a_store_that_cannot_be_made_leaves_no_rank_behind(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "TCPStore", _failing_store)
    start = time.monotonic()
    with pytest.raises(StoreFailed):
        run()
    left = [p for p in multiprocessing.active_children() if p.name.startswith("rank")]
    for proc in left:
        proc.kill()
        proc.join()
    assert not left, f"{len(left)} forked ranks still waiting for a store address after the launcher failed"
    assert time.monotonic() - start < 10, "the launcher took its ranks' whole timeout to fail"


@pytest.mark.parametrize("run", [_run_bench, _run_train], ids=["bench", "train"])
def test_a_rank_stopped_before_it_has_started_ends_by_that_signal(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher stops its ranks with SIGTERM right after forking them when the store fails; a
    rank still in the fork's aftermath must end by it too, not swallow it and wait to be killed."""
    global _linger_after_fork_s
    stopped: list[multiprocessing.process.BaseProcess] = []
    real_terminate = pycomm.ranks.terminate_ranks

    def recording_terminate(procs: Any) -> None:
        stopped.extend(procs)
        real_terminate(procs)

    monkeypatch.setattr(pycomm.ranks, "terminate_ranks", recording_terminate)
    monkeypatch.setattr(dist, "TCPStore", _failing_store)
    _linger_after_fork_s = 0.5
    try:
        with pytest.raises(StoreFailed):
            run()
    finally:
        _linger_after_fork_s = 0.0
    assert len(stopped) == 2
    codes = [proc.exitcode for proc in stopped]
    assert codes == [-signal.SIGTERM] * 2, f"ranks ended with {codes}, expected SIGTERM for both"


def test_a_signal_raised_while_blocking_sigterm_leaves_it_unblocked(monkeypatch: pytest.MonkeyPatch) -> None:
    """pthread_sigmask changes the mask first and then runs pending Python handlers: one that raises
    (a SIGINT pending at that moment) comes out of the call that blocked SIGTERM. The launcher must
    not keep SIGTERM blocked after that, or its own handler never runs again."""
    real = signal.pthread_sigmask

    def interrupted(how: int, mask: Any) -> Any:
        old = real(how, mask)
        if how == signal.SIG_BLOCK and signal.SIGTERM in set(mask):
            raise KeyboardInterrupt
        return old

    before = real(signal.SIG_BLOCK, [])
    monkeypatch.setattr(signal, "pthread_sigmask", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            pycomm.ranks.fork_ranks(2, print, (), 30.0, lambda: None)
        left = real(signal.SIG_BLOCK, [])
    finally:
        real(signal.SIG_SETMASK, before)
    assert signal.SIGTERM not in left, "fork_ranks left SIGTERM blocked in the launcher"
