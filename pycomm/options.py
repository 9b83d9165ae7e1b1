"""pycomm.Options: the settings of one process group, each also readable from the environment."""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

ALGORITHMS = ("auto", "ring", "tree", "rhd")
TRANSPORTS = ("auto", "tcp", "shm")
CUDA_TRANSPORTS = ("auto", "nccl", "staged")
COMPRESSIONS = ("none", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
DEBUG_LEVELS = ("WARN", "INFO", "TRACE")
DEFAULT_CHUNK_BYTES = 512 * 1024
# The NCCL route runs a chunk's NCCL group and kernels one after another, so a chunk buys no overlap
# there, only one more NCCL latency: on an H200 (docs/PERFORMANCE.md, CUDA) 16 MiB chunks took the
# compressed all-reduce at 16-64 MiB to 1.1-1.9x torch's NCCL with fp8 and 0.9-1.2x with bf16, where
# 512 KiB ones left both at 0.12x.
DEFAULT_CUDA_CHUNK_BYTES = 16 * 1024 * 1024
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
DEFAULT_TCP_LINGER_MS = 10
# Frames a peer sent before this rank posted their receive, held per peer. A broadcast root or a
# sender that runs ahead of a late receiver legitimately fills it with up to the op's size (a chain
# broadcast sends every chunk at once), so it is generous; a program that sends more than this
# ahead of its receivers must raise it (the error names the option).
DEFAULT_UNEXPECTED_BYTES = 4 << 30

# field -> environment variable read when the field is left as None
ENVIRONMENT = {
    "algorithm": "PYCOMM_ALGO",
    "compression": "PYCOMM_COMPRESSION",
    "transport": "PYCOMM_TRANSPORT",
    "cuda_transport": "PYCOMM_CUDA_TRANSPORT",
    "socket_ifname": "PYCOMM_SOCKET_IFNAME",
    "chunk_bytes": "PYCOMM_CHUNK_BYTES",
    "cuda_chunk_bytes": "PYCOMM_CUDA_CHUNK_BYTES",
    "bucket_bytes": "PYCOMM_BUCKET_BYTES",
    "tcp_linger_ms": "PYCOMM_TCP_LINGER_MS",
    "unexpected_bytes": "PYCOMM_UNEXPECTED_BYTES",
    "debug": "PYCOMM_DEBUG",
}


def _choice(name: str, value: str, valid: tuple[str, ...]) -> str:
    normalized = value.upper() if valid is DEBUG_LEVELS else value.lower()
    if normalized not in valid:
        raise ValueError(f"pycomm: unknown {name} {value!r}; valid values: {', '.join(valid)}")
    return normalized


# The core takes longer timeouts as this one (csrc/core/communicator.h, kMaxTimeout).
MAX_TIMEOUT_MS = 10 * 365 * 24 * 3600 * 1000

# Below this a chunk costs more in per-frame overhead (~8 us) than it saves in overlap.
MIN_CHUNK_BYTES = 4096


def _positive_int(name: str, value: Any, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"pycomm: {name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"pycomm: {name} must be at least {minimum} bytes, got {number}")
    return number


# The fields of Options that name one of a few choices (field, what errors call it, the choices),
# and those that hold a size in bytes (field, smallest allowed), in the order they are checked.
_CHOICES = (
    ("algorithm", "algorithm", ALGORITHMS),
    ("compression", "compression", COMPRESSIONS),
    ("transport", "transport", TRANSPORTS),
    ("cuda_transport", "cuda_transport", CUDA_TRANSPORTS),
    ("debug", "debug level", DEBUG_LEVELS),
)
_SIZES = (
    ("chunk_bytes", MIN_CHUNK_BYTES),
    ("cuda_chunk_bytes", MIN_CHUNK_BYTES),
    ("bucket_bytes", 1),
    ("unexpected_bytes", MIN_CHUNK_BYTES),
)


@dataclasses.dataclass
class Options:
    """Settings for a pycomm process group; pass as ``pg_options`` to ``init_process_group``.

    Every field left as None is read from its environment variable (see ``ENVIRONMENT``), then
    falls back to the default. Unknown values raise ValueError listing the valid ones.
    """

    algorithm: str | None = None  # all-reduce schedule: auto, ring, tree, rhd
    compression: str | None = None  # none, fp16, bf16, fp8_e4m3, fp8_e5m2 (fp32 all-reduce etc.)
    transport: str | None = None  # auto, tcp, shm (one host only)
    socket_ifname: str | None = None  # interface to listen on (default: the one reaching the store)
    chunk_bytes: int | None = None  # pipelining grain of large ops
    cuda_chunk_bytes: int | None = None  # the same for CUDA tensors on the NCCL route
    bucket_bytes: int | None = None  # all_reduce_coalesced fuses tensors into buckets this large
    timeout: datetime.timedelta | float | None = None  # overrides init_process_group's timeout
    debug: str | None = None  # WARN, INFO (one line per op), TRACE
    # CUDA tensors: auto (NCCL point-to-point when every rank has a GPU of its own and NCCL loads,
    # else staged through host memory), nccl (NCCL or an error), staged
    cuda_transport: str | None = None
    # How long a TCP socket that a waiting thread drained stays with the waiting threads before the
    # event loop watches it again (docs/ALGORITHMS.md); 0 hands it back at once
    tcp_linger_ms: int | None = None
    # Bytes of messages that arrive before their receive is posted that a rank holds per peer; a
    # peer that sends more is failed with an error that says so
    unexpected_bytes: int | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        # Each option that was set, normalised in place; unset ones stay None (the environment's).
        for field, label, names in _CHOICES:
            if getattr(self, field) is not None:
                setattr(self, field, _choice(label, getattr(self, field), names))
        for field, minimum in _SIZES:
            if getattr(self, field) is not None:
                setattr(self, field, _positive_int(field, getattr(self, field), minimum))
        if self.unexpected_bytes is not None and self.unexpected_bytes >= 1 << 63:
            raise ValueError(f"pycomm: unexpected_bytes must be below 2**63, got {self.unexpected_bytes}")
        if self.tcp_linger_ms is not None:
            try:
                self.tcp_linger_ms = int(self.tcp_linger_ms)
            except (TypeError, ValueError):
                raise ValueError(f"pycomm: tcp_linger_ms must be an integer, got {self.tcp_linger_ms!r}") from None
            if not 0 <= self.tcp_linger_ms <= 3_600_000:
                raise ValueError(f"pycomm: tcp_linger_ms must be 0 to 3600000 ms, got {self.tcp_linger_ms}")
        if self.timeout is not None and not isinstance(self.timeout, (datetime.timedelta, int, float)):
            raise ValueError(f"pycomm: timeout must be a timedelta or seconds, got {self.timeout!r}")
        if self.timeout is not None:
            seconds = self.timeout.total_seconds() if isinstance(self.timeout, datetime.timedelta) else self.timeout
            if not seconds > 0:
                raise ValueError(f"pycomm: timeout must be positive, got {self.timeout!r}")

    def resolved(self) -> Options:
        """A copy with every unset field taken from the environment or the default."""
        values = dataclasses.asdict(self)
        for field, variable in ENVIRONMENT.items():
            if values[field] is None and os.environ.get(variable):
                values[field] = os.environ[variable]
        values["algorithm"] = values["algorithm"] or "auto"
        values["transport"] = values["transport"] or "auto"
        values["cuda_transport"] = values["cuda_transport"] or "auto"
        values["compression"] = values["compression"] or "none"
        values["chunk_bytes"] = values["chunk_bytes"] or DEFAULT_CHUNK_BYTES
        values["cuda_chunk_bytes"] = values["cuda_chunk_bytes"] or DEFAULT_CUDA_CHUNK_BYTES
        values["bucket_bytes"] = values["bucket_bytes"] or DEFAULT_BUCKET_BYTES
        values["debug"] = values["debug"] or "WARN"
        values["unexpected_bytes"] = values["unexpected_bytes"] or DEFAULT_UNEXPECTED_BYTES
        if values["tcp_linger_ms"] is None:
            values["tcp_linger_ms"] = DEFAULT_TCP_LINGER_MS
        try:
            return Options(**values)
        except ValueError as error:
            raise ValueError(f"{error} (check the PYCOMM_* environment variables)") from None

    def timeout_ms(self, default: datetime.timedelta) -> int:
        timeout = self.timeout if self.timeout is not None else default
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        # torch wraps timedelta.max around into a negative timedelta before the backend sees it
        # (new_group(timeout=timedelta.max) arrives as days=-67519912): a timeout that is not
        # positive can only be that, so it means "as long as possible", as does anything past the
        # core's limit (about 10 years, where steady-clock deadlines would overflow).
        if not seconds > 0 or seconds * 1000 >= MAX_TIMEOUT_MS:
            return MAX_TIMEOUT_MS
        return max(1, int(seconds * 1000))
