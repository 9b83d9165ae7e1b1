"""Op names without importing torch (so --help and flag errors stay fast).

Must match descriptors.COLLECTIVES; a test checks that it does.
"""

from __future__ import annotations

OP_NAMES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
)
