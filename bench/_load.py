"""Open-loop load generation (wrk2 style) and consumption, run inside a pinned worker process.

The generator never waits for the system under test to decide when to send: message `i` has
the intended send time `start + i / rate`. Every 1 ms tick the messages that became due are
queued as one *group* (count, intended time of the group's middle message); batches of up to
`batch` messages are taken from the queue while fewer than `window` messages are in flight.
When a batch is acknowledged, every group portion in it is recorded in the HdrHistogram once,
with its count, as `ack time - intended time`. Queueing inside the generator therefore counts
as latency (no coordinated omission); grouping per tick bounds the timing error to ±0.5 ms.

`rate=None` is the closed-loop probe: the window is kept full and latency is measured from the
moment a batch is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hdrh.histogram import HdrHistogram

TICK = 0.001
SETTLE_TIMEOUT = 60.0
"""After the drain deadline, how long in-flight batches may take before they are cancelled."""
HIST_MAX_US = 600_000_000


class Producer(Protocol):
    async def send(self, n: int) -> None:
        """Send `n` messages and return once all of them are acknowledged."""

    async def close(self) -> None: ...


class Consumer(Protocol):
    async def consume(self, max_messages: int, duration: float) -> tuple[int, float]:
        """Receive and acknowledge up to `max_messages` within `duration`; (count, seconds)."""

    async def close(self) -> None: ...


async def consume_batches(
    max_messages: int, duration: float, take: Callable[[int], Awaitable[int | None]]
) -> tuple[int, float]:
    """The receive loop of every `Consumer.consume`, so that all systems are timed alike.

    `take(remaining)` receives and acknowledges one batch and returns its message count (0:
    nothing this time, ask again; None: the source is exhausted). The loop stops at
    `max_messages`, at `duration` or on None, and returns (messages, seconds from the start to
    the last batch received).
    """
    t0 = time.monotonic()
    deadline = t0 + duration
    n = 0
    last = t0
    while n < max_messages and time.monotonic() < deadline:
        got = await take(max_messages - n)
        if got is None:
            break
        if got:
            n += got
            last = time.monotonic()
    return n, last - t0


class Adapter(Protocol):
    async def reset(self) -> None:
        """Make the stream/segment under test exist and be empty."""

    async def producer(self, payload_size: int, batch: int, window: int) -> Producer: ...

    async def consumer(self, batch: int) -> Consumer: ...


AdapterFactory = Callable[[dict[str, Any]], Awaitable[Adapter]]


@dataclass(frozen=True)
class StepSpec:
    system: str
    endpoint: dict[str, Any]
    payload: int
    rate: float | None
    duration: float
    warmup: float
    batch: int
    window: int
    drain: float = 5.0


@dataclass
class StepResult:
    offered: float | None
    achieved: float
    sent: int = 0
    acked: int = 0
    errors: int = 0
    unfinished: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    p999_ms: float = 0.0
    max_ms: float = 0.0
    mean_ms: float = 0.0
    recorded: int = 0
    gen_lag_max_ms: float = 0.0
    gen_lag_p99_ms: float = 0.0
    client_cpu: float = 0.0
    wall: float = 0.0
    hist: str = ""
    first_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConsumeSpec:
    system: str
    endpoint: dict[str, Any]
    batch: int
    max_messages: int
    duration: float


@dataclass
class ConsumeResult:
    received: int
    seconds: float
    client_cpu: float
    wall: float

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds > 0 else 0.0


class _Driver:
    def __init__(self, producer: Producer, spec: StepSpec) -> None:
        self.producer = producer
        self.spec = spec
        self.loop = asyncio.get_running_loop()
        self.hist = HdrHistogram(1, HIST_MAX_US, 3)
        self.lag = HdrHistogram(1, HIST_MAX_US, 2)
        self.queue: deque[list[float]] = deque()  # [remaining count, intended time]
        self.queued = 0
        self.inflight = 0
        self.sent = 0
        self.acked = 0
        self.acked_in_window = 0
        self.errors = 0
        self.first_error: str | None = None
        self.tasks: dict[asyncio.Task[None], list[tuple[int, float]]] = {}
        self.start = 0.0
        self.measure_from = 0.0
        self.end = 0.0
        self.idle = asyncio.Event()
        self.generating = True
        self.stopping = False

    def _record(self, portions: list[tuple[int, float]], now: float) -> None:
        for count, intended in portions:
            if intended >= self.measure_from:
                self.hist.record_value(max(1, int((now - intended) * 1e6)), count)

    def refill(self, now: float) -> None:
        """Closed loop: keep the window full; latency counts from the moment of queueing."""
        free = self.spec.window - self.inflight - self.queued
        if free > 0:
            self.queue.append([float(free), now])
            self.queued += free

    def dispatch(self) -> None:
        if self.stopping:
            return
        if self.spec.rate is None and self.generating:
            self.refill(self.loop.time())
        batch, window = self.spec.batch, self.spec.window
        while self.queued:
            n = min(batch, self.queued)
            if self.inflight + n > window:
                return
            portions: list[tuple[int, float]] = []
            need = n
            while need:
                group = self.queue[0]
                take = min(need, int(group[0]))
                portions.append((take, group[1]))
                group[0] -= take
                need -= take
                if group[0] == 0:
                    self.queue.popleft()
            self.queued -= n
            self.inflight += n
            self.sent += n
            task = asyncio.create_task(self._send(n, portions))
            self.tasks[task] = portions
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self.tasks.pop(task, None)

    async def _send(self, n: int, portions: list[tuple[int, float]]) -> None:
        try:
            await self.producer.send(n)
        except Exception as e:
            self.errors += n
            if self.first_error is None:
                self.first_error = f"{type(e).__name__}: {e}"
        else:
            now = self.loop.time()
            self.acked += n
            if self.measure_from <= now <= self.end:
                self.acked_in_window += n
            if not self.stopping:  # after the drain deadline it was recorded as a lower bound
                self._record(portions, now)
        finally:
            self.inflight -= n
            if self.inflight == 0 and not self.queued:
                self.idle.set()
            self.dispatch()

    async def run(self) -> StepResult:
        spec = self.spec
        self.start = self.loop.time() + 0.01
        self.measure_from = self.start + spec.warmup
        self.end = self.start + spec.duration
        rate = spec.rate
        total = int(spec.duration * rate) if rate else 0
        generated = 0
        next_tick = self.start
        lag_max = 0.0
        while True:
            # Always yield (acks are processed meanwhile); a late loop skips to the current tick.
            await asyncio.sleep(max(0.0, next_tick - self.loop.time()))
            now = self.loop.time()
            lag = now - next_tick
            if lag > lag_max:
                lag_max = lag
            if now >= self.measure_from:
                self.lag.record_value(max(1, int(lag * 1e6)))
            # A tick after the end still generates what was due before it: a stall near the
            # end must show in the latencies, not shorten the run.
            if rate:
                due = min(total, int((now - self.start) * rate))
                k = due - generated
                if k > 0:
                    mid = self.start + (generated + (k - 1) / 2) / rate
                    self.queue.append([float(k), mid])
                    self.queued += k
                    generated = due
            self.dispatch()
            if now >= self.end:
                break
            next_tick += TICK
            if next_tick < now:
                next_tick = self.start + (int((now - self.start) / TICK) + 1) * TICK
        # Stop generating; let the queue and in-flight batches finish, within a deadline.
        self.generating = False
        if rate is None:
            self.queue.clear()
            self.queued = 0
        if self.inflight or self.queued:
            self.idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), timeout=spec.drain)
        # Whatever is still queued or unacknowledged now is recorded with its wait so far (a
        # lower bound). In-flight batches are then given time to finish rather than cancelled:
        # cancelling would cancel the client's own futures mid-protocol.
        unfinished = self.queued + self.inflight
        self.stopping = True
        now = self.loop.time()
        self._record([(int(g[0]), g[1]) for g in self.queue], now)
        for portions in self.tasks.values():
            self._record(portions, now)
        if self.tasks:
            _, pending = await asyncio.wait(list(self.tasks), timeout=SETTLE_TIMEOUT)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending)
        measured = spec.duration - spec.warmup
        h = self.hist
        return StepResult(
            offered=rate,
            achieved=self.acked_in_window / measured if measured > 0 else 0.0,
            sent=self.sent,
            acked=self.acked,
            errors=self.errors,
            unfinished=unfinished,
            p50_ms=h.get_value_at_percentile(50) / 1000,
            p99_ms=h.get_value_at_percentile(99) / 1000,
            p999_ms=h.get_value_at_percentile(99.9) / 1000,
            max_ms=h.get_max_value() / 1000,
            mean_ms=h.get_mean_value() / 1000,
            recorded=h.get_total_count(),
            gen_lag_max_ms=lag_max * 1000,
            gen_lag_p99_ms=self.lag.get_value_at_percentile(99) / 1000,
            hist=bytes(h.encode()).decode("ascii"),
            first_error=self.first_error,
        )


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


async def produce_step(adapter: Adapter, spec: StepSpec) -> StepResult:
    producer = await adapter.producer(spec.payload, spec.batch, spec.window)
    try:
        c0, w0 = _cpu(), time.monotonic()
        result = await _Driver(producer, spec).run()
        result.client_cpu = _cpu() - c0
        result.wall = time.monotonic() - w0
        return result
    finally:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(producer.close(), SETTLE_TIMEOUT)


async def consume_step(adapter: Adapter, spec: ConsumeSpec) -> ConsumeResult:
    consumer = await adapter.consumer(spec.batch)
    try:
        c0, w0 = _cpu(), time.monotonic()
        n, seconds = await consumer.consume(spec.max_messages, spec.duration)
        return ConsumeResult(n, seconds, _cpu() - c0, time.monotonic() - w0)
    finally:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(consumer.close(), SETTLE_TIMEOUT)
