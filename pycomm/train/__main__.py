"""Entry point for ``python -m pycomm.train``."""

from __future__ import annotations

import sys

from pycomm.train.cli import main

# The guard matters: local ranks are started with the "spawn" method, which
# re-imports the main module as __mp_main__ in every child.
if __name__ == "__main__":
    sys.exit(main())
