"""Writes the seed corpus of tests/native/test_fuzz.cc (run from this folder; the files are checked in).

Each file is named after its target. Layouts:
  header-*  a 48-byte FrameHeader (transport/frame.h), little endian.
  hello-*   one byte choosing the acceptor (rank = b % 4, group size = rank + 1 + (b >> 2) % 5),
            then the bytes a connection sends after the challenge. The fuzzer's token is bytes 0..15
            and its challenge nonce bytes 100..115.
  ring-*    capacity - 1 as 2 bytes, 256 bytes laid over the ring's shared header (head, tail and
            the two doorbell flags, each on its own 64-byte line), then ops of 3 bytes: kind % 3
            (0 read, 1 write, 2 scribble on the header) and a 2-byte length.
"""

from __future__ import annotations

import hmac
import struct

FRAME = struct.Struct("<IBBBBBBBBiQIIQQ")
FRAME_MAGIC = 0x4D435950
HELLO_MAGIC = 0x48435950
TOKEN = bytes(range(16))
NONCE = bytes(range(100, 116))


def frame(kind: int, channel: int, op: int, nbytes: int, count: int = 1024, root: int = -1) -> bytes:
    return FRAME.pack(FRAME_MAGIC, 1, kind, channel, op, 0, 0, 0, 0, root, 1, 0, 0, count, nbytes)


def hello(from_rank: int, to_rank: int) -> bytes:
    own = bytes([0x11] * 16)
    mac = hmac.new(TOKEN, b"pycomm-hello" + NONCE + own + struct.pack("<ii", from_rank, to_rank), "sha256")
    return struct.pack("<IIii16s32s", HELLO_MAGIC, 2, from_rank, to_rank, own, mac.digest())


def ring(capacity: int, head: int, tail: int, ops: list[tuple[int, int]]) -> bytes:
    header = bytearray(256)
    struct.pack_into("<Q", header, 0, head)
    struct.pack_into("<Q", header, 64, tail)
    return struct.pack("<H", capacity - 1) + bytes(header) + b"".join(struct.pack("<BH", k, n) for k, n in ops)


FILES = {
    "header-allreduce-data.bin": frame(1, 1, 1, 4096),
    "header-error-p2p.bin": frame(2, 2, 10, 64, count=0, root=3),
    "header-huge-nbytes.bin": frame(1, 1, 1, 2**63 + 5),
    "hello-valid-3-to-1.bin": bytes([1 | (2 << 2)]) + hello(3, 1),
    "hello-version1-with-token.bin": bytes([0]) + struct.pack("<II16sii", HELLO_MAGIC, 1, TOKEN, 1, 0),
    "hello-http.bin": bytes([0]) + b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "ring-wrapping.bin": ring(100, 0, 0, [(1, 90), (0, 50), (1, 80), (0, 200), (1, 100), (0, 7)]),
    "ring-corrupt-head.bin": ring(64, 2**63, 5, [(0, 4096), (1, 10), (2, 3), (0, 64)]),
}

if __name__ == "__main__":
    for name, content in FILES.items():
        with open(name, "wb") as f:
            f.write(content)
