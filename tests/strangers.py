"""What a stranger on a rank's listening port sends: the handshake and frame formats, payloads
that a rank must drop, and the socket helpers that talk to a rank and tell what it did; with the
worker that checks the group formed. Used by test_strangers.py and test_setup_hardening.py.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from cluster import Control


# The wire formats, as csrc/core/transport/tcp/hello.h and transport/frame.h define them. The
# handshake: the accepting rank sends a challenge (its nonce); the connector answers with a hello
# carrying an HMAC-SHA256 of the group token over both nonces and both ranks; the acceptor answers
# with a welcome carrying its own HMAC. The token never crosses the wire.
HELLO_MAGIC = 0x48435950
HELLO_VERSION = 2
CHALLENGE = struct.Struct("<II16s")  # magic, version, acceptor nonce
HELLO = struct.Struct("<IIii16s32s")  # magic, version, fromRank, toRank, connector nonce, mac
HELLO_V1 = struct.Struct("<II16sii")  # the old hello: magic, version, token, fromRank, toRank
FRAME = struct.Struct("<IBBBBBBBBiQIIQQ")  # magic .. root, seq, slot, reserved2, count, nbytes
FRAME_MAGIC = 0x4D435950
assert CHALLENGE.size == 24 and HELLO.size == 64 and FRAME.size == 48
CHALLENGE_PREFIX = struct.pack("<II", HELLO_MAGIC, HELLO_VERSION)

# A payload is bytes, or a function of the rank's challenge nonce (a reply to the challenge).
Payload = bytes | Callable[[bytes], bytes]


def hello_for(token: bytes, nonce: bytes, from_rank: int, to_rank: int, version: int = HELLO_VERSION) -> bytes:
    """A hello answering the challenge `nonce`, made with `token` (right or wrong)."""
    own = os.urandom(16)
    transcript = b"pycomm-hello" + nonce + own + struct.pack("<ii", from_rank, to_rank)
    mac = hmac.new(token, transcript, "sha256").digest()
    return HELLO.pack(HELLO_MAGIC, version, from_rank, to_rank, own, mac)


def frame_header(nbytes: int) -> bytes:
    # data frame, collective channel, allreduce of float32 SUM, seq 1
    return FRAME.pack(FRAME_MAGIC, 1, 1, 1, 1, 0, 0, 0, 0, -1, 1, 0, 0, 1, nbytes)


def stranger_payloads(token: bytes | None) -> dict[str, Payload]:
    garbage = os.urandom(512)
    while garbage[:4] in (struct.pack("<I", HELLO_MAGIC), struct.pack("<I", FRAME_MAGIC)):
        garbage = os.urandom(512)
    payloads: dict[str, Payload] = {
        "garbage": garbage,
        "wrong_token_hello": lambda nonce: hello_for(os.urandom(16), nonce, 1, 0),
        "old_version_hello": HELLO_V1.pack(HELLO_MAGIC, 1, os.urandom(16), 1, 0),
        "huge_length_header": frame_header(2**63 + 5) + os.urandom(64),
        "huge_legal_length_header": frame_header(1 << 40) + os.urandom(64),
        "http_request": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    }
    if token is not None:  # someone who read the store: right token, impossible ranks
        payloads["right_token_rank_out_of_range"] = lambda nonce: hello_for(token, nonce, 7, 0)
        payloads["right_token_addressed_elsewhere"] = lambda nonce: hello_for(token, nonce, 1, 5)
        payloads["right_token_bad_version"] = lambda nonce: hello_for(token, nonce, 1, 0, version=9)
    return payloads


def await_close(sock: socket.socket, timeout: float) -> str:
    """What the rank did with the connection: 'closed' (EOF/reset), 'open' or 'answered ...'.
    A challenge the rank sent on accepting (not yet read) is not an answer."""
    sock.settimeout(timeout)
    got = b""
    try:
        while True:
            data = sock.recv(64)
            if data == b"":
                return "closed"
            got += data
            head = got[: len(CHALLENGE_PREFIX)]
            if len(got) > CHALLENGE.size or head != CHALLENGE_PREFIX[: len(head)]:
                return f"answered {got!r}"
    except (ConnectionResetError, BrokenPipeError):
        return "closed"
    except TimeoutError:
        return "open"


def read_challenge(sock: socket.socket, timeout: float) -> bytes | None:
    """The nonce of the rank's challenge; None if the rank closed the connection instead (as it
    does after setup). A connection that stays silent gets a random nonce: the reply then fails."""
    sock.settimeout(timeout)
    got = b""
    try:
        while len(got) < CHALLENGE.size:
            data = sock.recv(CHALLENGE.size - len(got))
            if data == b"":
                return None
            got += data
    except (ConnectionResetError, BrokenPipeError):
        return None
    except TimeoutError:
        return os.urandom(16)
    return got[8:24]


def converse(sock: socket.socket, payload: Payload, timeout: float = 4.0) -> str:
    """Sends `payload` (replying to the challenge if it is a function) and reports what the rank
    did with the connection."""
    if callable(payload):
        nonce = read_challenge(sock, 2.0)
        if nonce is None:
            return "closed"
        payload = payload(nonce)
    try:
        if payload:
            sock.sendall(payload)
    except (ConnectionResetError, BrokenPipeError):
        return "closed"
    return await_close(sock, timeout)


def stranger(address: tuple[str, int], payload: Payload, timeout: float = 4.0) -> str:
    with socket.create_connection(address, timeout=5) as sock:
        return converse(sock, payload, timeout)


def send_and_close(address: tuple[str, int], payload: bytes) -> None:
    with socket.create_connection(address, timeout=5) as sock, contextlib.suppress(OSError):
        sock.sendall(payload)


def dropped_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "dropped connection from" in line]


def formed_worker(rank: int, world: int, ctl: Control) -> dict[str, Any]:
    """Says when its group formed (the monotonic time, for tests that time setup), then all-reduces once."""
    ctl.event("formed", time.monotonic())
    inputs = [torch.arange(10_000, dtype=torch.int64) * (r + 1) for r in range(world)]
    t = inputs[rank].clone()
    dist.all_reduce(t)
    ok = torch.equal(t, sum(inputs))
    assert ctl.command() == "done"
    return {"ok": ok}
