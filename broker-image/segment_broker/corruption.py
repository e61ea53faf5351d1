"""Keeps ``Segment.status.corruption`` in step with the broker's quarantined segments.

A broker finds corruption mostly while it recovers, which is also when the API server may be
unreachable (a node restart). So a segment's wanted value (the corruption, or ``None`` once an
operator truncated it) is kept here and written by one background task, retried with back-off
until it is written or replaced by a newer value; a value is never dropped on a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

SegmentKey = tuple[str, str, int]


class CorruptionReporter(Protocol):
    async def write_corruption(
        self, namespace: str, topic: str, segment_id: int, corruption: dict[str, Any] | None
    ) -> None:
        """Write (or, with None, clear) the segment's ``status.corruption``; raise to retry."""


class CorruptionStatus:
    def __init__(
        self, reporter: CorruptionReporter, *, first_retry_s: float = 0.5, max_retry_s: float = 30.0
    ) -> None:
        self.reporter = reporter
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self._wanted: dict[SegmentKey, dict[str, Any] | None] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.failures = 0

    def set(self, key: SegmentKey, corruption: dict[str, Any] | None) -> None:
        """Ask for ``corruption`` (None: cleared) to be written; a newer call replaces it."""
        self._wanted[key] = corruption
        self._idle.clear()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="segment corruption status"
            )

    @property
    def pending(self) -> int:
        return len(self._wanted)

    async def _run(self) -> None:
        delay = self.first_retry_s
        while True:
            self._wake.clear()
            for key, body in list(self._wanted.items()):
                try:
                    await self.reporter.write_corruption(*key, body)
                except Exception as exc:
                    self.failures += 1
                    log.warning(
                        "segment %s/%s/%d: writing status.corruption failed (%s); retrying in "
                        "%.1f s",
                        *key,
                        exc,
                        delay,
                    )
                    continue
                self.written += 1
                if self._wanted.get(key, ...) is body:
                    del self._wanted[key]
            if not self._wanted:
                delay = self.first_retry_s
                self._idle.set()
                await self._wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                # Woken early by a new value; otherwise retry what failed after the delay.
                await asyncio.wait_for(self._wake.wait(), delay)
            delay = min(delay * 2, self.max_retry_s)

    async def close(self, within: float = 5.0) -> None:
        """Give the writes still wanted up to ``within`` seconds, then stop (a corruption not
        written yet is found and reported again at the next start)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), within)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
