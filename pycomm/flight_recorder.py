"""The flight recorder's dumps on request: the last ops of every pycomm group in this process, in the
format torch's analyzer reads (``python -m torch.distributed.flight_recorder.fr_trace DIR``).

Recording follows torch's variables: ``TORCH_FR_BUFFER_SIZE`` entries are kept (2000 by default; 0
turns it off), and with ``TORCH_FR_DUMP_TEMP_FILE`` set every rank also dumps to
``${TORCH_FR_DUMP_TEMP_FILE}<rank>`` when a collective times out and on ``abort()``."""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch.distributed as dist

from pycomm import _C
from pycomm.collectives import _backend


def _rank(group: dist.ProcessGroup | None) -> int:
    return int(_backend(group).global_rank)


def dump_flight_recorder(path: str | None = None, group: dist.ProcessGroup | None = None) -> str:
    """Writes this process's dump to `path`, by default ``${TORCH_FR_DUMP_TEMP_FILE}<rank>`` (the
    rank in the default group, through `group`'s backend); returns the path written. Raises
    ValueError if neither is given and RuntimeError naming the path if it cannot be written."""
    if path is None:
        prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "")
        if not prefix:
            raise ValueError("pycomm: dump_flight_recorder needs a path, or TORCH_FR_DUMP_TEMP_FILE set to a prefix")
        path = f"{prefix}{_rank(group)}"
    _C.flight_recorder_dump(path)
    return path


def flight_recorder_entries() -> dict[str, Any]:
    """The dump as a dict (what the analyzer loads): version, pg_config and entries."""
    loaded: dict[str, Any] = pickle.loads(_C.flight_recorder_bytes())
    return loaded
