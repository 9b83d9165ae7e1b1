"""Byte sizes on the command line: ``4K``, ``64M``, ``4K:256M`` and sweeps."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse ``512``, ``4K``, ``4KiB``, ``64M``... (binary units, as nccl-tests)."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise ValueError(f"bad size {text!r} (expected e.g. 512, 4K, 64M, 1G)")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def parse_size_range(text: str) -> tuple[int, int]:
    """``LO:HI`` or a single size (LO == HI)."""
    parts = text.split(":")
    if len(parts) == 1:
        size = parse_size(parts[0])
        return size, size
    if len(parts) != 2:
        raise ValueError(f"bad size range {text!r} (expected LO:HI, e.g. 4K:64M)")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    if lo > hi:
        raise ValueError(f"size range {text!r} has LO > HI")
    return lo, hi


def sweep(lo: int, hi: int, factor: float) -> list[int]:
    """Geometric sweep lo, lo*f, lo*f^2, ... <= hi (nccl-tests ``-b/-e/-f``)."""
    if factor <= 1.0:
        raise ValueError("factor must be > 1")
    sizes: list[int] = []
    size = float(lo)
    while int(size) <= hi:
        if not sizes or int(size) != sizes[-1]:
            sizes.append(int(size))
        size *= factor
    return sizes


def format_size(nbytes: int) -> str:
    """Short human form used in plots and the progress bar: 4K, 1M, 1.5M."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes}B"
