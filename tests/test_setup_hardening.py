"""Group setup against strangers that try to get in.

(3) A stranger squatting on the address in the store learns nothing of the group token and is
refused by the connecting rank. (4) The bytes of a real handshake, captured between two ranks,
neither carry the token nor work when replayed, and a rank already connected cannot be displaced.

The ranks are run by test_reliability's ``_Cluster`` (spawned ranks, a pipe to each, a hang
deadline). Figures are printed with the ``[reliability]`` prefix (``-s``); docs/RELIABILITY-setup.md
quotes them.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from test_reliability import (
    _CHALLENGE,
    _HELLO_MAGIC,
    _HELLO_VERSION,
    _Cluster,
    _Control,
    _converse,
    _dropped_lines,
    _hello_for,
    _report,
)


_GO_KEY = "pycomm-test/go/"


def _hold_backend(ranks: tuple[int, ...]) -> Callable[[int], None]:
    """A before_init hook: on `ranks`, pycomm's backend creator waits until the test sets
    _GO_KEY + rank in the group's store (see _release), so the test decides when those ranks
    start their setup, with no guessed delays."""

    def install(rank: int) -> None:
        if rank not in ranks:
            return
        plugin = dist.Backend._plugins["PYCOMM"]
        create = plugin.creator_fn

        def held_create(dist_options: Any, *args: Any, **kwargs: Any) -> Any:
            dist_options.store.wait([f"{_GO_KEY}{rank}"], timedelta(seconds=90))
            return create(dist_options, *args, **kwargs)

        dist.Backend._plugins["PYCOMM"] = plugin._replace(creator_fn=held_create)

    return install


def _release(c: _Cluster, rank: int) -> None:
    """Lets a rank held by _hold_backend create its backend."""
    prefix = c.store_key("pycomm/addr/0", timeout=60)[: -len("pycomm/addr/0")]
    c.store().set(f"{prefix}{_GO_KEY}{rank}", b"1")


def _hold_rank1(rank: int) -> None:
    _hold_backend((1,))(rank)


def _hold_ranks_1_and_2(rank: int) -> None:
    _hold_backend((1, 2))(rank)


# --------------------------------------------------------------------------------------------
# (3) A squatter on the published address.


def _init_only_worker(rank: int, world: int, ctl: _Control) -> str:
    return "formed"


class _Squatter:
    """Listens where the store now says rank 0 is, and plays whichever protocol the connecting
    rank speaks: answers an old-style hello with rank 0's ack, or sends a challenge and, after the
    hello, a welcome with a made-up authentication code. Records what it was sent."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.received = b""
        self.thread = threading.Thread(target=self._run, name="squatter", daemon=True)
        self.thread.start()

    def _read_for(self, conn: socket.socket, seconds: float) -> None:
        conn.settimeout(0.1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                data = conn.recv(4096)
                if not data:
                    return
                self.received += data

    def _run(self) -> None:
        self.listener.settimeout(30)
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn, contextlib.suppress(OSError):
            self._read_for(conn, 0.5)
            if self.received:  # the connector spoke first: the old protocol
                conn.sendall((0).to_bytes(4, "little"))
            else:
                conn.sendall(_CHALLENGE.pack(_HELLO_MAGIC, _HELLO_VERSION, os.urandom(16)))
                self._read_for(conn, 1.0)
                fake = _HELLO_MAGIC.to_bytes(4, "little") + _HELLO_VERSION.to_bytes(4, "little")
                conn.sendall(fake + (0).to_bytes(4, "little") + os.urandom(32))
            self._read_for(conn, 3.0)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=10)


def _error_line(traceback_text: Any) -> str:
    """The exception line of a rank's traceback (torch may append C++ frames after it)."""
    lines = [line for line in str(traceback_text).splitlines() if "Error: " in line]
    return lines[-1].strip() if lines else str(traceback_text).strip()[-300:]


def _result_message(c: _Cluster, rank: int, timeout: float) -> tuple[str, Any]:
    message = c._wait_for(rank, lambda m: m[0] == "result", "result", timeout)
    return message[1], message[2]


