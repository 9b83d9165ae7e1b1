"""cluster.Cluster: spawned pycomm ranks that a test drives while they run.

Most reliability cases need the test process to act on running ranks (SIGKILL or SIGSTOP one,
connect to one's listening port, read its stderr), which ``mp.run_ranks`` does not offer; they use
``Cluster``: spawned ranks, each with a duplex pipe to the test (events up, commands down), stderr
and stdout redirected to a file per rank, and one hang deadline for the whole case after which
every rank's Python stacks are dumped (SIGUSR1 / faulthandler) and every rank is SIGKILLed. The
environment, the stack dump and the reaping are mp.py's, shared with run_ranks. Cases that only
need per-rank return values use ``mp.run_ranks``.

Also here: what the reliability files share (their time limits, the transports they run over,
the ``[reliability]`` figures they print).
"""

from __future__ import annotations

import contextlib
import glob
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Self

import torch
import torch.distributed as dist
from mp import dump_stacks, free_port, install_stack_dump, kill_all, rank_environment, start_ranks

DESTROY_MAX_S = 5.0  # destroy_process_group after a peer failed
EXIT_MAX_S = 15.0  # a rank's exit after its group failed or was aborted
TRANSPORTS = ("auto", "tcp")  # auto: shared memory on one host (where the op has it); tcp: sockets


_STDERR_TAIL_CHARS = 6000


def report(message: str) -> None:
    """A measured figure: printed (visible with -s) so docs/RELIABILITY.md can quote it."""
    sys.stdout.write(f"[reliability] {message}\n")
    sys.stdout.flush()


