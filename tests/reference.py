"""Deterministic inputs and backend-independent reference results.

Every rank can rebuild every other rank's input from ``(seed, rank)``, so each
rank computes the expected result of a collective locally, in float64 (floats)
or int64 (integers, bool), without trusting any backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

FLOAT_DTYPES: tuple[torch.dtype, ...] = (
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
)
INT_DTYPES: tuple[torch.dtype, ...] = (
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
)
ALL_DTYPES: tuple[torch.dtype, ...] = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)

FLOAT_OPS: tuple[str, ...] = ("sum", "avg", "product", "min", "max", "premul_sum")
# AVG / PREMUL_SUM are only defined for floating dtypes; bitwise ops only for integral ones.
INT_OPS: tuple[str, ...] = ("sum", "product", "min", "max", "band", "bor", "bxor")
# Ops whose results grow with the inputs: integer inputs must stay small so that
# PRODUCT over 5 ranks (full sweep) does not overflow int8/uint8.
ARITHMETIC_OPS = frozenset({"sum", "avg", "product", "premul_sum"})
# Ops whose float result is computed with rounding (others are exact selections).
_ROUNDED_OPS = frozenset({"sum", "avg", "premul_sum", "product"})
# Not a power of two, so premultiplication is not an exact exponent shift.
PREMUL_FACTOR = 1.7


def ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


def _rng(seed: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(
        (seed * 1_000_003 + rank * 7_919 + 17) % (2**62)
    )


def make_input(
    seed: int,
    rank: int,
    shape: Sequence[int],
    dtype: torch.dtype,
    *,
    full_range: bool = False,
) -> torch.Tensor:
    """Rank ``rank``'s input for case ``seed``: same bytes in every process.

    Floats are standard normal (rounded to ``dtype``). Integers are in a small
    range ([-2, 2], uint8 [0, 3]) so SUM/PRODUCT cannot overflow, unless
    ``full_range`` is set: then every bit pattern is possible, which is what
    bitwise ops, MIN/MAX and pure data movement should be tested with (it
    catches truncated element sizes and sign handling).
    """
    g = _rng(seed, rank)
    shape = tuple(shape)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.uint8).to(torch.bool)
    if full_range:
        numel = 1
        for d in shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (numel * itemsize,), generator=g, dtype=torch.uint8)
        return raw.view(dtype).reshape(shape)
    low, high = (0, 4) if dtype == torch.uint8 else (-2, 3)
    return torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(dtype)


def input_for(
    seed: int, rank: int, shape: Sequence[int], dtype: torch.dtype, op: str | None
) -> torch.Tensor:
    """make_input with the value range appropriate for reduce op ``op`` (None: data movement)."""
    return make_input(seed, rank, shape, dtype, full_range=op not in ARITHMETIC_OPS)


# The reductions that read the same for floats and integers, over the stacked inputs (dim 0).
_ORDER_REDUCTIONS = {"product": lambda s: s.prod(0), "min": lambda s: s.amin(0), "max": lambda s: s.amax(0)}
_BITWISE = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def reference_reduce(inputs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce the per-rank inputs; float64 for floating dtypes, int64 otherwise."""
    dtype = inputs[0].dtype
    world = len(inputs)
    floating = dtype.is_floating_point
    s = torch.stack([x.to(torch.float64 if floating else torch.int64) for x in inputs])
    if op in _ORDER_REDUCTIONS:
        return _ORDER_REDUCTIONS[op](s)
    if floating:
        if op == "sum":
            return s.sum(0)
        if op == "avg":
            return s.sum(0) / world
        if op == "premul_sum":
            return s.sum(0) * PREMUL_FACTOR
    elif op == "sum":
        # bool SUM is logical OR (torch/NCCL convention); ints are small, no overflow.
        return (s.sum(0) != 0).long() if dtype == torch.bool else s.sum(0)
    elif op in _BITWISE:
        return functools.reduce(_BITWISE[op], s.unbind(0))
    raise ValueError(f"op {op!r} is not defined for {dtype}")


