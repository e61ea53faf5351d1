"""A one-line progress indicator on stderr (spinner, label, elapsed time) for long waits.

It draws only on a terminal; in a pipe or CI log it prints the label once and the outcome.
The outcome is what the caller reports with :meth:`Progress.finish` (e.g. ``Rejected``), else
``failed`` when the block raised (``interrupted`` on Ctrl-C) and ``done`` when it did not.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from types import TracebackType
from typing import TextIO

_FRAMES = "|/-\\"
_INTERRUPTS = (asyncio.CancelledError, KeyboardInterrupt)


class Progress:
    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._frames = itertools.cycle(_FRAMES)
        self._started = time.monotonic()
        self._detail = ""
        self._outcome: str | None = None

    def __enter__(self) -> Progress:
        if not self.tty:
            print(f"{self.label} …", file=self.stream, flush=True)
        self._draw()
        return self

    def update(self, detail: str) -> None:
        if detail != self._detail and not self.tty:
            print(f"  {detail}", file=self.stream, flush=True)
        self._detail = detail
        self._draw()

    def finish(self, outcome: str) -> None:
        """The outcome to report on exit, instead of ``done``."""
        self._outcome = outcome

    def _draw(self) -> None:
        if self.tty:
            elapsed = time.monotonic() - self._started
            line = f"\r{next(self._frames)} {self.label} [{elapsed:5.1f}s] {self._detail}"
            self.stream.write(line[:120].ljust(120))
            self.stream.flush()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed = time.monotonic() - self._started
        if exc_type is not None and issubclass(exc_type, _INTERRUPTS):
            outcome = "interrupted"
        elif exc_type is not None:
            outcome = "failed"
        else:
            outcome = self._outcome or "done"
        if self.tty:
            self.stream.write("\r" + " " * 120 + "\r")
        print(f"{self.label}: {outcome} in {elapsed:.1f}s", file=self.stream, flush=True)
