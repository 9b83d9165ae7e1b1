"""pycomm.train: a thin data-parallel trainer that exercises pycomm under DDP.

A character-level transformer (``--model small`` or ``large``, the latter with a
hashed n-gram embedding of tens of millions of parameters) learns the Python
standard library's own source (a corpus every machine with Python has), data
parallel over ``--backend pycomm|gloo`` with an optional gradient-compression
comm hook. It reports train/validation loss curves, tokens per second, the
communication the steps waited for, and the bytes they put on the wire. Run
``python -m pycomm.train --help``.
"""

from __future__ import annotations

from pycomm.train.config import TrainConfig

__all__ = ["TrainConfig"]
