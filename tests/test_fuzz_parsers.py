"""Fuzzing the wire parsers through the bindings: arbitrary bytes never crash them, and anything
that is not a well-formed frame header or an exact handshake of this group is rejected."""

from __future__ import annotations

import hmac
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from pycomm import _C

HEADER = struct.Struct("<IBBBBBBBBiQIIQQ")  # the 48-byte FrameHeader, field by field
HELLO = struct.Struct("<IIii16s32s")  # magic, version, fromRank, toRank, connector nonce, HMAC
FRAME_MAGIC = 0x4D435950
HELLO_MAGIC = 0x48435950
TOKEN = bytes(range(16))
NONCE = bytes(range(100, 116))  # the challenge the accepting rank sent


def header(**fields: int) -> bytes:
    values = dict(magic=FRAME_MAGIC, version=1, kind=1, channel=1, op=1, dtype=0, reduce_op=0, codec=0,
                  reserved=0, root=-1, seq=1, slot=0, reserved2=0, count=4, nbytes=16)
    values.update(fields)
    return HEADER.pack(*values.values())


def test_a_valid_header_is_accepted() -> None:
    assert HEADER.size == 48
    assert _C._validate_frame_header(header()) == ""


@settings(max_examples=3000, deadline=None)
@given(st.binary(min_size=0, max_size=96))
def test_arbitrary_bytes_never_crash_the_header_parser(raw: bytes) -> None:
    verdict = _C._validate_frame_header(raw)
    if len(raw) != 48 or int.from_bytes(raw[:4], "little") != FRAME_MAGIC:
        assert verdict != ""


@settings(max_examples=3000, deadline=None)
@given(
    kind=st.integers(0, 255), channel=st.integers(0, 255), op=st.integers(0, 255), dtype=st.integers(0, 255),
    codec=st.integers(0, 255), nbytes=st.integers(0, 2**64 - 1),
)
def test_mutated_headers_are_judged_field_by_field(kind: int, channel: int, op: int, dtype: int, codec: int,
                                                   nbytes: int) -> None:
    verdict = _C._validate_frame_header(header(kind=kind, channel=channel, op=op, dtype=dtype, codec=codec,
                                               nbytes=nbytes))
    # Kinds 1-3: data, error, move to shared memory; 4 and 5: the liveness probes, which carry nothing.
    kind_ok = kind in (1, 2, 3) or (kind in (4, 5) and nbytes == 0)
    well_formed = kind_ok and channel in (1, 2) and op <= 10 and dtype < 10 and codec <= 4 and nbytes <= 2**40
    assert (verdict == "") == well_formed, verdict


def hello(token: bytes, nonce: bytes, from_rank: int, to_rank: int, version: int = 2) -> bytes:
    own = bytes(range(50, 66))
    mac = hmac.new(token, b"pycomm-hello" + nonce + own + struct.pack("<ii", from_rank, to_rank), "sha256").digest()
    return HELLO.pack(HELLO_MAGIC, version, from_rank, to_rank, own, mac)


def test_a_valid_hello_is_accepted_once_addressed_right() -> None:
    good = hello(TOKEN, NONCE, 3, 1)
    assert _C._check_hello(good, TOKEN, NONCE, 1, 4) == ""
    assert "token" in _C._check_hello(hello(bytes(16), NONCE, 3, 1), TOKEN, NONCE, 1, 4)
    assert "replayed" in _C._check_hello(good, TOKEN, bytes(16), 1, 4)  # the answer to another challenge
    assert "version 9" in _C._check_hello(hello(TOKEN, NONCE, 3, 1, version=9), TOKEN, NONCE, 1, 4)
    assert "addressed to rank 2" in _C._check_hello(hello(TOKEN, NONCE, 3, 2), TOKEN, NONCE, 1, 4)
    assert "claims to be rank 0" in _C._check_hello(hello(TOKEN, NONCE, 0, 1), TOKEN, NONCE, 1, 4)  # a lower rank
    assert "claims to be rank 4" in _C._check_hello(hello(TOKEN, NONCE, 4, 1), TOKEN, NONCE, 1, 4)  # outside
    old = struct.pack("<II16sii", HELLO_MAGIC, 1, TOKEN, 3, 1)  # version 1 carried the token itself
    assert _C._check_hello(old + bytes(HELLO.size - len(old)), TOKEN, NONCE, 1, 4) != ""


@settings(max_examples=3000, deadline=None)
@given(st.binary(min_size=0, max_size=96), st.integers(0, 7), st.integers(1, 8))
def test_arbitrary_handshakes_are_rejected(raw: bytes, rank: int, size: int) -> None:
    # Without the token nothing passes: the HMAC is 256 bits.
    assert _C._check_hello(raw, TOKEN, NONCE, rank, size) != ""


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, HELLO.size - 1), st.integers(1, 255))
def test_any_edited_byte_of_a_valid_hello_is_rejected(at: int, flip: int) -> None:
    good = bytearray(hello(TOKEN, NONCE, 3, 1))
    good[at] ^= flip
    assert _C._check_hello(bytes(good), TOKEN, NONCE, 1, 4) != ""
