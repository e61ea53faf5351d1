"""The stalls that no produce stage shows: while the event loop does not run, SEND frames wait
in the socket before any stage starts. Two metrics measure them:

- ``segment_broker_event_loop_lag_seconds``: how late a timer due every 50 ms fires;
- ``segment_broker_gc_pause_seconds{generation}``: each collection of Python's cyclic garbage
  collector (it stops the whole process, every thread that needs the GIL included).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

from prometheus_client import Histogram

LAG_INTERVAL = 0.05


class PauseMonitor:
    def __init__(self, lag: Histogram, gc_pause: Histogram) -> None:
        self._lag = lag
        self._gc = [gc_pause.labels(str(g)) for g in range(3)]
        self._gc_started = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._lag_loop(), name="loop-lag")

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc[int(info["generation"])].observe(time.perf_counter() - self._gc_started)

    async def _lag_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            self._lag.observe(max(0.0, loop.time() - due))