def test_a_squatter_gets_no_token_and_is_refused(pycomm: ModuleType) -> None:
    with _Cluster(
        _init_only_worker, 2, pg_timeout_s=8, hang_timeout_s=90, before_init=_hold_rank1
    ) as c:
        key = c.store_key("pycomm/addr/0", timeout=60)
        token = c.store().get(c.store_key("pycomm/token"))
        squatter = _Squatter()
        try:
            c.store().set(key, f"{squatter.address[0]}:{squatter.address[1]}")
            _release(c, 1)
            status1, value1 = _result_message(c, 1, timeout=40)
        finally:
            squatter.close()
        status0, value0 = _result_message(c, 0, timeout=40)

    _report(
        f"squatter: received {len(squatter.received)} bytes; rank 1 {status1}: {_error_line(value1)[:300]}"
    )
    problems = []
    if token in squatter.received:
        problems.append("the squatter received the group token")
    if status1 != "error":
        problems.append("rank 1 formed a group with a squatter in rank 0's place")
    else:
        last = _error_line(value1)
        for word in ("rank 1", "peer 0", "prove"):
            if word not in last:
                problems.append(f"rank 1's error does not say {word!r}: {last}")
    if status0 != "error" or "waiting for peers 1" not in _error_line(value0):
        problems.append(f"rank 0 should have timed out waiting for rank 1: {status0} {_error_line(value0)}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------
# (4) A handshake captured between two ranks.


class _Proxy:
    """Forwards connections to `target`, recording what each connector sent."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.sent: list[bytearray] = []  # per connection, connector -> target
        self.answered: list[bytearray] = []  # per connection, target -> connector
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, name="proxy", daemon=True)]
        self._threads[0].start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                ready, _, _ = select.select([src], [], [], 0.1)
                if not ready:
                    continue
                data = src.recv(1 << 16)
                if not data:
                    break
                record += data
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.target, timeout=5)
            sent, answered = bytearray(), bytearray()
            self.sent.append(sent)
            self.answered.append(answered)
            for args in ((client, server, sent), (server, client, answered)):
                t = threading.Thread(target=self._pump, args=args, daemon=True)
                t.start()
                self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for t in self._threads:
            t.join(timeout=5)


def _sum_worker(rank: int, world: int, ctl: _Control) -> dict[str, Any]:
    t = torch.arange(1000, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t)
    ok = torch.equal(t, torch.arange(1000, dtype=torch.int64) * sum(range(1, world + 1)))
    ctl.event("formed")
    assert ctl.command() == "done"
    return {"ok": ok}


def test_a_captured_handshake_gives_no_way_in(pycomm: ModuleType) -> None:
    with _Cluster(_sum_worker, 3, pg_timeout_s=30, hang_timeout_s=120, before_init=_hold_ranks_1_and_2) as c:
        key = c.store_key("pycomm/addr/0", timeout=60)
        address0 = c.pycomm_address(0)
        token = c.store().get(c.store_key("pycomm/token"))
        proxy = _Proxy(address0)
        try:
            c.store().set(key, f"{proxy.address[0]}:{proxy.address[1]}")  # rank 1 goes through it
            _release(c, 1)
            start = time.monotonic()
            # Rank 1 has spoken and been answered, and the exchange has gone quiet.
            seen = (-1, -1)
            while True:
                now = (len(proxy.sent[0]), len(proxy.answered[0])) if proxy.sent else (0, 0)
                if now == seen and now[0] >= 32 and now[1] >= 4:
                    break
                assert time.monotonic() - start < 30, "rank 1 never connected to rank 0 through the proxy"
                seen = now
                time.sleep(0.3)
            captured = bytes(proxy.sent[0])

            # Replay what rank 1 sent, on a connection of our own.
            with socket.create_connection(address0, timeout=5) as s:
                replay = _converse(s, captured)
            # A store reader (who has the token) claiming the rank that is already connected.
            with socket.create_connection(address0, timeout=5) as s:
                displace = _converse(s, lambda nonce: _hello_for(token, nonce, 1, 0))
            _release(c, 2)  # only now: rank 0 was accepting all along
            for rank in range(3):
                c.wait_event(rank, "formed", timeout=60)
            for rank in range(3):
                c.send(rank, "done")
            results = [c.result(r, timeout=60) for r in range(3)]
        finally:
            proxy.close()
        log0 = c.stderr(0)

    dropped = _dropped_lines(log0)
    _report(
        f"captured handshake: {len(captured)} bytes from rank 1; replay {replay}, displacement "
        f"{displace}; rank 0 warnings: " + " | ".join(line[line.find("dropped"):][:120] for line in dropped)
    )
    problems = []
    if token in captured:
        problems.append("the group token crossed the wire in rank 1's handshake")
    if replay != "closed":
        problems.append(f"replayed handshake: {replay} (expected closed)")
    if displace != "closed":
        problems.append(f"a second rank 1: {displace} (expected closed)")
    if not any("wrong group token" in line for line in dropped):
        problems.append("rank 0 did not log the replay as an authentication failure")
    if not any("rank already connected" in line for line in dropped):
        problems.append("rank 0 did not log the second rank 1 as already connected")
    if not all(r["ok"] for r in results):
        problems.append(f"wrong all_reduce results: {results}")
    if problems:
        problems.append(f"rank 0 stderr:\n{log0[-3000:]}")
    assert not problems, "\n".join(problems)
