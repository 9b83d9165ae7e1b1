"""The start of a rank that a namespace-host test runs as a script (multihost_worker.py,
shrink_multihost_worker.py): its command line (--rank, --world, --master, --port) and joining the
pycomm default group over tcp:// at the master's address."""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist


def join_group(**init_options: Any) -> argparse.Namespace:
    """Parses the rank's command line, joins the group with `init_options` and returns the arguments."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("pycomm", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank,
                            world_size=args.world, **init_options)
    return args
