"""A one-line progress bar on stderr (no tqdm dependency).

Drawn only when stderr is a terminal: in logs and CI a carriage-return bar is
noise, and the table on stdout already shows progress row by row.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.start = time.monotonic()
        self._drawn = False
        self._what = ""

    def advance(self) -> None:
        self.done += 1
        self.draw(self._what)

    def draw(self, what: str = "") -> None:
        """Redraw; ``what`` names the step in progress."""
        self._what = what
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // self.total
        elapsed = time.monotonic() - self.start
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.0f}s {what}\x1b[K")
        self.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the bar before stdout lines land on the same terminal."""
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False
