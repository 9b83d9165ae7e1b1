"""What one benchmark run measures; built by the CLI, pickled to every rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

# dtype names accepted by --dtype, mapped to torch attribute names. Kept as
# strings so this module (and the CLI's --help) does not need torch.
DTYPES: dict[str, str] = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "float64": "float64",
    "double": "float64",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}

# Backends whose process groups take pycomm.Options.
PYCOMM = "pycomm"

# Largest N such that integers up to N survive each pycomm wire codec
# exactly (None: lossless). fp16/bf16 are plain casts, so small integers pass
# unchanged and any wrong element is a bug. Codecs not listed get no
# exactness promise: pycomm's fp8 codecs scale each block (x / (amax/448)),
# which rounds even small integers, so their wrong counts are reported but
# do not fail the run.
CODEC_EXACT_LIMIT: dict[str, int | None] = {
    "none": None,
    "fp16": 1 << 11,
    "bf16": 1 << 8,
}


@dataclass(frozen=True)
class Variant:
    """One measured configuration: a backend plus (for pycomm) its options.

    Each variant gets its own process group, so e.g. ``--algo ring,tree``
    compares two pycomm groups side by side within the same ranks.
    """

    backend: str
    label: str
    algo: str | None = None
    compression: str | None = None
    transport: str | None = None
    chunk_bytes: int | None = None

    @property
    def exact(self) -> bool:
        """Whether a wrong element is a failure. The check data is exact in
        every codec listed in data.CODEC_EXACT_LIMIT; for other (unknown,
        possibly lossy) codecs wrong elements are reported but excused."""
        return (self.compression or "none") in CODEC_EXACT_LIMIT

    def pycomm_options(self) -> dict[str, object]:
        """Keyword arguments for pycomm.Options (only the ones the user set)."""
        opts: dict[str, object] = {
            "algorithm": self.algo,
            "compression": self.compression,
            "transport": self.transport,
            "chunk_bytes": self.chunk_bytes,
        }
        return {key: value for key, value in opts.items() if value is not None}


def build_variants(
    backends: list[str],
    algos: list[str] | None,
    compressions: list[str] | None,
    transport: str | None,
    chunk_bytes: list[int] | None,
) -> tuple[Variant, ...]:
    """Expand the backend list: pycomm fans out over --algo x --compression.

    Other backends ignore pycomm options and appear once each. Duplicate
    backends (``gloo,gloo``: a noise-floor check) get ``#2``-style labels.
    """
    variants: list[Variant] = []
    seen: dict[str, int] = {}
    for backend in backends:
        combos: list[tuple[str | None, str | None, int | None]] = [(None, None, None)]
        if backend == PYCOMM:
            algo_choices: list[str | None] = list(algos) if algos else [None]
            comp_choices: list[str | None] = list(compressions) if compressions else [None]
            chunk_choices: list[int | None] = list(chunk_bytes) if chunk_bytes else [None]
            combos = list(product(algo_choices, comp_choices, chunk_choices))
        for algo, comp, chunk in combos:
            label = backend
            if backend == PYCOMM:
                if algo:
                    label += f"/{algo}"
                if comp:
                    label += f"+{comp}"
                # Only named when several are compared (the overlap mode: pipelined vs one chunk).
                if chunk and chunk_bytes and len(chunk_bytes) > 1:
                    label += f" chunk={_size_label(chunk)}"
            seen[label] = seen.get(label, 0) + 1
            if seen[label] > 1:
                label = f"{label}#{seen[label]}"
            variants.append(
                Variant(
                    backend=backend,
                    label=label,
                    algo=algo,
                    compression=comp,
                    transport=transport if backend == PYCOMM else None,
                    chunk_bytes=chunk if backend == PYCOMM else None,
                )
            )
    return tuple(variants)


def _size_label(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


@dataclass(frozen=True)
class BenchConfig:
    """Everything a rank needs; plain data (it pickles, for a launcher that sends it)."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    variants: tuple[Variant, ...]
    warmup: int = 5
    iters: int | None = None  # None: auto, from target_time
    reps: int = 5
    target_time: float = 0.2  # seconds per size per variant, all reps together
    max_iters: int = 1000
    check: bool = True
    timeout_s: float = 120.0
    json_path: str | None = None
    plot_path: str | None = None
    command: str = ""
    launcher: str = "local"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def needs_pycomm(self) -> bool:
        return any(v.backend == PYCOMM for v in self.variants)
