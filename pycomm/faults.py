"""What a program needs to act on a failed collective: which ranks of the group were lost.

A collective that fails because a rank died (its connection closed) or froze (a wait for it ran
past the group's timeout) raises a RuntimeError whose message names the rank; ``failed_ranks``
gives the same ranks as numbers, ready for ``dist.shrink_group``::

    try:
        dist.all_reduce(t)
    except RuntimeError:
        group = dist.shrink_group(pycomm.failed_ranks())

Ranks count as lost when this rank lost its connection to them, waited for them past the timeout,
or heard from a peer (in the peer's failure report) that the peer lost them. The group's
``get_error()`` says which of these happened last: COMM_ERROR, TIMEOUT or REMOTE_ERROR.
"""

from __future__ import annotations

import torch.distributed as dist

from pycomm.collectives import pycomm_backend


def failed_ranks(group: dist.ProcessGroup | None = None) -> list[int]:
    """The ranks of ``group`` (the default group if None) this rank knows to be lost, ascending.

    Group ranks, as ``dist.shrink_group`` takes them. Empty while nothing failed. Raises TypeError
    for a group that does not run pycomm.
    """
    backend = pycomm_backend(group)
    if backend is None:
        raise TypeError("pycomm.failed_ranks: this process group does not run the pycomm backend")
    return [int(r) for r in backend.failed_ranks()]
