"""Bit-exactness of pycomm's compression codecs (csrc/core/codecs/block_codec.h) against torch.

Goes through two bindings of pycomm._C:

    codec_encode(codec_name: str, x: float32 tensor) -> uint8 tensor   (encodedBytes long)
    codec_decode(codec_name: str, encoded: uint8 tensor, count: int) -> float32 tensor

with codec names "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"; the tests skip while they are missing.

Reference, rebuilt here with torch ops only:
  fp16 / bf16: x.to(torch.float16 / torch.bfloat16), 2 bytes per element, little-endian.
  fp8: blocks of 256 elements, each a 4-byte fp32 scale word then one code per element, with
       amax = max |x| over the block's finite x, s = amax / MAX (fp32), d = s if s > 0 else 1,
       codes = (x / d).to(float8 dtype) -- equal to (x / s).to(dtype) for every normal s --,
       scale word s for an all-finite block, d for a block with NaN/Inf, and -d for an E4M3 block
       with +-Inf, in which 0x7f / 0xff / 0x80 mean +Inf / -Inf / NaN and zeros are coded 0x00.
NaN codes are compared as "a NaN code" (torch's NaN bit patterns differ between its code paths);
every other byte must be identical.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

CODECS = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
DTYPE = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
BLOCK = 256
SCALE_BYTES = 4


@pytest.fixture
def codec_api(pycomm: ModuleType) -> tuple[Callable, Callable]:
    c = pycomm._C
    missing = [name for name in ("codec_encode", "codec_decode") if not hasattr(c, name)]
    if missing:
        pytest.skip(f"pycomm._C has no {', '.join(missing)} binding yet (the codec bindings are not built)")
    return c.codec_encode, c.codec_decode


def encoded_bytes(codec: str, n: int) -> int:
    if codec in FP8_MAX:
        return n + SCALE_BYTES * math.ceil(n / BLOCK)
    return 2 * n


def is_nan_code(codec: str, code: torch.Tensor) -> torch.Tensor:
    """Whether each fp8 code is a NaN of the plain format (E4M3FN: S.1111.111; E5M2: exponent 31, mantissa != 0)."""
    low = code & 0x7F
    return low == 0x7F if codec == "fp8_e4m3" else low > 0x7C


def f32(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def bits32(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


class Reference:
    """The expected encoding of x, and which bytes must match exactly / hold a NaN code."""

    def __init__(self, codec: str, x: torch.Tensor) -> None:
        self.codec = codec
        self.n = x.numel()
        if codec in FP8_MAX:
            self._fp8(x)
        else:
            half = x.to(DTYPE[codec])
            self.bytes = half.view(torch.uint8)  # little-endian host
            self.nan_elems = torch.isnan(x)
            # Decoded value of each code, widened by torch; NaN stays NaN.
            self.decoded = half.float()

    def _fp8(self, x: torch.Tensor) -> None:
        codec, n = self.codec, self.n
        dtype, fmax = DTYPE[codec], FP8_MAX[codec]
        nb = math.ceil(n / BLOCK)
        xp = torch.cat([x, torch.zeros(nb * BLOCK - n)]).view(nb, BLOCK)
        finite = torch.isfinite(xp)
        amax = torch.where(finite, xp.abs(), torch.zeros(())).amax(dim=1)
        s = amax / fmax
        # torch's fp32 division must be IEEE division: the double route rounds correctly too.
        assert torch.equal(bits32(s), bits32((amax.double() / fmax).float()))
        d = torch.where(s > 0, s, torch.ones(()))
        q = xp / d[:, None]
        assert torch.equal(bits32(q), bits32((xp.double() / d.double()[:, None]).float()))
        # Only a subnormal s can push a finite x / d past MAX: pycomm saturates it.
        q = torch.where(finite, q.clamp(-fmax, fmax), q)
        codes = q.to(dtype).view(torch.uint8).clone()

        is_inf = torch.isinf(xp)
        is_nan = torch.isnan(xp)
        non_finite_block = (~finite).any(dim=1)
        stored = torch.where(non_finite_block, d, s)
        if codec == "fp8_e4m3":
            inf_block = is_inf.any(dim=1)
            stored = torch.where(inf_block, -d, stored)
            ib = inf_block[:, None].expand_as(codes)
            codes[ib & ((codes & 0x7F) == 0)] = 0
            codes[ib & is_nan] = 0x80
            codes[ib & is_inf & (xp > 0)] = 0x7F
            codes[ib & is_inf & (xp < 0)] = 0xFF
        else:
            inf_block = torch.zeros(nb, dtype=torch.bool)
        # NaN codes outside E4M3 Inf blocks are compared as NaN codes only.
        self.nan_elems = (is_nan & ~inf_block[:, None]).flatten()[:n]
        scale_words = stored.contiguous().view(torch.uint8).view(nb, SCALE_BYTES)
        self.bytes = torch.cat([scale_words, codes], dim=1).flatten()[: encoded_bytes(codec, n)]

        # Decoded values: code's value (torch) times the scale word; specials of E4M3 Inf blocks.
        value = codes.view(dtype).float()
        dec = value * stored.abs()[:, None]
        if codec == "fp8_e4m3":
            ib = inf_block[:, None].expand_as(codes)
            dec = torch.where(ib & (codes == 0x7F), math.inf, dec)
            dec = torch.where(ib & (codes == 0xFF), -math.inf, dec)
            dec = torch.where(ib & (codes == 0x80), math.nan, dec)
        self.decoded = dec.flatten()[:n]
        self.x = x

    def code_positions(self) -> torch.Tensor:
        """Byte offset of each element's code (first byte for fp16/bf16)."""
        i = torch.arange(self.n)
        if self.codec in FP8_MAX:
            return i + SCALE_BYTES * (i // BLOCK + 1)
        return 2 * i

    def check(self, encoded: torch.Tensor, decoded: torch.Tensor, what: str) -> None:
        codec = self.codec
        assert encoded.dtype == torch.uint8 and encoded.numel() == encoded_bytes(codec, self.n), what
        # Bytes that must match exactly: all but those of NaN elements (outside E4M3 Inf blocks).
        exact = torch.ones(encoded.numel(), dtype=torch.bool)
        pos = self.code_positions()[self.nan_elems]
        exact[pos] = False
        if codec not in FP8_MAX:
            exact[pos + 1] = False
        diff = (encoded != self.bytes) & exact
        if diff.any():
            first = int(diff.nonzero()[0, 0])
            raise AssertionError(
                f"{codec} {what}: {int(diff.sum())} bytes differ from torch, first at byte {first}: "
                f"{int(encoded[first]):#04x} vs {int(self.bytes[first]):#04x}"
            )
        if self.nan_elems.any():
            if codec in FP8_MAX:
                assert bool(is_nan_code(codec, encoded[pos]).all()), f"{codec} {what}: NaN not coded as NaN"
            else:
                h = encoded.view(torch.int16).view(DTYPE[codec])[self.nan_elems]
                assert bool(torch.isnan(h).all()), f"{codec} {what}: NaN not coded as NaN"
        # Decode: bit-identical to torch's widening times the scale; NaN exactly where expected.
        assert decoded.dtype == torch.float32 and decoded.numel() == self.n, what
        nan = torch.isnan(self.decoded)
        assert torch.equal(torch.isnan(decoded), nan), f"{codec} {what}: NaN positions differ after decode"
        bad = bits32(decoded[~nan]) != bits32(self.decoded[~nan])
        assert not bool(bad.any()), f"{codec} {what}: {int(bad.sum())} decoded values differ from torch"


def round_trip(api: tuple[Callable, Callable], codec: str, x: torch.Tensor, what: str) -> torch.Tensor:
    encode, decode = api
    x = x.contiguous()
    encoded = encode(codec, x)
    decoded = decode(codec, encoded, x.numel())
    Reference(codec, x).check(encoded, decoded, what)
    return decoded


def random_blocks(n: int, gen: torch.Generator, denormals: bool = True) -> torch.Tensor:
    """N(0,1) values times a per-block 10^U(-3,3); some fp32 denormals and tiny blocks mixed in."""
    nb = math.ceil(n / BLOCK)
    scale = 10.0 ** (torch.rand(nb, generator=gen) * 6 - 3)
    x = (torch.randn(nb, BLOCK, generator=gen) * scale[:, None]).flatten()[:n].clone()
    if denormals and n:
        pick = torch.rand(n, generator=gen)
        tiny_bits = torch.randint(1, 1 << 23, (n,), generator=gen, dtype=torch.int32)
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
        x = torch.where(pick < 0.05, f32(tiny_bits) * sign, x)  # fp32 denormals
        x = torch.where((pick >= 0.05) & (pick < 0.08), x * 1e-6, x)  # fp8 subnormal codes
        # Whole blocks at extreme magnitudes: subnormal scales, the top of the fp32 range.
        for b, magnitude in ((1, 1e-40), (3, 1e-36), (5, 1e-30), (7, 3e38)):
            if (b + 1) * BLOCK <= n:
                blk = torch.randn(BLOCK, generator=gen).clamp(-3, 3) / 3 * magnitude
                x[b * BLOCK : (b + 1) * BLOCK] = blk
    return x


@pytest.mark.parametrize("codec", CODECS)
def test_every_16bit_pattern(codec_api: tuple[Callable, Callable], codec: str) -> None:
    """All fp16 and all bf16 values (as fp32), in code order: exact for every codec."""
    patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    for source in (torch.float16, torch.bfloat16):
        x = patterns.view(source).float()
        decoded = round_trip(codec_api, codec, x, f"every {source} pattern")
        if DTYPE[codec] == source:  # the codec's own format: lossless
            finite = ~torch.isnan(x)
            assert torch.equal(bits32(decoded[finite]), bits32(x[finite]))


def tie_probes(ladder: torch.Tensor) -> torch.Tensor:
    """Midpoints of consecutive values of an increasing ladder, and their fp32 neighbours, both signs."""
    v = ladder.double()
    mid = ((v[:-1] + v[1:]) / 2).float()  # exact: one more bit than the narrow format
    up = torch.nextafter(mid, torch.full_like(mid, math.inf))
    down = torch.nextafter(mid, torch.zeros_like(mid))
    probes = torch.cat([mid, up, down])
    return torch.cat([probes, -probes])


@pytest.mark.parametrize("codec", CODECS)
def test_rounding_ties(codec_api: tuple[Callable, Callable], codec: str) -> None:
    """Every rounding boundary of the target format: ties to even, the overflow threshold."""
    dtype = DTYPE[codec]
    if codec in FP8_MAX:
        top = 0x7E if codec == "fp8_e4m3" else 0x7B  # largest finite code
        ladder = torch.arange(top + 1, dtype=torch.int32).to(torch.uint8).view(dtype).float()
        probes = tie_probes(ladder)
        # 255 probes and the format's MAX per block: scale exactly 1, so x / scale == x.
        per_block = BLOCK - 1
        nb = math.ceil(probes.numel() / per_block)
        padded = torch.cat([probes, torch.zeros(nb * per_block - probes.numel())]).view(nb, per_block)
        x = torch.cat([torch.full((nb, 1), FP8_MAX[codec]), padded], dim=1).flatten()
        encoded = round_trip(codec_api, codec, x, "rounding ties")
        assert encoded.numel() == x.numel()
    else:
        top = 0x7BFF if codec == "fp16" else 0x7F7F  # largest finite pattern
        ladder = torch.arange(top + 1, dtype=torch.int32).to(torch.int16).view(dtype).double()
        overflow = 65536.0 if codec == "fp16" else 2.0**128  # where Inf would sit in the ladder
        ladder = torch.cat([ladder, torch.tensor([overflow], dtype=torch.float64)])
        round_trip(codec_api, codec, tie_probes(ladder), "rounding ties")


@pytest.mark.parametrize("codec", ["fp8_e4m3", "fp8_e5m2"])
def test_every_fp8_code_point(codec_api: tuple[Callable, Callable], codec: str) -> None:
    encode, _ = codec_api
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(DTYPE[codec]).float()
    finite = torch.isfinite(values)
    # A block holding every finite value has amax = MAX, so scale 1 and every code itself.
    only_finite = torch.where(finite, values, torch.zeros(()))
    encoded = encode(codec, only_finite)
    assert encoded[:SCALE_BYTES].view(torch.float32).item() == 1.0
    codes = encoded[SCALE_BYTES:].to(torch.int32)
    assert torch.equal(codes[finite], torch.arange(256, dtype=torch.int32)[finite])
    round_trip(codec_api, codec, only_finite, "finite fp8 code points")
    # With NaN (and E5M2's Inf) included: NaN codes stay NaN codes.
    round_trip(codec_api, codec, values, "all fp8 code points")
    # Each code point alone and times powers of two: the scale is amax / MAX, codes still exact.
    for shift in (-20, -3, 0, 5, 40):
        round_trip(codec_api, codec, only_finite * 2.0**shift, f"code points * 2^{shift}")


@pytest.mark.parametrize("codec", CODECS)
def test_random_with_denormals(codec_api: tuple[Callable, Callable], codec: str) -> None:
    gen = torch.Generator().manual_seed(1234)
    for n in (0, 1, 255, 256, 257, 4099, 1000003):
        x = random_blocks(n, gen)
        decoded = round_trip(codec_api, codec, x, f"random n={n}")
        assert decoded.numel() == n


@pytest.mark.parametrize("codec", CODECS)
def test_random_fp32_bits(codec_api: tuple[Callable, Callable], codec: str) -> None:
    """Arbitrary fp32 bit patterns (every exponent, NaN and Inf included)."""
    gen = torch.Generator().manual_seed(99)
    bits = torch.randint(-(1 << 31), 1 << 31, (1 << 18,), generator=gen, dtype=torch.int64)
    round_trip(codec_api, codec, f32(bits), "random fp32 bit patterns")


@pytest.mark.parametrize("codec", CODECS)
def test_nan_inf(codec_api: tuple[Callable, Callable], codec: str) -> None:
    """NaN decodes to NaN, +-Inf to +-Inf, and the finite values beside them are unaffected."""
    gen = torch.Generator().manual_seed(5)
    nan, inf = math.nan, math.inf
    for specials in ([nan], [inf], [-inf], [inf, -inf], [nan, inf, -inf]):
        x = torch.randn(3 * BLOCK + 17, generator=gen) * 5
        x[::4] = 0.0
        x[1::8] = -0.0
        clean = x.clone()
        for k, v in enumerate(specials):
            x[2 + k :: 37] = v
        clean[~torch.isfinite(x)] = 0.0
        decoded = round_trip(codec_api, codec, x, f"specials {specials}")
        special = ~torch.isfinite(x)
        assert torch.equal(torch.isnan(decoded), torch.isnan(x)), "NaN exactly where NaN was"
        assert torch.equal(decoded[torch.isinf(x)], x[torch.isinf(x)]), "Inf keeps its sign"
        encode, decode = codec_api
        plain = decode(codec, encode(codec, clean), clean.numel())
        nonzero = ~special & (x != 0)
        assert torch.equal(bits32(decoded[nonzero]), bits32(plain[nonzero]))
        assert bool((decoded[~special & (x == 0)] == 0).all())
    # Blocks without any finite non-zero value.
    for x in (torch.tensor([nan] * 5), torch.tensor([inf, -inf, 0.0, -0.0]), torch.tensor([-inf])):
        decoded = round_trip(codec_api, codec, x, f"no finite values {x.tolist()}")
        assert torch.equal(torch.isnan(decoded), torch.isnan(x))
        assert torch.equal(decoded[~torch.isnan(x)], x[~torch.isnan(x)])


@pytest.mark.parametrize("codec", ["fp8_e4m3", "fp8_e5m2"])
def test_zero_blocks(codec_api: tuple[Callable, Callable], codec: str) -> None:
    encode, decode = codec_api
    x = torch.zeros(2 * BLOCK + 3)
    x[1::3] = -0.0
    encoded = encode(codec, x)
    for b in range(3):
        assert encoded[b * (BLOCK + SCALE_BYTES) :][:SCALE_BYTES].view(torch.float32).item() == 0.0
    decoded = decode(codec, encoded, x.numel())
    assert torch.equal(bits32(decoded), bits32(x)), "signed zeros decode to themselves"
    round_trip(codec_api, codec, x, "zero blocks")


@pytest.mark.parametrize("codec", CODECS)
def test_sizes(codec_api: tuple[Callable, Callable], codec: str) -> None:
    encode, _ = codec_api
    for n in (0, 1, 255, 256, 257, 1000003):
        x = torch.linspace(-2.0, 3.0, n)
        assert encode(codec, x).numel() == encoded_bytes(codec, n)
        assert round_trip(codec_api, codec, x, f"n={n}").numel() == n


@pytest.mark.parametrize("codec", CODECS)
def test_out_arguments(pycomm: ModuleType, codec: str) -> None:
    """codec_encode/codec_decode into a given tensor and codec_decode_add give the allocating calls' bits;
    an `out` of the wrong dtype, size or layout, or overlapping the input, is refused."""
    c = pycomm._C
    if not hasattr(c, "codec_decode_add"):
        pytest.skip("pycomm._C has no codec_decode_add binding (built before the out= arguments)")
    gen = torch.Generator().manual_seed(77)
    n = 3 * BLOCK + 5
    x = random_blocks(n, gen)
    expected = c.codec_encode(codec, x)
    out = torch.full((encoded_bytes(codec, n),), 0xA5, dtype=torch.uint8)
    returned = c.codec_encode(codec, x, out=out)
    assert returned.data_ptr() == out.data_ptr() and torch.equal(out, expected)
    decoded = torch.full((n,), 7.0)
    c.codec_decode(codec, expected, n, out=decoded)
    assert torch.equal(bits32(decoded), bits32(c.codec_decode(codec, expected, n)))
    acc = torch.randn(n, generator=gen)
    want = acc + decoded
    c.codec_decode_add(codec, expected, acc)
    assert torch.equal(bits32(acc), bits32(want)), "decode_add == decode, then add"
    with pytest.raises(TypeError, match="out must be a CPU"):
        c.codec_encode(codec, x, out=torch.empty(encoded_bytes(codec, n), dtype=torch.int8))
    with pytest.raises(ValueError, match="elements, needs"):
        c.codec_encode(codec, x, out=torch.empty(encoded_bytes(codec, n) + 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="must be contiguous"):
        c.codec_decode(codec, expected, n, out=torch.empty(2 * n)[::2])
    with pytest.raises(TypeError, match="acc must be a CPU"):
        c.codec_decode_add(codec, expected, torch.zeros(n, dtype=torch.float64))
    with pytest.raises(ValueError, match="overlaps the input"):
        c.codec_encode(codec, x, out=x.view(torch.uint8)[: encoded_bytes(codec, n)])
