"""pycomm: collective communication for PyTorch, as the torch.distributed backend "pycomm".

``import pycomm`` registers the backend; then ``dist.init_process_group("pycomm")``.
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch, which the extension links against)

from pycomm import _C
from pycomm.backend import register
from pycomm import hooks
from pycomm.collectives import (
    all_reduce,
    bucketed_all_reduce,
    direct_all_reduce,
    monitored_barrier,
    set_algorithm,
    stats,
)
from pycomm.faults import failed_ranks
from pycomm.flight_recorder import dump_flight_recorder, flight_recorder_entries
from pycomm.options import Options

__all__ = [
    "Options",
    "all_reduce",
    "bucketed_all_reduce",
    "cuda_available",
    "direct_all_reduce",
    "dump_flight_recorder",
    "failed_ranks",
    "flight_recorder_entries",
    "hooks",
    "monitored_barrier",
    "set_algorithm",
    "stats",
    "__version__",
]
__version__ = "0.1.0"


def cuda_available() -> bool:
    """Whether this build of pycomm has its CUDA kernels compiled in.

    CUDA tensors are accepted either way (staged through pinned host memory) when torch has CUDA.
    """
    return bool(_C.cuda_available())


register()
