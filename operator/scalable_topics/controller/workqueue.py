"""A keyed work queue in the style of client-go's ``workqueue`` (and Strimzi's batching queue).

- A key waiting in the queue is there once, however often it is added (events coalesce).
- A key is never processed by two workers at once; an add during processing re-queues it for
  one more pass after the current one.
- A failed key is retried with per-key exponential back-off; a success resets it.
- Two levels: keys added by events (:meth:`WorkQueue.add`) are taken before keys added by the
  periodic resync (:meth:`WorkQueue.add_periodic`), and an event promotes a key waiting for its
  resync. A resync pass over 10,000 topics otherwise queued every new topic behind thousands
  of no-op reconciles; now a resync that cannot keep up only stretches its own period.
- While keys added by events are waiting or being processed, at most ``periodic_share``
  workers take resync keys: the others are free for the events' keys, and the resync's passes
  (each a GET and a status comparison) do not take the machine's CPU from them. With nothing of
  the events' to do, the resync has every worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

from ..core.backoff import Backoff

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

LONG_PASS_SECONDS = 10.0
"""A pass still running after this long is logged, once, with where it waits: a healthy pass
takes milliseconds to a few seconds (every broker and API call has a deadline), so one that
does not is a defect to find."""


def waiting_in(task: asyncio.Task[Any]) -> str:
    """The awaits ``task`` is suspended in, outermost first, one ``file:line in function`` each
    (``Task.get_stack`` stops at the task's own coroutine; this follows what it awaits)."""
    lines: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(lines) < 64:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            lines.append(f"  {awaited!r}"[:300])
            break
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "\n".join(lines)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        process: Callable[[K], Coroutine[Any, Any, None]],
        *,
        workers: int = 8,
        periodic_share: int = 2,
        backoff: Backoff | None = None,
        name: str = "work",
        clock: Callable[[], float] = time.monotonic,
        long_pass: float = LONG_PASS_SECONDS,
    ) -> None:
        self._process = process
        self._clock = clock
        self._last_progress = clock()
        self._workers = workers
        self._periodic_share = max(1, periodic_share)
        self._backoff = backoff or Backoff(0.5, 60.0, jitter=False)
        self._name = name
        self._urgent: deque[K] = deque()
        self._periodic: deque[K] = deque()
        self._queued: dict[K, bool] = {}
        """Waiting keys → whether urgent (a key sits in one deque or both after a promotion;
        the entry that does not match this is skipped)."""
        self._urgent_waiting = 0
        """How many of the waiting keys are the events' (``True`` in ``_queued``)."""
        self._available = asyncio.Event()
        self._processing: set[K] = set()
        self._processing_periodic: set[K] = set()
        """The keys being processed that a worker took from the resync's level."""
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._delayed: dict[K, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[K, asyncio.Task[None]] = {}
        self._long_pass = long_pass
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, key: K) -> None:
        self._add(key, urgent=True)

    def add_periodic(self, key: K) -> None:
        """Queue ``key`` behind every key added by :meth:`add` (a resync's pass)."""
        self._add(key, urgent=False)

    def _add(self, key: K, *, urgent: bool) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        queued = self._queued.get(key)
        if queued is not None and (queued or not urgent):
            return
        timer = self._delayed.pop(key, None)
        if timer is not None:
            timer.cancel()
        if urgent:
            self._urgent_waiting += 1
        self._queued[key] = urgent
        (self._urgent if urgent else self._periodic).append(key)
        self._idle.clear()
        self._available.set()

    def _take(self, urgent: bool) -> K | None:
        level = self._urgent if urgent else self._periodic
        while level:
            key = level.popleft()
            if self._queued.get(key) is urgent:
                del self._queued[key]
                if urgent:
                    self._urgent_waiting -= 1
                return key
        return None

    def _periodic_allowed(self) -> bool:
        events_busy = (
            len(self._processing) > len(self._processing_periodic) or self._urgent_waiting > 0
        )
        return not events_busy or len(self._processing_periodic) < self._periodic_share

    async def _next(self) -> tuple[K, bool]:
        """The next key and whether it came from the events' level."""
        while True:
            key = self._take(urgent=True)
            if key is not None:
                return key, True
            if self._periodic_allowed():
                key = self._take(urgent=False)
                if key is not None:
                    return key, False
            self._available.clear()
            await self._available.wait()

    def add_after(self, key: K, delay: float) -> None:
        if key in self._queued or key in self._delayed:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._delayed.pop(key, None)
            self.add(key)

        self._delayed[key] = loop.call_later(delay, fire)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)
        timer = self._delayed.pop(key, None)
        if timer is not None:
            timer.cancel()

    def cancel(self, predicate: Callable[[K], bool]) -> int:
        """Cancel the processing under way of every key matching ``predicate`` (leadership of
        those keys was lost); returns how many were cancelled."""
        cancelled = 0
        for key, task in list(self._running.items()):
            if predicate(key) and not task.done():
                task.cancel()
                cancelled += 1
        return cancelled

    def _still_running(self, key: K, task: asyncio.Task[None]) -> None:
        if not task.done():
            log.warning(
                "%s: %s still processing after %.0fs, waiting in:\n%s",
                self._name,
                key,
                self._long_pass,
                waiting_in(task),
            )

    @property
    def waiting(self) -> int:
        """Keys queued and not being processed (delayed retries are not waiting yet)."""
        return len(self._queued)

    @property
    def last_progress(self) -> float:
        """When (``clock``) a worker last took or finished a key, or the queue started."""
        return self._last_progress

    def __len__(self) -> int:
        return len(self._queued) + len(self._processing)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def start(self) -> None:
        if not self._tasks:
            self._last_progress = self._clock()
            self._tasks = [
                asyncio.create_task(self._work(), name=f"{self._name}-worker-{i}")
                for i in range(self._workers)
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for timer in self._delayed.values():
            timer.cancel()
        self._delayed.clear()

    async def _work(self) -> None:
        while True:
            key, urgent = await self._next()
            self._last_progress = self._clock()
            self._processing.add(key)
            if not urgent:
                self._processing_periodic.add(key)
            task = asyncio.create_task(self._process(key))
            self._running[key] = task
            watch = asyncio.get_running_loop().call_later(
                self._long_pass, self._still_running, key, task
            )
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                # The worker goes on after a pass that ``cancel`` stopped, unless the worker
                # itself is being cancelled (``stop``), even in the same loop iteration: that
                # cancellation must not be taken for the pass's and swallowed.
                worker = asyncio.current_task()
                if not task.cancelled() or (worker is not None and worker.cancelling()):
                    task.cancel()
                    raise
                log.info("%s: processing %s was cancelled", self._name, key)
                self._processing.discard(key)
            except Exception:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = self._backoff.delay_for(failures)
                log.exception(
                    "%s: processing %s failed (%d); retry in %.1fs",
                    self._name,
                    key,
                    failures,
                    delay,
                )
                self._processing.discard(key)
                self.add_after(key, delay)
            else:
                self._failures.pop(key, None)
                self._processing.discard(key)
            finally:
                self._last_progress = self._clock()
                self._running.pop(key, None)
                watch.cancel()
                self._processing_periodic.discard(key)
                if self._periodic:
                    self._available.set()  # a resync key may be allowed now
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            if not self._queued and not self._processing:
                self._idle.set()
