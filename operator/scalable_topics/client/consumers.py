"""Consumers of a scalable topic: stream, checkpoint and queue (DESIGN §1, §3, §6).

* :class:`StreamConsumer` registers with the topic's controller (the consumer controller
  session, ``docs/sessions.md``), reads the segments it is assigned in DAG order and
  acknowledges cumulatively per segment on the brokers.
* :class:`CheckpointConsumer` gets assignments the same way but leaves no acknowledgements on
  the brokers: the application stores a :class:`~scalable_topics.client.model.Checkpoint` and
  restarts from it.
* :class:`QueueConsumer` needs no controller: it attaches to every segment of a Queue
  subscription and acknowledges message by message.

**DAG order.** A segment is read only while the controller marks it ``consumable``, or once
this consumer has itself drained and reported every segment in its ``blockedBy``: a split or
merge child therefore starts right after its parents, without a round trip to the controller,
and every message of a parent is handed to the application before any message of a child - so
per-key order survives splits and merges. A stream consumer's segment is drained when the
broker sends ``END_OF_SEGMENT`` (sealed, and every entry acknowledged); a checkpoint consumer's
when it has handed out everything up to the sealed segment's last position.

Iterating (``async for msg in consumer``) yields :class:`Message` objects from all the segments
being read; messages of one segment come in position order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp

from scalable_topics.core import wire
from scalable_topics.core.sessions import (
    AssignedSegmentModel,
    AssignmentMessage,
    CloseCode,
    ConsumerType,
    DagMessage,
    DrainedMessage,
    ErrorCode,
    ErrorMessage,
    PositionMessage,
    RedirectMessage,
    RegisterMessage,
    SessionProtocolError,
    UnregisterMessage,
    consumers_path,
    encode,
    parse_server_message,
)

from .dag import Backoff, DagWatcher, http_url, ws_url
from .model import Checkpoint, Message, decode_key
from .segment import (
    AdminError,
    ConnectionClosedError,
    ReceivedEntry,
    SegmentAdmin,
    SegmentConsumer,
    SegmentError,
    SegmentNotFoundError,
)

__all__ = [
    "CheckpointConsumer",
    "ConsumerClosedError",
    "ConsumerError",
    "QueueConsumer",
    "StreamConsumer",
]

log = logging.getLogger("scalable_topics.client.consumers")

_FATAL_CODES = {ErrorCode.SUPERSEDED, ErrorCode.INVALID_SUBSCRIPTION, ErrorCode.UNKNOWN_TOPIC}
_FATAL_CLOSES = {
    CloseCode.SUPERSEDED,
    CloseCode.INVALID_SUBSCRIPTION,
    CloseCode.UNKNOWN_TOPIC,
    CloseCode.BAD_MESSAGE,
}


class ConsumerError(Exception):
    """The consumer cannot go on (superseded, unknown subscription or topic, bad message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ConsumerClosedError(Exception):
    pass


class _NothingToRead(Exception):
    """A sealed segment that never had this subscription: nothing to consume there."""


def entry_messages(segment_id: int, item: ReceivedEntry) -> list[Message]:
    """The application messages of a delivered entry."""
    header, messages = wire.decode_entry(item.entry)
    count = len(messages)
    return [
        Message(
            key=decode_key(m.key),
            value=m.value,
            segment_id=segment_id,
            position=item.position,
            batch_index=i,
            batch_size=count,
            properties=dict(m.properties),
            event_time_ms=m.timestamp_ms,
            publish_time_ms=header.publish_time_ms,
            producer_name=header.producer_name,
            redelivery_count=item.redelivery_count,
        )
        for i, m in enumerate(messages)
    ]


def readable(segment: AssignedSegmentModel, drained: Iterable[int]) -> bool:
    """May the consumer read ``segment`` now (``docs/sessions.md``: drain gating)?"""
    return segment.consumable or set(segment.blocked_by) <= set(drained)


# -- the common machinery: a delivery queue fed by per-segment readers --------------------------


@dataclass(eq=False)
class _Reader:
    segment_id: int
    task: asyncio.Task[None] | None = None
    consumer: SegmentConsumer | None = None
    outstanding: int = 0
    """Messages queued for the application and not yet taken."""
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: bool = False


class _Delivery:
    """The bounded queue between segment readers and the application's iterator."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: deque[tuple[_Reader, Message]] = deque()
        self.not_empty = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()

    def put(self, reader: _Reader, messages: list[Message]) -> None:
        for m in messages:
            self.items.append((reader, m))
        reader.outstanding += len(messages)
        if messages:
            self.not_empty.set()
        if len(self.items) >= self.capacity:
            self.room.clear()

    def take(self) -> tuple[_Reader, Message] | None:
        while self.items:
            reader, message = self.items.popleft()
            reader.outstanding -= 1
            reader.taken.set()
            if len(self.items) < self.capacity:
                self.room.set()
            if not reader.stopped:
                return reader, message
        self.not_empty.clear()
        return None


class _ConsumerBase:
    """Shared life cycle: a DAG watcher, segment readers, the delivery queue, iteration."""

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        *,
        permits: int,
        receive_queue: int,
        session: aiohttp.ClientSession | None,
    ) -> None:
        self.service_url = http_url(service_url)
        self.namespace = namespace
        self.topic = topic
        self.subscription = subscription
        self.name = name
        self.permits = permits
        self._own_session = session is None
        self._session = session
        self._watcher: DagWatcher | None = None
        self._readers: dict[int, _Reader] = {}
        self._delivery = _Delivery(receive_queue)
        self._drained: set[int] = set()
        self._fatal: BaseException | None = None
        self._fatal_event = asyncio.Event()
        self._closed = False
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- life cycle -------------------------------------------------------------------------------

    async def _start_watcher(self) -> DagWatcher:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._watcher = DagWatcher(
            self.service_url, self.namespace, self.topic, session=self._session
        )
        await self._watcher.start()
        self._watcher.add_listener(self._on_dag)
        return self._watcher

    def _on_dag(self, dag: DagMessage) -> None:
        """A newer DAG arrived (broker URLs may have changed)."""

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _broker_url(self, segment_id: int) -> str | None:
        if self._watcher is None:
            return None
        return self._watcher.dag.brokers().get(segment_id)

    def _fail(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        self._fatal_event.set()
        self._delivery.not_empty.set()
        for segment_id in list(self._readers):
            self._stop_reader(segment_id)

    @property
    def drained_segments(self) -> frozenset[int]:
        return frozenset(self._drained)

    @property
    def reading(self) -> list[int]:
        """Segments being read now."""
        return sorted(self._readers)

    # -- iteration --------------------------------------------------------------------------------

    async def receive(self) -> Message:
        """The next message from any segment being read."""
        while True:
            if self._closed:
                raise ConsumerClosedError("consumer closed")
            got = self._delivery.take()
            if got is not None:
                reader, message = got
                self._delivered(reader, message)
                return message
            if self._fatal is not None:
                raise self._fatal
            await self._delivery.not_empty.wait()

    def _delivered(self, reader: _Reader, message: Message) -> None:
        """The application took ``message``."""

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            try:
                yield await self.receive()
            except ConsumerClosedError:
                return

    # -- segment readers --------------------------------------------------------------------------

    def _start_reader(self, segment_id: int) -> None:
        if segment_id in self._readers or segment_id in self._drained or self._closed:
            return
        reader = _Reader(segment_id)
        self._readers[segment_id] = reader
        reader.task = self._spawn(self._read(reader), f"read-{segment_id}")

    def _stop_reader(self, segment_id: int) -> None:
        reader = self._readers.pop(segment_id, None)
        if reader is None:
            return
        reader.stopped = True
        if reader.task is not None and reader.task is not asyncio.current_task():
            reader.task.cancel()

    async def _connect(self, reader: _Reader, backoff: Backoff) -> SegmentConsumer | None:
        """One attempt to attach to the segment; ``None`` after a failure (backed off)."""
        assert self._session is not None and self._watcher is not None
        url = self._segment_url(reader.segment_id)
        if url is None:
            with contextlib.suppress(TimeoutError):
                await self._watcher.wait_update(2.0)
            return None
        try:
            consumer = await SegmentConsumer.connect(
                url,
                self.namespace,
                self.topic,
                reader.segment_id,
                self.subscription,
                self.name,
                permits=self.permits,
                session=self._session,
            )
        except SegmentNotFoundError:
            with contextlib.suppress(TimeoutError):
                await self._watcher.wait_update(backoff.delay())
            return None
        except SegmentError as exc:
            if exc.code == wire.ERR_SUBSCRIPTION_NOT_FOUND and self._sealed(reader.segment_id):
                raise _NothingToRead(str(exc)) from None
            # ConsumerBusy: the previous owner has not let go yet (reassignment).
            level = logging.DEBUG if exc.code == wire.ERR_CONSUMER_BUSY else logging.INFO
            log.log(level, "segment %d: attach failed: %s", reader.segment_id, exc)
            await backoff.sleep()
            return None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("segment %d: attach to %s failed: %s", reader.segment_id, url, exc)
            await backoff.sleep()
            return None
        return consumer

    def _segment_url(self, segment_id: int) -> str | None:
        return self._broker_url(segment_id)

    def _sealed(self, segment_id: int) -> bool:
        if self._watcher is None:
            return False
        return any(
            s.segment_id == segment_id and s.state.value == "SEALED"
            for s in self._watcher.dag.segments
        )

    async def _read(self, reader: _Reader) -> None:
        backoff = Backoff(0.02, 2.0)
        try:
            while not reader.stopped and not self._closed:
                try:
                    consumer = await self._connect(reader, backoff)
                except _NothingToRead:
                    log.info("segment %d: sealed without this subscription", reader.segment_id)
                    await self._segment_done(reader)
                    return
                if consumer is None:
                    continue
                reader.consumer = consumer
                try:
                    done = await self._pump(reader, consumer)
                except (ConnectionClosedError, SegmentError) as exc:
                    log.info(
                        "segment %d: connection lost (%s); reattaching", reader.segment_id, exc
                    )
                    done = False
                finally:
                    reader.consumer = None
                    await consumer.close()
                if done:
                    await self._segment_done(reader)
                    return
                backoff.reset()
                await backoff.sleep()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("segment %d: reader failed", reader.segment_id)
            self._fail(exc)

    async def _pump(self, reader: _Reader, consumer: SegmentConsumer) -> bool:
        """Read until the segment is done (``True``) or the connection fails (raises)."""
        raise NotImplementedError

    async def _segment_done(self, reader: _Reader) -> None:
        """The segment is drained for this consumer."""

    async def _wait_room(self) -> None:
        while not self._delivery.room.is_set():
            await self._delivery.room.wait()

    # -- closing ----------------------------------------------------------------------------------

    async def _close_common(self) -> None:
        self._closed = True
        self._delivery.not_empty.set()
        for segment_id in list(self._readers):
            self._stop_reader(segment_id)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._watcher is not None:
            await self._watcher.close()
        if self._own_session and self._session is not None:
            await self._session.close()


# -- stream and checkpoint: assignments from the controller ----------------------------------


class _AssignedConsumer(_ConsumerBase):
    consumer_type = ConsumerType.STREAM

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        *,
        permits: int = 1000,
        receive_queue: int = 10_000,
        session: aiohttp.ClientSession | None = None,
        heartbeat: float = 20.0,
    ) -> None:
        super().__init__(
            service_url,
            namespace,
            topic,
            subscription,
            name,
            permits=permits,
            receive_queue=receive_queue,
            session=session,
        )
        self._heartbeat = heartbeat
        self._assignment: dict[int, AssignedSegmentModel] = {}
        self._assignment_epoch = -1
        self._assigned = asyncio.Event()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reported: set[int] = set()
        self._positions_sent: dict[int, float] = {}
        self._controller_task: asyncio.Task[None] | None = None
        self.controller_sessions = 0
        """Controller sessions opened so far (reconnects and redirects included)."""
        self.assignments_received = 0

    async def start(self, within: float = 60.0) -> None:
        """Register with the controller; returns after the first assignment."""
        if self._started:
            return
        self._started = True
        await self._start_watcher()
        self._controller_task = self._spawn(self._control(), f"controller-{self.name}")
        async with asyncio.timeout(within):
            waiter = asyncio.ensure_future(self._assigned.wait())
            failed = asyncio.ensure_future(self._fatal_event.wait())
            try:
                await asyncio.wait({waiter, failed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                failed.cancel()
        if self._fatal is not None:
            raise self._fatal

    @property
    def assignment(self) -> list[int]:
        """Segment ids currently assigned, in DAG order."""
        return list(self._assignment)

    @property
    def assignment_epoch(self) -> int:
        return self._assignment_epoch

    async def wait_assignment(
        self, predicate: Callable[[list[int]], bool], within: float | None = None
    ) -> list[int]:
        """Wait for an assignment for which ``predicate(segment_ids)`` holds."""
        async with asyncio.timeout(within):
            while not predicate(self.assignment):
                self._assigned.clear()
                await self._assigned.wait()
        return self.assignment

    # -- the controller session -------------------------------------------------------------------

    async def _control(self) -> None:
        assert self._session is not None and self._watcher is not None
        backoff = Backoff(0.05, 5.0)
        redirect: str | None = None
        path = consumers_path(self.namespace, self.topic)
        while not self._closed:
            controller = self._watcher.dag.controller_url or self.service_url
            target = ws_url(redirect) if redirect else ws_url(controller) + path
            redirect = None
            retry_after: float | None = None
            try:
                async with self._session.ws_connect(
                    target, heartbeat=self._heartbeat, max_msg_size=64 << 20
                ) as ws:
                    self._ws = ws
                    self.controller_sessions += 1
                    await ws.send_str(
                        encode(
                            RegisterMessage(
                                subscription=self.subscription,
                                consumer=self.name,
                                consumer_type=self.consumer_type,
                            )
                        )
                    )
                    self._reported.clear()
                    async for frame in ws:
                        if frame.type is not aiohttp.WSMsgType.TEXT:
                            break
                        message = parse_server_message(frame.data)
                        if isinstance(message, AssignmentMessage):
                            backoff.reset()
                            self._apply_assignment(message)
                        elif isinstance(message, RedirectMessage):
                            redirect = message.url
                            retry_after = None if message.url else message.retry_after
                            log.info("controller redirect: %s (%s)", message.url, message.reason)
                        elif isinstance(message, ErrorMessage):
                            self._on_error(message)
                    code = ws.close_code
                    if code in _FATAL_CLOSES and self._fatal is None and not self._closed:
                        self._fail(ConsumerError(str(code), "controller closed the session"))
            except aiohttp.WSServerHandshakeError as exc:
                location = exc.headers.get("Location") if exc.headers else None
                if exc.status in (307, 308) and location:
                    redirect = location
                elif exc.status == 503 and exc.headers:
                    retry_after = float(exc.headers.get("Retry-After", "1"))
                log.info("controller session to %s refused: %s", target, exc.status)
            except (aiohttp.ClientError, OSError, SessionProtocolError, TimeoutError) as exc:
                log.info("controller session to %s dropped: %s", target, exc)
            finally:
                self._ws = None
            if self._closed or self._fatal is not None:
                return
            if redirect:
                continue
            if retry_after is not None:
                await asyncio.sleep(retry_after)
            else:
                await backoff.sleep()

    def _on_error(self, message: ErrorMessage) -> None:
        if message.fatal and message.code in _FATAL_CODES:
            self._fail(ConsumerError(message.code.value, message.message))
        else:
            log.info("controller refused a report: %s: %s", message.code, message.message)

    def _send(self, message: DrainedMessage | PositionMessage | UnregisterMessage) -> bool:
        ws = self._ws
        if ws is None or ws.closed:
            return False
        task = asyncio.ensure_future(ws.send_str(encode(message)))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return True

    def _apply_assignment(self, message: AssignmentMessage) -> None:
        self.assignments_received += 1
        self._reported.clear()
        self._assignment = {s.segment_id: s for s in message.segments}
        self._assignment_epoch = message.layout_epoch
        for segment_id in list(self._readers):
            if segment_id not in self._assignment:
                log.info("segment %d no longer assigned: stop reading it", segment_id)
                self._stop_reader(segment_id)
        self._evaluate()
        self._assigned.set()

    def _evaluate(self) -> None:
        """Start readers for assigned segments that became readable; report drains."""
        for segment in self._assignment.values():
            segment_id = segment.segment_id
            if segment_id in self._drained:
                # Report only once the controller sees the segment sealed: the broker can end
                # a segment before the new layout reaches the controller, which would refuse.
                sealed = segment.state.value == "SEALED"
                report = DrainedMessage(segment=segment_id)
                if sealed and segment_id not in self._reported and self._send(report):
                    self._reported.add(segment_id)
                continue
            if segment_id not in self._readers and readable(segment, self._drained):
                self._start_reader(segment_id)

    def _segment_url(self, segment_id: int) -> str | None:
        assigned = self._assignment.get(segment_id)
        if assigned is not None and assigned.broker_url:
            return assigned.broker_url
        return self._broker_url(segment_id)

    def _on_dag(self, dag: DagMessage) -> None:
        self._evaluate()

    def _sealed(self, segment_id: int) -> bool:
        assigned = self._assignment.get(segment_id)
        if assigned is not None and assigned.state.value == "SEALED":
            return True
        return super()._sealed(segment_id)

    async def _segment_done(self, reader: _Reader) -> None:
        segment_id = reader.segment_id
        log.info("segment %d drained", segment_id)
        self._drained.add(segment_id)
        if self._readers.get(segment_id) is reader:
            del self._readers[segment_id]
        self._evaluate()

    def _report_position(self, segment_id: int, position: int) -> None:
        now = time.monotonic()
        if now - self._positions_sent.get(segment_id, 0.0) >= 1.0 and self._send(
            PositionMessage(segment=segment_id, position=position)
        ):
            self._positions_sent[segment_id] = now

    async def close(self, *, unregister: bool = False) -> None:
        """Stop reading. ``unregister=True`` gives the segments to other consumers at once;
        otherwise the controller holds them for the grace period (a restart under the same
        name gets them back)."""
        if unregister and self._ws is not None and not self._ws.closed:
            with contextlib.suppress(Exception):
                await self._ws.send_str(encode(UnregisterMessage()))
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        await self._close_common()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class StreamConsumer(_AssignedConsumer):
    """Exclusive, ordered consumption of the segments the controller assigns to ``name``.

    ``ack(msg)`` is cumulative per segment: it acknowledges ``msg`` and everything before it in
    its segment. A sealed segment is drained (and the next segments in DAG order start) once
    every message of it is acknowledged.
    """

    consumer_type = ConsumerType.STREAM

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        *,
        permits: int = 1000,
        receive_queue: int = 10_000,
        session: aiohttp.ClientSession | None = None,
        heartbeat: float = 20.0,
    ) -> None:
        super().__init__(
            service_url,
            namespace,
            topic,
            subscription,
            name,
            permits=permits,
            receive_queue=receive_queue,
            session=session,
            heartbeat=heartbeat,
        )
        self._acked: dict[int, int] = {}

    async def _pump(self, reader: _Reader, consumer: SegmentConsumer) -> bool:
        acked = self._acked.get(reader.segment_id, -1)
        if acked >= consumer.ack_floor:
            consumer.ack_cumulative(acked)
        while not reader.stopped:
            await self._wait_room()
            item = await consumer.receive()
            if item is None:
                return True
            if item.position <= self._acked.get(reader.segment_id, -1):
                continue
            self._delivery.put(reader, entry_messages(reader.segment_id, item))
        return False

    async def ack(self, message: Message) -> None:
        """Acknowledge ``message`` and every earlier message of its segment."""
        self.ack_nowait(message)

    def ack_nowait(self, message: Message) -> None:
        segment_id = message.segment_id
        target = message.position if message.last_in_entry else message.position - 1
        if target < 0 or target <= self._acked.get(segment_id, -1):
            return
        reader = self._readers.get(segment_id)
        if reader is None:
            return  # no longer ours: the new owner gets it again
        self._acked[segment_id] = target
        if reader.consumer is not None:
            reader.consumer.ack_cumulative(target)
        self._report_position(segment_id, target)


class CheckpointConsumer(_AssignedConsumer):
    """Assigned like a stream consumer, but keeps its positions itself (no broker acks).

    :meth:`checkpoint` returns a JSON-serialisable :class:`Checkpoint` covering every message
    the iterator has yielded; ``start_from=`` resumes after one. Take the checkpoint after
    processing a message (and store it with the results, e.g. in the same transaction).

    A sealed segment's end is known from its last position (asked from the broker's admin
    API, hence ``admin_token`` when the brokers require one).
    """

    consumer_type = ConsumerType.CHECKPOINT

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        *,
        start_from: Checkpoint | None = None,
        permits: int = 1000,
        receive_queue: int = 10_000,
        session: aiohttp.ClientSession | None = None,
        heartbeat: float = 20.0,
        admin_token: str | None = None,
    ) -> None:
        super().__init__(
            service_url,
            namespace,
            topic,
            subscription,
            name,
            permits=permits,
            receive_queue=receive_queue,
            session=session,
            heartbeat=heartbeat,
        )
        if start_from is not None and (
            start_from.namespace != namespace or start_from.topic != topic
        ):
            raise ValueError(
                f"checkpoint of {start_from.namespace}/{start_from.topic} cannot start "
                f"{namespace}/{topic}"
            )
        self._positions: dict[int, tuple[int, int]] = (
            dict(start_from.positions) if start_from else {}
        )
        if start_from is not None:
            self._drained |= start_from.drained
        self._admin_token = admin_token
        self._state_changed: dict[int, asyncio.Event] = {}

    def checkpoint(self) -> Checkpoint:
        """Positions of everything yielded so far, and the drained segments."""
        return Checkpoint(
            self.namespace,
            self.topic,
            self.subscription,
            dict(self._positions),
            frozenset(self._drained),
        )

    def _delivered(self, reader: _Reader, message: Message) -> None:
        self._positions[message.segment_id] = (message.position, message.batch_index)
        if message.last_in_entry:
            self._report_position(message.segment_id, message.position)

    def _apply_assignment(self, message: AssignmentMessage) -> None:
        super()._apply_assignment(message)
        for event in self._state_changed.values():
            event.set()

    def _on_dag(self, dag: DagMessage) -> None:
        super()._on_dag(dag)
        for event in self._state_changed.values():
            event.set()

    async def _last_position(self, reader: _Reader) -> int | None:
        url = self._segment_url(reader.segment_id)
        if url is None:
            return None
        admin = SegmentAdmin(url, token=self._admin_token, session=self._session)
        try:
            stats = await admin.stats(self.namespace, self.topic, reader.segment_id)
        except (AdminError, aiohttp.ClientError, OSError) as exc:
            log.info("segment %d: stats failed: %s", reader.segment_id, exc)
            return None
        return int(stats["lastPosition"]) if stats.get("sealed") else None

    async def _pump(self, reader: _Reader, consumer: SegmentConsumer) -> bool:
        segment_id = reader.segment_id
        changed = self._state_changed.setdefault(segment_id, asyncio.Event())
        last: int | None = None
        received = -1
        while not reader.stopped:
            if last is None and self._sealed(segment_id):
                last = await self._last_position(reader)
            if last is not None and received >= last:
                while reader.outstanding > 0:
                    reader.taken.clear()
                    await reader.taken.wait()
                return True
            await self._wait_room()
            items = consumer.receive_nowait(256)
            if not items:
                if consumer.failure is not None:
                    raise consumer.failure
                changed.clear()
                ready = asyncio.ensure_future(consumer.wait_ready())
                moved = asyncio.ensure_future(changed.wait())
                try:
                    await asyncio.wait({ready, moved}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ready.cancel()
                    moved.cancel()
                continue
            start = self._positions.get(segment_id)
            for item in items:
                received = max(received, item.position)
                messages = entry_messages(segment_id, item)
                if start is not None:
                    messages = [m for m in messages if (m.position, m.batch_index) > start]
                self._delivery.put(reader, messages)
        return False

    async def _segment_done(self, reader: _Reader) -> None:
        self._state_changed.pop(reader.segment_id, None)
        self._positions.pop(reader.segment_id, None)
        await super()._segment_done(reader)


# -- queue: every segment, individual acks, no controller -------------------------------------


class QueueConsumer(_ConsumerBase):
    """Shared consumption of a Queue subscription: any number of queue consumers attach to every
    segment with backlog and the brokers spread entries among them; acks are individual.

    With ``dag_order=True`` (default) a child segment is attached only once its parents are
    drained for the subscription, which keeps a key's order across splits and merges for a
    single consumer (across several queue consumers there is no order, as in any queue).
    """

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        *,
        permits: int = 1000,
        receive_queue: int = 10_000,
        dag_order: bool = True,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        super().__init__(
            service_url,
            namespace,
            topic,
            subscription,
            name,
            permits=permits,
            receive_queue=receive_queue,
            session=session,
        )
        self.dag_order = dag_order
        self._partial: dict[tuple[int, int], set[int]] = {}

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        watcher = await self._start_watcher()
        self._on_dag(watcher.dag)

    async def __aenter__(self) -> QueueConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _on_dag(self, dag: DagMessage) -> None:
        present = {s.segment_id for s in dag.segments}
        for segment_id in list(self._readers):
            if segment_id not in present:
                self._stop_reader(segment_id)
        for segment in sorted(dag.segments, key=lambda s: (s.created_at_epoch, s.segment_id)):
            if segment.segment_id in self._readers or segment.segment_id in self._drained:
                continue
            parents = [p for p in segment.parent_ids if p in present]
            if self.dag_order and not set(parents) <= self._drained:
                continue
            self._start_reader(segment.segment_id)

    async def _pump(self, reader: _Reader, consumer: SegmentConsumer) -> bool:
        while not reader.stopped:
            await self._wait_room()
            item = await consumer.receive()
            if item is None:
                return True
            self._delivery.put(reader, entry_messages(reader.segment_id, item))
        return False

    async def _segment_done(self, reader: _Reader) -> None:
        self._drained.add(reader.segment_id)
        if self._readers.get(reader.segment_id) is reader:
            del self._readers[reader.segment_id]
        if self._watcher is not None:
            self._on_dag(self._watcher.dag)

    async def ack(self, message: Message) -> None:
        self.ack_nowait(message)

    def ack_nowait(self, message: Message) -> None:
        """Acknowledge one message (the broker is told once all of its entry is acknowledged)."""
        reader = self._readers.get(message.segment_id)
        if reader is None or reader.consumer is None:
            return  # the connection is gone: the broker redelivers the entry
        if message.batch_size > 1:
            key = (message.segment_id, message.position)
            seen = self._partial.setdefault(key, set())
            seen.add(message.batch_index)
            if len(seen) < message.batch_size:
                return
            del self._partial[key]
        reader.consumer.ack(message.position)

    def nack(self, message: Message) -> None:
        """Give the message's entry back for redelivery (to any consumer)."""
        reader = self._readers.get(message.segment_id)
        if reader is not None and reader.consumer is not None:
            self._partial.pop((message.segment_id, message.position), None)
            reader.consumer.nack([message.position])

    async def close(self) -> None:
        await self._close_common()
