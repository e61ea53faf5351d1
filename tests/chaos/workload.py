"""The chaos workload: an open-loop keyed writer and recording readers, building a
:class:`~tests.chaos.checker.History` on one clock (``time.monotonic``, one process).

Per key the writer sends ``0, 1, 2, …``; message ``i`` of the run is due at ``start + i/rate``
(wrk2-style open loop) and its key is ``keys[i % len(keys)]``, so every key is written at
``rate / len(keys)`` per second. The intended time is recorded as the send's invocation: a
producer that stalls is charged for the whole stall, not only for the part after it resumed.

Outcomes: an acknowledgement (:class:`~scalable_topics.client.MessageId`) is ``ok`` with its
segment and position; a send the producer refused before queueing it is ``fail`` (it cannot
have been written); anything else — an error after queueing, no answer by the end — is ``info``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from scalable_topics.client import (
    ConsumerClosedError,
    Message,
    MessageId,
    ProducerClosedError,
    ScalableTopicProducer,
)

from .checker import CheckpointStart, Delivery, History, Outcome, Restart, RestartKind, Send

__all__ = [
    "ConsumerRunner",
    "OpenLoopWriter",
    "ReadingConsumer",
    "Recorder",
    "Registration",
    "SendLog",
    "decode_value",
    "encode_value",
]

log = logging.getLogger("tests.chaos.workload")


def encode_value(value: int, pad: int = 0) -> bytes:
    return b"%d|" % value + b"x" * pad


def decode_value(payload: bytes) -> int:
    """The value a payload carries; -1 (never sent, so *unexpected*) when it is malformed."""
    head, sep, _ = payload.partition(b"|")
    try:
        return int(head) if sep else -1
    except ValueError:
        return -1


class Recorder:
    """Collects the history and answers progress questions while the run goes on."""

    def __init__(self, ordered: Mapping[str, bool], clock: Callable[[], float] = time.monotonic):
        self.ordered = dict(ordered)
        self.clock = clock
        self._invoked: dict[tuple[str, int], float] = {}
        self._done: dict[tuple[str, int], Send] = {}
        self._invoke_times: dict[str, list[float]] = defaultdict(list)
        self.deliveries: list[Delivery] = []
        self.restarts: list[Restart] = []
        self.checkpoints: list[CheckpointStart] = []
        self.buckets: dict[int, int] = {}
        """Segment -> entry-bucket count, for the checker (:attr:`History.buckets`)."""
        self._max_acked: dict[str, int] = {}
        self._acked: set[tuple[str, int]] = set()
        self._read: dict[str, set[tuple[str, int]]] = {s: set() for s in self.ordered}
        self._max_read: dict[str, dict[str, int]] = {s: {} for s in self.ordered}
        self._read_count = dict.fromkeys(self.ordered, 0)

    # -- writes -----------------------------------------------------------------------------------

    def invoke(self, key: str, value: int, at: float) -> None:
        times = self._invoke_times[key]
        if len(times) != value:
            raise ValueError(f"values of {key} must be invoked in order 0, 1, …; got {value}")
        times.append(at)
        self._invoked[(key, value)] = at

    def ok(self, key: str, value: int, message_id: MessageId, at: float | None = None) -> None:
        self._complete(key, value, Outcome.OK, at, message_id.segment_id, message_id.position)
        self._acked.add((key, value))
        if value > self._max_acked.get(key, -1):
            self._max_acked[key] = value

    def fail(self, key: str, value: int, at: float | None = None) -> None:
        self._complete(key, value, Outcome.FAIL, at)

    def info(self, key: str, value: int, at: float | None = None) -> None:
        self._complete(key, value, Outcome.INFO, at)

    def _complete(
        self,
        key: str,
        value: int,
        outcome: Outcome,
        at: float | None,
        segment: int | None = None,
        position: int | None = None,
    ) -> None:
        kv = (key, value)
        if kv in self._done:
            return
        done = self.clock() if at is None else at
        self._done[kv] = Send(key, value, self._invoked[kv], outcome, done, segment, position)

    # -- reads ------------------------------------------------------------------------------------

    def delivered(
        self,
        subscription: str,
        consumer: str,
        session: int,
        message: Message,
        at: float | None = None,
    ) -> None:
        """``message`` reached the application of ``consumer`` at ``at`` (default: now; a
        consumer in another process reports its own time, on the machine's one monotonic
        clock, so that the pipe's delay does not reorder deliveries across consumers)."""
        value = decode_value(message.value)
        key = message.key or ""
        self.deliveries.append(
            Delivery(
                subscription,
                consumer,
                session,
                key,
                value,
                self.clock() if at is None else at,
                message.segment_id,
                message.position,
                message.batch_index,
            )
        )
        self._read[subscription].add((key, value))
        self._read_count[subscription] += 1
        highest = self._max_read[subscription]
        if value > highest.get(key, -1):
            highest[key] = value

    def checkpoint_start(
        self, subscription: str, consumer: str, session: int, checkpoint: dict[str, Any]
    ) -> None:
        """A checkpoint consumer session started from ``checkpoint`` (its JSON form)."""
        self.checkpoints.append(CheckpointStart(subscription, consumer, session, checkpoint))

    def restart(
        self,
        kind: RestartKind,
        target: str,
        subscription: str | None = None,
        segments: tuple[int, ...] = (),
    ) -> int:
        """Record that a restart begins now; returns a handle for :meth:`restarted`."""
        self.restarts.append(Restart(self.clock(), kind, target, subscription, segments=segments))
        return len(self.restarts) - 1

    def restarted(self, handle: int) -> None:
        """The restart ``handle`` is over (the process is back, the consumer re-opened)."""
        self.restarts[handle] = dataclasses.replace(self.restarts[handle], until=self.clock())

    # -- progress ---------------------------------------------------------------------------------

    @property
    def sent(self) -> int:
        return len(self._invoked)

    def read_count(self, subscription: str) -> int:
        """Deliveries on ``subscription`` so far, duplicates included."""
        return self._read_count[subscription]

    @property
    def acked(self) -> int:
        return len(self._acked)

    def unread(self, subscription: str) -> int:
        """Acknowledged values the subscription has not received yet."""
        return len(self._acked - self._read[subscription])

    def lagging(self, since: float) -> list[str]:
        """What is not yet past ``since``: per key, the first value invoked at or after
        ``since`` must be acknowledged and read on every subscription (or a later one)."""
        behind: list[str] = []
        for key, times in self._invoke_times.items():
            first = bisect.bisect_left(times, since)
            if first >= len(times):
                behind.append(f"{key}: nothing invoked since")
                continue
            if self._max_acked.get(key, -1) < first:
                behind.append(f"{key}: value {first} not acknowledged")
            for sub, highest in self._max_read.items():
                if highest.get(key, -1) < first:
                    behind.append(f"{key}: value {first} not read on {sub}")
        return behind

    def history(self) -> History:
        """The history so far; sends without an outcome are ``info`` (unknown)."""
        sends = [
            self._done.get(kv) or Send(kv[0], kv[1], at, Outcome.INFO)
            for kv, at in self._invoked.items()
        ]
        return History(
            self.ordered,
            sends,
            list(self.deliveries),
            list(self.restarts),
            list(self.checkpoints),
            dict(self.buckets),
        )


class SendLog(Protocol):
    """Where a writer records its sends (:class:`Recorder`, or a pipe to one)."""

    def clock(self) -> float: ...

    def invoke(self, key: str, value: int, at: float) -> None: ...

    def ok(self, key: str, value: int, message_id: MessageId, at: float | None = None) -> None: ...

    def fail(self, key: str, value: int, at: float | None = None) -> None: ...

    def info(self, key: str, value: int, at: float | None = None) -> None: ...


class OpenLoopWriter:
    """Writes ``keys`` round-robin at ``rate`` messages/s until :meth:`stop`."""

    def __init__(
        self,
        producer: ScalableTopicProducer,
        recorder: SendLog,
        keys: Sequence[str],
        rate: float,
        *,
        pad: int = 64,
    ) -> None:
        if rate <= 0 or not keys:
            raise ValueError("rate must be positive and keys non-empty")
        self.producer = producer
        self.recorder = recorder
        self.keys = list(keys)
        self.rate = rate
        self.pad = pad
        self.behind_max = 0.0
        """The largest lag of an actual send behind its intended time (generator health)."""
        self._next_value = dict.fromkeys(self.keys, 0)
        self._pending: set[asyncio.Future[MessageId]] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="chaos-writer")

    async def _run(self) -> None:
        start = self.recorder.clock()
        i = 0
        while not self._stop.is_set():
            now = self.recorder.clock()
            due = int((now - start) * self.rate) + 1
            while i < due and not self._stop.is_set():
                intended = start + i / self.rate
                self.behind_max = max(self.behind_max, now - intended)
                await self._send(self.keys[i % len(self.keys)], intended)
                i += 1
            next_at = start + i / self.rate
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - self.recorder.clock()))

    async def _send(self, key: str, intended: float) -> None:
        value = self._next_value[key]
        self._next_value[key] = value + 1
        self.recorder.invoke(key, value, intended)
        try:
            future = await self.producer.send_async(encode_value(value, self.pad), key)
        except ProducerClosedError:
            self.recorder.fail(key, value)
            return
        except Exception:
            log.exception("send_async failed for %s=%d", key, value)
            self.recorder.info(key, value)
            return
        self._pending.add(future)
        future.add_done_callback(lambda f: self._done(key, value, f))

    def _done(self, key: str, value: int, future: asyncio.Future[MessageId]) -> None:
        self._pending.discard(future)
        if future.cancelled() or future.exception() is not None:
            self.recorder.info(key, value)
        else:
            self.recorder.ok(key, value, future.result())

    async def stop(self, within: float) -> int:
        """Stop writing and wait up to ``within`` s for the outstanding acknowledgements;
        returns how many are still unanswered (they stay ``info``)."""
        self._stop.set()
        if self._task is not None:
            await self._task
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=within)
        return len(self._pending)


