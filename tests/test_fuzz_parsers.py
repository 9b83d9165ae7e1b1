"""Fuzzing the wire parsers through the bindings: arbitrary bytes never crash them, and anything
that is not a well-formed frame header or an exact handshake of this group is rejected."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from pycomm import _C

HEADER = struct.Struct("<IBBBBBBBBiQIIQQ")  # the 48-byte FrameHeader, field by field
HELLO = struct.Struct("<II16sii")
FRAME_MAGIC = 0x4D435950
HELLO_MAGIC = 0x48435950
TOKEN = bytes(range(16))


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
    well_formed = kind in (1, 2, 3) and channel in (1, 2) and op <= 10 and dtype < 10 and codec <= 4 and nbytes <= 2**40
    assert (verdict == "") == well_formed, verdict


def test_a_valid_hello_is_accepted_once_addressed_right() -> None:
    good = HELLO.pack(HELLO_MAGIC, 1, TOKEN, 3, 1)
    assert _C._check_hello(good, TOKEN, 1, 4) == ""
    assert "token" in _C._check_hello(HELLO.pack(HELLO_MAGIC, 1, bytes(16), 3, 1), TOKEN, 1, 4)
    assert _C._check_hello(HELLO.pack(HELLO_MAGIC, 1, TOKEN, 3, 2), TOKEN, 1, 4) != ""  # addressed to rank 2
    assert _C._check_hello(HELLO.pack(HELLO_MAGIC, 1, TOKEN, 0, 1), TOKEN, 1, 4) != ""  # a lower rank
    assert _C._check_hello(HELLO.pack(HELLO_MAGIC, 1, TOKEN, 4, 1), TOKEN, 1, 4) != ""  # outside the group


@settings(max_examples=3000, deadline=None)
@given(st.binary(min_size=0, max_size=64), st.integers(0, 7), st.integers(1, 8))
def test_arbitrary_handshakes_are_rejected(raw: bytes, rank: int, size: int) -> None:
    verdict = _C._check_hello(raw, TOKEN, rank, size)
    if len(raw) != HELLO.size or raw[8:24] != TOKEN:
        assert verdict != ""
