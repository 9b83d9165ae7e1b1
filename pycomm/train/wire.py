"""Bytes a training step moved, from pycomm's own per-rank counters (pycomm.stats).

Four counts per step and rank, each the difference of the counters taken
before and after the step:

- socket_sent, socket_received: frame bytes (headers included) through TCP
  sockets: what crosses the network between hosts ("transport/socket").
- shm_ring_sent: frame bytes through shared-memory rings to peers on the same
  host ("transport/shm_ring").
- payload_sent: the collectives' own count of the data they sent, whatever
  the path (the sum of the per-op entries such as "allreduce",
  "allreduce/fp16").

When every rank is on one host, pycomm runs uncompressed all-reduce as a
shared-memory collective, which goes through neither sockets nor rings nor
the payload count: all four are then 0 for fp32 steps (no bytes moved over
any wire). ``PYCOMM_TRANSPORT=tcp`` sends them over loopback sockets instead,
which is what a run across hosts does. Over gloo there are no counters:
``counted`` is False and the counts are 0.
"""

from __future__ import annotations

import torch.distributed as dist

from pycomm.collectives import pycomm_backend

FIELDS = ("socket_sent", "socket_received", "shm_ring_sent", "payload_sent")


def _read(stats: dict[str, dict[str, float]]) -> tuple[int, ...]:
    socket = stats.get("transport/socket", {})
    ring = stats.get("transport/shm_ring", {})
    payload = sum(entry.get("bytes_sent", 0) for key, entry in stats.items() if not key.startswith("transport/"))
    return (
        int(socket.get("bytes_sent", 0)),
        int(socket.get("bytes_received", 0)),
        int(ring.get("bytes_sent", 0)),
        int(payload),
    )


class WireCounter:
    """Per-step byte counts of this rank on ``group`` (the default group if None)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self._backend = pycomm_backend(group)
        self._last = self._now()

    @property
    def counted(self) -> bool:
        """Whether the group has counters (a pycomm group) at all."""
        return self._backend is not None

    def _now(self) -> tuple[int, ...]:
        if self._backend is None:
            return (0,) * len(FIELDS)
        return _read(dict(self._backend.stats()))

    def start(self) -> None:
        """Mark the start of a step: later traffic (evaluation, say) is left out by calling this first."""
        self._last = self._now()

    def take(self) -> tuple[int, ...]:
        """The counts (in FIELDS order) since start() or the last take."""
        now = self._now()
        delta = tuple(b - a for a, b in zip(self._last, now))
        self._last = now
        return delta
