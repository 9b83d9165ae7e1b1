"""Entry point for ``python -m pycomm.train``."""

from __future__ import annotations

import sys

from pycomm.train.cli import main

# The guard keeps importing this module (e.g. by a tool that lists entry points) from running it.
if __name__ == "__main__":
    sys.exit(main())
