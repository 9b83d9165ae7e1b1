"""pycomm.train: a thin data-parallel trainer that exercises pycomm under DDP.

A tiny character-level transformer learns the Python standard library's own
source (a corpus every machine with Python has), data parallel over
``--backend pycomm|gloo`` with an optional gradient-compression comm hook.
It reports train/validation loss, tokens per second and the share of step
time spent in communication. Run ``python -m pycomm.train --help``.
"""

from __future__ import annotations

from pycomm.train.config import TrainConfig

__all__ = ["TrainConfig"]
