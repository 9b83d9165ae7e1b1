"""Microbenchmarks for pycomm collectives, modeled on nccl-tests.

Run ``python -m pycomm.bench --help``. The package deliberately never imports
``pycomm`` itself at import time (only the ranks do, and only when the
"pycomm" backend is requested), so the suite can measure gloo alone while the
native extension is not built.
"""

from __future__ import annotations

from pycomm.bench.cli import main

__all__ = ["main"]
