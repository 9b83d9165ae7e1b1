"""Supervising local rank processes, shared by the bench and the trainer launchers."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence

# Once one rank has failed, the others get this long to report before they are stopped.
GRACE_S = 5.0


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
