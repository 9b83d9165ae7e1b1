"""Buffer contents: random data for timing, exact integer patterns for checks.

Two kinds of data on purpose:
- timed iterations use pseudo-random values, so a compressing codec sees
  realistic entropy (a periodic pattern would flatter a lossless codec);
- the checked iteration uses small integers, so every sum is exact in the
  element type and "wrong" is an exact count, not a tolerance judgement.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pycomm.bench.config import CODEC_EXACT_LIMIT

# Largest N such that every integer in [-N, N] is exactly representable.
_EXACT_LIMIT: dict[torch.dtype, int] = {
    torch.float16: 1 << 11,
    torch.bfloat16: 1 << 8,
    torch.float32: 1 << 24,
    torch.float64: 1 << 53,
    torch.int8: 127,
    torch.uint8: 255,
    torch.int32: (1 << 31) - 1,
    torch.int64: (1 << 63) - 1,
}

# A prime period keeps the pattern from lining up with power-of-two chunk
# boundaries, so a misplaced chunk shows up as wrong elements.
_MAX_PERIOD = 251


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def pattern_period(dtype: torch.dtype, world: int, codecs: Iterable[str | None] = ()) -> int:
    """Period M of the check pattern so that a sum over ``world`` ranks of
    values in [1, M] stays exact (M * world <= exact limit) in the element
    type and in every known wire codec: a correct codec then returns exact
    results, and any wrong element is a bug, not rounding."""
    limit = _EXACT_LIMIT.get(dtype, 1 << 8)
    for codec in codecs:
        limit = min(limit, CODEC_EXACT_LIMIT.get(codec or "none") or limit)
    return max(1, min(_MAX_PERIOD, limit // max(1, world)))


def pattern(rank: int, start: int, count: int, period: int) -> torch.Tensor:
    """Check values of ``rank`` for global element indices [start, start+count).

    value = ((index + rank) % period) + 1: positive (so a zeroed, unwritten
    output element is always wrong) and different per rank (so data from the
    wrong rank is caught) whenever period > 1.
    """
    index = torch.arange(start, start + count, dtype=torch.int64)
    return ((index + rank) % period + 1).to(torch.float64)


def reduced_pattern(world: int, start: int, count: int, period: int) -> torch.Tensor:
    """Sum over all ranks of ``pattern`` (the expected SUM result)."""
    total = torch.zeros(count, dtype=torch.float64)
    for rank in range(world):
        total += pattern(rank, start, count, period)
    return total


def random_pool(count: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Per-rank random timing data, generated once per op and sliced per size.

    Seeded by rank so runs are repeatable and ranks hold different data.
    """
    gen = torch.Generator().manual_seed(1234 + rank)
    if dtype.is_floating_point:
        return torch.randn(count, generator=gen, dtype=torch.float32).to(dtype)
    # Small magnitudes: integer sums wrap silently, which is harmless for
    # timing, but keep values modest so the data resembles real indices.
    low, high = (0, 16) if dtype == torch.uint8 else (-8, 8)
    return torch.randint(low, high, (count,), generator=gen, dtype=torch.int64).to(dtype)


def count_wrong(result: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements that differ from the exact expectation (NaN counts as wrong)."""
    return int((result.to(torch.float64) != expected).sum().item())