class ReadingConsumer(Protocol):
    async def receive(self) -> Message: ...

    def ack_nowait(self, message: Message) -> None: ...

    async def close(self, *, unregister: bool = True) -> None: ...


@dataclass
class Registration:
    """One session of a consumer: seconds from the start of its registration until it held a
    segment (``assigned``) and until it received its first message (``first_message``)."""

    consumer: str
    session: int
    started: float
    assigned: float | None = None
    first_message: float | None = None
    segments: list[int] = field(default_factory=list)


class ConsumerRunner:
    """Keeps one named consumer reading: every message is recorded, then acknowledged.

    ``open`` makes a started consumer; for stream consumers it is ``StreamConsumer.start``
    (registration), and :attr:`assignments` records the time from the start of the
    registration until the consumer held at least one segment. :meth:`restart` closes the
    consumer (without unregistering: the controller keeps its segments for the grace period)
    and opens it again under the same name, as a new session.
    """

    def __init__(
        self,
        name: str,
        subscription: str,
        recorder: Recorder,
        open: Callable[[], Awaitable[ReadingConsumer]],
        *,
        assignment: Callable[[ReadingConsumer, float], Awaitable[list[int]]] | None = None,
        leave: Callable[[ReadingConsumer], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.subscription = subscription
        self.recorder = recorder
        self._open = open
        self._assignment = assignment
        self._leave = leave
        self.session = 0
        self.consumer: ReadingConsumer | None = None
        self.registrations: list[Registration] = []
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    async def start(self, within: float = 60.0) -> None:
        self.session += 1
        registration = Registration(self.name, self.session, self.recorder.clock())
        self.registrations.append(registration)
        async with asyncio.timeout(within):
            self.consumer = await self._open()
        self._task = asyncio.create_task(
            self._read(self.consumer, registration), name=f"read-{self.name}"
        )
        if self._assignment is not None:
            registration.segments = await self._assignment(self.consumer, within)
            registration.assigned = self.recorder.clock() - registration.started

    async def _read(self, consumer: ReadingConsumer, registration: Registration) -> None:
        session = registration.session
        try:
            while True:
                message = await consumer.receive()
                self.recorder.delivered(self.subscription, self.name, session, message)
                if registration.first_message is None:
                    registration.first_message = self.recorder.clock() - registration.started
                consumer.ack_nowait(message)
        except ConsumerClosedError:
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("consumer %s#%d failed", self.name, session)
            self.error = exc

    async def stop(self, *, leave: bool = False) -> None:
        """Close the consumer; ``leave=True`` also gives up its registration (a stream
        consumer's segments go to the others at once instead of after the grace period)."""
        consumer, task = self.consumer, self._task
        self.consumer, self._task = None, None
        if consumer is not None:
            if leave and self._leave is not None:
                await self._leave(consumer)
            else:
                await consumer.close(unregister=False)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def restart(self, within: float = 60.0) -> None:
        handle = self.recorder.restart(RestartKind.CONSUMER, self.name, self.subscription)
        await self.stop()
        await self.start(within)
        self.recorder.restarted(handle)