class Control:
    """The rank side of the pipe to the test process."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def event(self, name: str, value: Any = None) -> None:
        self._conn.send(("event", name, value))

    def command(self, timeout: float = 120.0) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"no command from the test within {timeout}s")
        return self._conn.recv()

    def poll(self) -> Any:
        """A command if one is waiting, else None (never blocks)."""
        return self._conn.recv() if self._conn.poll(0) else None


def _child_main(
    rank: int,
    world: int,
    init_method: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    env: dict[str, str],
    conn: Connection,
    log_path: str,
    pg_timeout_s: float,
    before_init: Callable[[int], None] | None,
    destroy: bool,
) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    install_stack_dump()
    os.environ.update(env)
    try:
        import pycomm  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        if before_init is not None:
            before_init(rank)
        dist.init_process_group(
            "pycomm",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=pg_timeout_s),
        )
        result = fn(rank, world, Control(conn), *args)
        if destroy and dist.is_initialized():
            dist.destroy_process_group()
        conn.send(("result", "ok", result))
    except BaseException:  # noqa: BLE001  (report everything)
        with contextlib.suppress(Exception):
            conn.send(("result", "error", traceback.format_exc()))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # Return normally: the interpreter's own exit (atexit, module teardown, static destructors)
    # is part of what is tested; the test checks the exit code and how long it took.


class Hang(AssertionError):
    pass


class Cluster:
    """Spawned ranks of one pycomm default group, driven by the test. Use as a context manager."""

    def __init__(
        self,
        fn: Callable[..., Any],
        world: int,
        *,
        args: Sequence[Any] = (),
        env: dict[str, str] | None = None,
        pg_timeout_s: float = 30.0,
        hang_timeout_s: float = 90.0,
        host: str = "127.0.0.1",
        before_init: Callable[[int], None] | None = None,
        destroy: bool = True,
    ) -> None:
        self.world = world
        self.port = free_port()
        self.host = host
        self._tmp = tempfile.mkdtemp(prefix="pycomm-rel-")
        self._deadline = time.monotonic() + hang_timeout_s
        self._hang_timeout_s = hang_timeout_s
        self._inbox: list[list[tuple[Any, ...]]] = [[] for _ in range(world)]
        self._eof = [False] * world
        self._store: dist.TCPStore | None = None
        ctx = multiprocessing.get_context("spawn")
        child_env = rank_environment(env)
        init_method = f"tcp://{host}:{self.port}"
        try:
            self.procs, self.conns = start_ranks(
                ctx,
                world,
                child_env,
                _child_main,
                lambda rank, child_end: (
                    rank, world, init_method, fn, tuple(args), child_env, child_end, self.log_path(rank), pg_timeout_s,
                    before_init, destroy,
                ),
                duplex=True,
            )
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise

    # -- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        kill_all(self.procs)
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def log_path(self, rank: int) -> str:
        return os.path.join(self._tmp, f"rank{rank}.log")

    def stderr(self, rank: int) -> str:
        try:
            with open(self.log_path(rank), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def _left(self, timeout: float | None) -> float:
        left = self._deadline - time.monotonic()
        return left if timeout is None else min(left, timeout)

    def _fail(self, what: str) -> None:
        """Dump every live rank's stacks, kill them all and raise with their stderr tails."""
        dump_stacks(self.procs, range(self.world))
        self.close_procs()
        for rank in range(self.world):  # what the ranks said before dying
            while self._pump(rank, 0.0):
                pass
        errors = "".join(
            f"--- rank {r} raised ---\n{m[2]}\n"
            for r in range(self.world)
            for m in self._inbox[r]
            if m[0] == "result" and m[1] == "error"
        )
        exits = ", ".join(f"rank {r}: {p.exitcode}" for r, p in enumerate(self.procs))
        tails = f"exit codes: {exits}\n" + errors + "\n".join(
            f"--- rank {r} stderr (tail) ---\n{self.stderr(r)[-_STDERR_TAIL_CHARS:]}"
            for r in range(self.world)
        )
        raise Hang(f"{what}\n{tails}")

    def close_procs(self) -> None:
        kill_all(self.procs)

    # -- talking to ranks ---------------------------------------------------------------------

    def pid(self, rank: int) -> int:
        pid = self.procs[rank].pid
        assert pid is not None
        return pid

    def send(self, rank: int, message: Any) -> None:
        self.conns[rank].send(message)

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        os.kill(self.pid(rank), sig)

    def wait_looping(self) -> None:
        """Waits until every rank has sent its "looping" event (it is inside its loop of ops)."""
        for r in range(self.world):
            self.wait_event(r, "looping", timeout=60)

    def kill_in_loop(self, rank: int, sig: int = signal.SIGKILL, settle_s: float = 0.3) -> tuple[float, list[int]]:
        """Once every rank loops, and ``settle_s`` later, signals ``rank``: (when, the other ranks)."""
        self.wait_looping()
        time.sleep(settle_s)
        killed_at = time.monotonic()
        self.kill(rank, sig)
        return killed_at, [r for r in range(self.world) if r != rank]

    @contextlib.contextmanager
    def stopped(self, rank: int) -> Iterator[None]:
        """Once every rank has said "ready", holds ``rank`` with SIGSTOP for the body."""
        for r in range(self.world):
            self.wait_event(r, "ready", timeout=60)
        self.kill(rank, signal.SIGSTOP)
        try:
            yield
        finally:
            self.kill(rank, signal.SIGCONT)

    def _pump(self, rank: int, timeout: float) -> bool:
        """Read one message of ``rank`` into its inbox; False on timeout or if it is gone."""
        conn, proc = self.conns[rank], self.procs[rank]
        if self._eof[rank]:
            return False
        ready = wait([conn, proc.sentinel], timeout=max(0.0, timeout))
        if conn in ready or (proc.sentinel in ready and conn.poll(0)):
            try:
                self._inbox[rank].append(conn.recv())
                return True
            except (EOFError, OSError):
                self._eof[rank] = True
        elif proc.sentinel in ready:
            self._eof[rank] = True
        return False

    def _take(self, rank: int, match: Callable[[tuple[Any, ...]], bool]) -> tuple[Any, ...] | None:
        for i, message in enumerate(self._inbox[rank]):
            if match(message):
                return self._inbox[rank].pop(i)
        return None

    def _wait_for(
        self, rank: int, match: Callable[[tuple[Any, ...]], bool], what: str, timeout: float | None
    ) -> tuple[Any, ...]:
        start = time.monotonic()
        while True:
            found = self._take(rank, match)
            if found is not None:
                return found
            errors = [m for m in self._inbox[rank] if m[0] == "result" and m[1] == "error"]
            if errors:
                self._fail(f"rank {rank} raised while the test waited for {what}:\n{errors[0][2]}")
            if self._eof[rank]:
                self.procs[rank].join(timeout=5)
                self._fail(
                    f"rank {rank} exited (code {self.procs[rank].exitcode}) before {what}"
                )
            left = self._deadline - time.monotonic()
            if timeout is not None:
                left = min(left, timeout - (time.monotonic() - start))
            if left <= 0:
                self._fail(
                    f"no {what} from rank {rank} after {time.monotonic() - start:.1f}s "
                    f"(case hang timeout {self._hang_timeout_s}s); ranks killed"
                )
            self._pump(rank, min(left, 1.0))

    def wait_event(self, rank: int, name: str, timeout: float | None = None) -> Any:
        message = self._wait_for(
            rank, lambda m: m[0] == "event" and m[1] == name, f"event {name!r}", timeout
        )
        return message[2]

    def result(self, rank: int, timeout: float | None = None) -> Any:
        """The value ``fn`` returned on ``rank`` (fails the test if it raised or hung)."""
        message = self._wait_for(rank, lambda m: m[0] == "result" and m[1] == "ok", "result", timeout)
        return message[2]

    def wait_exit(self, rank: int, timeout: float) -> tuple[int | None, float]:
        """(exit code or None if still running after ``timeout``, seconds waited)."""
        start = time.monotonic()
        self.procs[rank].join(timeout=max(0.0, self._left(timeout)))
        return self.procs[rank].exitcode, time.monotonic() - start

    # -- the rendezvous store -----------------------------------------------------------------

    def store(self) -> dist.TCPStore:
        if self._store is None:
            self._store = dist.TCPStore(
                self.host, self.port, is_master=False, timeout=timedelta(seconds=30)
            )
        return self._store

    def store_key(self, suffix: str, prefix: str = "default_pg/", timeout: float = 30.0) -> str:
        """The full key (under the default group's prefix) ending in ``suffix``, once it exists.

        The default group's backend store is ``PrefixStore("default_pg/0/" ...)`` wrapped again
        per device ("default_pg/0//cpu//..." in torch 2.13); the key is found by listing the
        store rather than by hard-coding torch's prefixes.
        """
        start = time.monotonic()
        while True:
            keys = [k for k in self.store().list_keys() if k.startswith(prefix) and k.endswith(suffix)]
            if keys:
                assert len(keys) == 1, f"several keys end in {suffix!r}: {keys}"
                return keys[0]
            if time.monotonic() - start > min(timeout, self._left(None)):
                self._fail(f"store key ...{suffix} did not appear within {timeout}s")
            time.sleep(0.02)

    def pycomm_address(self, rank: int, timeout: float = 30.0) -> tuple[str, int]:
        value = self.store().get(self.store_key(f"pycomm/addr/{rank}", timeout=timeout)).decode()
        host, _, port = value.rpartition(":")
        return host.strip("[]"), int(port)


def shm_pycomm_files() -> set[str]:
    return set(glob.glob("/dev/shm/pycomm*"))


def error_info(exc: BaseException) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "runtime_error": isinstance(exc, RuntimeError),
        "message": str(exc),
        "at": time.monotonic(),
    }
