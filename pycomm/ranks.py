"""Where ranks come from and supervising local rank processes, shared by the bench and the
trainer launchers (pycomm.bench and pycomm.train import this, never each other)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import time
from collections.abc import Callable, Container, Sequence
from typing import Any

# Once one rank has failed, the others get this long to report before they are stopped.
GRACE_S = 5.0


def under_torchrun() -> bool:
    """torchrun (or a launcher speaking its env:// protocol) started this process as one rank.

    All three variables are needed: the ranks join through env://, which reads MASTER_ADDR."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def fork_ranks(
    nproc: int, entry: object, args: tuple[object, ...], timeout_s: float, make_store: Callable[[], Any]
) -> tuple[list[mp.process.BaseProcess], Any]:
    """Starts ``nproc`` local ranks, ``entry(rank, store_address, *args)`` each, then the rendezvous
    store (``make_store()``, a TCPStore server on 127.0.0.1), whose address it sends the ranks (each
    waits ``timeout_s`` for it); returns the ranks and the store. If anything fails on the way (the
    store, a fork, a signal's exception), the ranks started so far are stopped before it is raised.

    The ranks are forked, and first of all: the launcher has only imported torch and pycomm, has
    made no store (whose server runs a thread) and run no tensor op (whose thread pool a fork would
    break). That is the state the test harness's forkserver forks from, and forked ranks do not
    import torch again: spawned ones spent 2-3 s of CPU each on it, most of a short run."""
    ctx = mp.get_context("fork")
    addresses = ctx.Queue()
    procs: list[mp.process.BaseProcess] = []
    # SIGTERM stays blocked across the forks: a rank that got it before resetting its handler would
    # run the launcher's (the trainer raises from it), whose exception Python's after-fork hooks
    # swallow, and the rank would wait out the kill. Blocked, it stays pending until the rank's
    # handler is the default one. The launcher's mask is read on its own first: pthread_sigmask
    # changes the mask before it runs pending Python handlers, so the call that blocks may raise
    # with SIGTERM blocked already, and the `finally` must then restore it.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            for rank in range(nproc):
                proc = ctx.Process(
                    target=_rank_main, args=(entry, rank, addresses, timeout_s, mask, args), name=f"rank{rank}"
                )
                proc.start()
                procs.append(proc)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        store = make_store()
        for _ in range(nproc):
            addresses.put(("127.0.0.1", store.port))
    except BaseException:
        terminate_ranks(procs)
        raise
    return procs, store


def _rank_main(
    entry: object, rank: int, addresses: object, timeout_s: float, mask: set[signal.Signals], args: tuple[object, ...]
) -> None:
    # A rank ends on SIGTERM as a spawned one did, whatever handler the launcher had when it forked;
    # one sent since the fork is delivered here, by the default action.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        address = addresses.get(timeout=timeout_s)  # type: ignore[attr-defined]
    except queue.Empty:
        sys.exit(f"rank {rank}: the launcher sent no rendezvous address within {timeout_s:g} s")
    entry(rank, address, *args)  # type: ignore[operator]


def wait_ranks(procs: Sequence[mp.process.BaseProcess]) -> None:
    """Join all ranks; once one has failed, give the rest a grace period, then stop them."""
    deadline: float | None = None
    while any(proc.is_alive() for proc in procs):
        for proc in procs:
            proc.join(timeout=0.05)
        if deadline is None and any(proc.exitcode not in (None, 0) for proc in procs):
            deadline = time.monotonic() + GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            terminate_ranks(procs)
            return


def terminate_ranks(procs: Sequence[mp.process.BaseProcess]) -> None:
    """SIGTERM every live rank, then SIGKILL whichever is still alive 5 s later."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()


def report_silent_deaths(prog: str, codes: Sequence[int | None], reported: Container[int]) -> None:
    """One line on stderr per rank that failed without reporting why (killed, a crash inside a
    backend): printed before the reported errors, as these ranks are usually why the others failed."""
    for rank, code in enumerate(codes):
        if code not in (0, None) and rank not in reported:
            how = f"signal {-code}" if code < 0 else f"exit {code}"
            print(f"{prog}: error: rank {rank} died ({how})", file=sys.stderr, flush=True)