def rel_tol(dtype: torch.dtype, world: int) -> float:
    """Relative tolerance for rounded float reductions.

    fp16/bf16 results are rounded to the dtype at every ring hop, so the bound
    grows with the number of ranks.
    """
    if dtype == torch.float64:
        return 1e-12
    if dtype == torch.float32:
        return 1e-5
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2 * world
    raise ValueError(f"no tolerance for {dtype}")


def error_scale(inputs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Per-element magnitude that rounding errors of ``op`` are proportional to.

    For sums this is sum(|x_i|), not |sum(x_i)|: intermediate partial sums can
    be much larger than the (possibly cancelling) final value.
    """
    s = torch.stack([x.to(torch.float64) for x in inputs])
    if op == "product":
        return s.prod(0).abs()
    scale = s.abs().sum(0)
    if op == "avg":
        return scale / len(inputs)
    if op == "premul_sum":
        return scale * abs(PREMUL_FACTOR)
    return scale


def _describe(bad: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor) -> str:
    flat_bad = bad.reshape(-1).nonzero()
    first = int(flat_bad[0])
    a = actual.reshape(-1)[first].item()
    e = expected.reshape(-1)[first].item()
    return f"{len(flat_bad)}/{bad.numel()} elements wrong; first at flat index {first}: got {a!r}, expected {e!r}"


def check_reduced(
    actual: torch.Tensor, inputs: Sequence[torch.Tensor], op: str
) -> str | None:
    """None if ``actual`` is the ``op``-reduction of ``inputs``, else a description."""
    return reduced_checker(inputs, op)(actual)


def reduced_checker(
    inputs: Sequence[torch.Tensor], op: str
) -> Callable[[torch.Tensor], str | None]:
    """check_reduced with the reference and tolerance computed once: for checking several
    results of one reduction (one per algorithm, say) when the inputs are large."""
    dtype = inputs[0].dtype
    expected = reference_reduce(inputs, op)
    tol: torch.Tensor | None = None
    if dtype.is_floating_point and op in _ROUNDED_OPS:
        rtol = rel_tol(dtype, len(inputs))
        tol = rtol * error_scale(inputs, op) + rtol * 1e-3
    elif not dtype.is_floating_point and dtype != torch.bool:
        expected = expected.to(dtype).to(torch.int64)  # wrap to the dtype like C would

    def check(actual: torch.Tensor) -> str | None:
        if actual.dtype != dtype:
            return f"dtype {actual.dtype}, expected {dtype}"
        if tuple(actual.shape) != tuple(expected.shape):
            return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        if tol is not None:
            got = actual.to(torch.float64)
            bad = ~((got - expected).abs() <= tol)  # NaN counts as bad
            return _describe(bad, got, expected) if bool(bad.any()) else None
        if dtype.is_floating_point:
            # MIN/MAX select one of the inputs: exact.
            got = actual.to(torch.float64)
            bad = got != expected
            return _describe(bad, got, expected) if bool(bad.any()) else None
        if dtype == torch.bool:
            # Compare the raw bytes: a bool tensor holding 2 is not a valid bool.
            got = actual.contiguous().view(torch.uint8).to(torch.int64)
        else:
            got = actual.to(torch.int64)
        bad = got != expected
        return _describe(bad, got, expected) if bool(bad.any()) else None

    return check


def check_equal(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Bit-exact comparison for pure data movement (broadcast, gathers, all_to_all...)."""
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.numel() == 0:
        return None
    a = actual.contiguous().reshape(-1).view(torch.uint8).reshape(actual.numel(), -1)
    e = (
        expected.contiguous()
        .reshape(-1)
        .view(torch.uint8)
        .reshape(expected.numel(), -1)
    )
    bad = (a != e).any(1)
    return _describe(bad, actual, expected) if bool(bad.any()) else None
