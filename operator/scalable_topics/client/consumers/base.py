"""The consumers' shared life cycle (:class:`_ConsumerBase`): the DAG watcher, the controller
session and its assignment, segment readers, the delivery queue, iteration, closing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Self, Unpack

import aiohttp

from scalable_topics.core import sessions as proto
from scalable_topics.core import wire
from scalable_topics.credentials import client_session

from ..dag import Backoff, DagWatcher, TopicNotFoundError, http_url, ws_url
from ..model import Message
from ..segment import (
    CLOSE_TIMEOUT,
    WS_TIMEOUT,
    AccessDeniedError,
    ConnectionClosedError,
    ReceivedEntry,
    SegmentConsumer,
    SegmentCorruptedError,
    SegmentError,
    SegmentMovedError,
    SegmentNotFoundError,
    TLSVerificationError,
    close_websocket,
    ws_connect,
)
from .common import (
    _FATAL_CLOSES,
    _FATAL_CODES,
    _WAITING_CODES,
    REFUSALS_REPORTED_AFTER,
    ConsumerClosedError,
    ConsumerError,
    ConsumerOptions,
    ConsumerTopicNotFoundError,
    ReaderKey,
    _Delivery,
    _NothingToRead,
    _Reader,
    _session_error,
    entry_messages,
    log,
    readable,
)


class _ConsumerBase:
    """Shared life cycle: the DAG watcher, the controller session and its assignment, segment
    readers, the delivery queue, iteration. Subclasses say how a segment of the assignment is
    read (:meth:`_sync_segment`), what a delivered entry becomes (:meth:`_pump`) and what is
    done when it ends (:meth:`_segment_done`)."""

    consumer_type = proto.ConsumerType.STREAM

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self.service_url = http_url(service_url)
        self.namespace = namespace
        self.topic = topic
        self.subscription = subscription
        self.name = name
        self.permits = options.get("permits", 1000)
        self._session = options.get("session")
        self._ca_file = options.get("ca_file")
        self._own_session = self._session is None
        self._heartbeat = options.get("heartbeat", 20.0)
        self._watcher: DagWatcher | None = None
        self._readers: dict[ReaderKey, _Reader] = {}
        self._delivery = _Delivery(options.get("receive_queue", 10_000))
        self._drained: set[int] = set()
        self._fatal: BaseException | None = None
        self._fatal_event = asyncio.Event()
        self._closed = False
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._assignment: dict[int, proto.AssignedSegmentModel] = {}
        self._assigned = asyncio.Event()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reported: set[int] = set()
        self._releasing: dict[int, tuple[int, ...]] = {}
        """Segment -> buckets the controller withholds from their new owner until we let go."""
        self._released_sent: set[tuple[int, int]] = set()
        self._done_buckets: dict[int, set[int]] = {}
        """Checkpoint: buckets of a shared sealed segment this consumer finished."""
        self._buckets_reported: set[tuple[int, int]] = set()
        self.release_timeout: float | None = None
        """How long a hand-over waits for the application to settle what it took (``None``:
        as long as it takes)."""
        self.releases = 0
        """Bucket groups (or whole segments) handed over so far."""
        self._positions_sent: dict[int, float] = {}
        self.controller_sessions = 0
        """Controller sessions opened so far (reconnects and redirects included)."""
        self.assignments_received = 0

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self, within: float = 60.0) -> None:
        """Register with the controller; returns after the first assignment."""
        if self._started:
            return
        self._started = True
        await self._start_watcher()
        self._spawn(self._control(), f"controller-{self.name}")
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

    async def _start_watcher(self) -> DagWatcher:
        if self._session is None:
            self._session = client_session(ca_file=self._ca_file)
        self._watcher = DagWatcher(
            self.service_url, self.namespace, self.topic, session=self._session
        )
        await self._watcher.start()
        self._watcher.add_listener(self._on_dag)
        self._watcher.add_failure_listener(self._on_topic_gone)
        return self._watcher

    def _on_topic_gone(self, error: TopicNotFoundError) -> None:
        self._fail(ConsumerTopicNotFoundError(error.message, deleted=error.deleted))

    def _on_dag(self, dag: proto.DagMessage) -> None:
        """A newer DAG arrived (broker URLs may have changed)."""
        self._evaluate()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _fail(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        self._fatal_event.set()
        self._delivery.not_empty.set()
        for reader in list(self._readers.values()):
            self._stop_reader(reader)

    @property
    def drained_segments(self) -> frozenset[int]:
        return frozenset(self._drained)

    @property
    def reading(self) -> list[int]:
        """Segments being read now."""
        return sorted({segment_id for segment_id, _ in self._readers})

    @property
    def assignment(self) -> list[int]:
        """Segment ids currently assigned, in DAG order."""
        return list(self._assignment)

    async def wait_assignment(
        self, predicate: Callable[[list[int]], bool], within: float | None = None
    ) -> list[int]:
        """Wait for an assignment for which ``predicate(segment_ids)`` holds."""
        async with asyncio.timeout(within):
            while not predicate(self.assignment):
                self._assigned.clear()
                await self._assigned.wait()
        return self.assignment

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

    async def receive_many(self, max_messages: int = 1000) -> list[Message]:
        """Wait for the next message, then return it with those already queued behind it, up
        to ``max_messages``, in the order :meth:`receive` would return them.

        The throughput path: one await per batch instead of one per message. It never waits
        to fill a batch, so it adds no latency."""
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        batch = [await self.receive()]
        take, delivered = self._delivery.take, self._delivered
        while len(batch) < max_messages:
            got = take()
            if got is None:
                break
            reader, message = got
            delivered(reader, message)
            batch.append(message)
        return batch

    def _delivered(self, reader: _Reader, message: Message) -> None:
        """The application took ``message``: its entry is in progress until acknowledged
        (what a previous consumer acknowledged of it counts as acknowledged)."""
        if message.position not in reader.started:
            preacked = reader.preacked.pop(message.position, None) if reader.preacked else None
            reader.started[message.position] = set(preacked) if preacked else set()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            try:
                yield await self.receive()
            except ConsumerClosedError:
                return

    # -- the controller session -------------------------------------------------------------------

    async def _control(self) -> None:
        assert self._session is not None and self._watcher is not None
        backoff = Backoff(0.05, 5.0)
        redirect: str | None = None
        path = proto.consumers_path(self.namespace, self.topic)
        register = proto.RegisterMessage(
            subscription=self.subscription, consumer=self.name, consumer_type=self.consumer_type
        )
        while not self._closed:
            controller = self._watcher.dag.controller_url or self.service_url
            target = ws_url(redirect) if redirect else ws_url(controller) + path
            redirect = None
            retry_after: float | None = None
            try:
                async with await ws_connect(
                    self._session,
                    target,
                    heartbeat=self._heartbeat,
                    max_msg_size=64 << 20,
                    timeout=WS_TIMEOUT,
                ) as ws:
                    self._ws = ws
                    self.controller_sessions += 1
                    await ws.send_str(proto.encode(register))
                    self._reported.clear()
                    async for frame in ws:
                        if frame.type is not aiohttp.WSMsgType.TEXT:
                            break
                        message = proto.parse_server_message(frame.data)
                        if isinstance(message, proto.AssignmentMessage):
                            backoff.reset()
                            self._apply_assignment(message)
                        elif isinstance(message, proto.RedirectMessage):
                            redirect = message.url
                            retry_after = None if message.url else message.retry_after
                            log.info("controller redirect: %s (%s)", message.url, message.reason)
                        elif isinstance(message, proto.ErrorMessage):
                            self._on_error(message)
                    code = ws.close_code
                    if code in _FATAL_CLOSES and self._fatal is None and not self._closed:
                        reason = (
                            f"topic {self.namespace}/{self.topic} was deleted"
                            if code == proto.CloseCode.UNKNOWN_TOPIC
                            else "controller closed the session"
                        )
                        self._fail(_session_error(str(code), reason))
            except aiohttp.WSServerHandshakeError as exc:
                location = exc.headers.get("Location") if exc.headers else None
                if exc.status in (307, 308) and location:
                    redirect = location
                elif exc.status == 503 and exc.headers:
                    retry_after = float(exc.headers.get("Retry-After", "1"))
                log.info("controller session to %s refused: %s", target, exc.status)
            except TLSVerificationError as exc:
                # A redirect to a replica whose certificate the bundle does not verify.
                self._fail(ConsumerError(exc.code, str(exc)))
            except (
                aiohttp.ClientError,
                OSError,
                proto.SessionProtocolError,
                TimeoutError,
            ) as exc:
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
                await asyncio.sleep(backoff.delay())

    def _on_error(self, message: proto.ErrorMessage) -> None:
        if message.fatal and message.code in _FATAL_CODES:
            self._fail(_session_error(message.code.value, message.message))
        else:
            log.info("controller refused a report: %s: %s", message.code, message.message)

    def _send(
        self,
        message: proto.DrainedMessage
        | proto.PositionMessage
        | proto.ReleasedMessage
        | proto.UnregisterMessage,
    ) -> bool:
        ws = self._ws
        if ws is None or ws.closed:
            return False
        task = asyncio.ensure_future(ws.send_str(proto.encode(message)))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return True

    def _apply_assignment(self, message: proto.AssignmentMessage) -> None:
        self.assignments_received += 1
        self._reported.clear()
        self._assignment = {s.segment_id: s for s in message.segments}
        self._releasing = {r.segment_id: r.buckets for r in message.releasing}
        self._released_sent.clear()
        self._buckets_reported.clear()
        self._evaluate()
        self._assigned.set()

    def _evaluate(self) -> None:
        """Let go of segments no longer assigned, read the assigned ones that became
        readable, report drains."""
        for reader in list(self._readers.values()):
            if reader.segment_id not in self._assignment:
                self._unassigned(reader)
        for segment in self._assignment.values():
            segment_id = segment.segment_id
            if segment_id in self._drained:
                # Report only once the controller sees the segment sealed: the broker can end
                # a segment before the new layout reaches the controller, which would refuse.
                sealed = segment.state.value == "SEALED"
                report = proto.DrainedMessage(segment=segment_id)
                if sealed and segment_id not in self._reported and self._send(report):
                    self._reported.add(segment_id)
                continue
            done = self._done_buckets.get(segment_id)
            if done and segment.state.value == "SEALED":
                # as for whole segments: only once the controller sees the segment sealed
                unsent = tuple(
                    sorted(b for b in done if (segment_id, b) not in self._buckets_reported)
                )
                report = proto.DrainedMessage(segment=segment_id, buckets=unsent)
                if unsent and self._send(report):
                    self._buckets_reported.update((segment_id, b) for b in unsent)
            self._sync_segment(segment)
        self._confirm_releases()

    def _confirm_releases(self) -> None:
        """Tell the controller which withheld buckets this consumer no longer reads."""
        for segment_id, buckets in self._releasing.items():
            free = tuple(
                b
                for b in buckets
                if (segment_id, b) not in self._released_sent and not self._covers(segment_id, b)
            )
            if free and self._send(proto.ReleasedMessage(segment=segment_id, buckets=free)):
                self._released_sent.update((segment_id, b) for b in free)

    def _covers(self, segment_id: int, bucket: int) -> bool:
        return any(
            r.segment_id == segment_id and (r.buckets is None or bucket in r.buckets)
            for r in self._readers.values()
        )

    def _sync_segment(self, segment: proto.AssignedSegmentModel) -> None:
        """Read exactly the assigned buckets (``None``: the whole segment): hand over those no
        longer ours, attach (on a new connection) for the new ones once the segment is
        readable."""
        wanted = frozenset(segment.buckets) if segment.buckets is not None else None
        readers = self._readers_of(segment.segment_id)
        early = not readable(segment, self._drained)
        ready = frozenset(segment.ready_buckets)
        for reader in readers:
            keep = reader.buckets == wanted or (
                wanted is not None and reader.buckets is not None and reader.buckets <= wanted
            )
            # before the segment is readable: its ready buckets (per-bucket order)
            keep |= early and reader.buckets is not None and reader.buckets <= ready
            if not keep:
                self._release(reader)
        if any(r.releasing for r in readers):
            # a connection being handed over still holds the segment on the broker: attach
            # once it let go (the release re-evaluates) instead of being refused and backing off
            return
        if early:
            covered = set(self._done_buckets.get(segment.segment_id, ()))
            for reader in readers:
                covered |= reader.buckets or set()
            if ready - covered:
                self._start_reader(segment.segment_id, ready - covered)
            return
        if wanted is None:
            if not readers:
                self._start_reader(segment.segment_id)
            return
        covered = set(self._done_buckets.get(segment.segment_id, ()))
        for reader in readers:
            covered |= reader.buckets or set()
        missing = wanted - covered
        if missing:
            self._start_reader(segment.segment_id, frozenset(missing))

    def _unassigned(self, reader: _Reader) -> None:
        self._release(reader)

    def _release(self, reader: _Reader) -> None:
        """Hand ``reader``'s buckets (or segment) over: take nothing more from it, let the
        application settle what it took, then detach (the broker redelivers the rest to the
        new owner) and tell the controller."""
        if reader.releasing or reader.stopped:
            return
        reader.releasing = True
        self._spawn(self._finish_release(reader), f"release-{reader.segment_id}")

    async def _finish_release(self, reader: _Reader) -> None:
        if reader.started:
            log.info(
                "segment %d buckets %s: handing over after %d entries in progress",
                reader.segment_id,
                "all" if reader.buckets is None else sorted(reader.buckets),
                len(reader.started),
            )
            try:
                async with asyncio.timeout(self.release_timeout):
                    while reader.started:
                        reader.settled.clear()
                        await reader.settled.wait()
            except TimeoutError:
                log.warning(
                    "segment %d: %d entries still in progress after %ss; handing over anyway",
                    reader.segment_id,
                    len(reader.started),
                    self.release_timeout,
                )
        task = reader.task
        self._stop_reader(reader)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        self.releases += 1
        self._evaluate()

    def _holder(self, message: Message) -> _Reader | None:
        """The reader that handed ``message`` out, while it is still in progress."""
        segment_id, position = message.segment_id, message.position
        for reader in self._readers.values():
            if reader.segment_id == segment_id and position in reader.started:
                return reader
        return None

    def _settle(self, reader: _Reader, position: int) -> None:
        del reader.started[position]
        if reader.acked_through:
            reader.acked_through.pop(position, None)
        if not reader.started:
            reader.settled.set()

    def _report_position(self, segment_id: int, position: int) -> None:
        now = time.monotonic()
        if now - self._positions_sent.get(segment_id, 0.0) >= 1.0 and self._send(
            proto.PositionMessage(segment=segment_id, position=position)
        ):
            self._positions_sent[segment_id] = now

    # -- segment readers --------------------------------------------------------------------------

    def _readers_of(self, segment_id: int) -> list[_Reader]:
        return [r for r in self._readers.values() if r.segment_id == segment_id]

    def _start_reader(self, segment_id: int, buckets: frozenset[int] | None = None) -> None:
        key = (segment_id, buckets)
        if key in self._readers or segment_id in self._drained or self._closed:
            return
        reader = _Reader(segment_id, buckets)
        self._readers[key] = reader
        reader.task = self._spawn(self._read(reader), f"read-{segment_id}")

    def _queue_entry(self, reader: _Reader, consumer: SegmentConsumer, item: ReceivedEntry) -> None:
        """Hand a delivered entry's messages to the application's queue; those a previous
        consumer acknowledged (protocol v4) are left out, and an entry left with none is
        acknowledged at once."""
        messages = entry_messages(reader.segment_id, item)
        if item.acked:
            if not messages:
                consumer.ack(item.position)
                return
            reader.preacked[item.position] = item.acked
        self._delivery.put(reader, messages)

    def _stop_reader(self, reader: _Reader) -> None:
        if self._readers.get(reader.key) is reader:
            del self._readers[reader.key]
        if reader.stopped:
            return  # cancelled once: a second cancel would cut short the reader's cleanup
        if reader.consumer is not None:
            # what the application acknowledged of entries it did not finish: the next owner
            # of those entries skips these messages instead of delivering them again
            partial = reader.partial_acks()
            if partial:
                reader.consumer.ack_partial(partial)
        reader.stopped = True
        reader.halted.set()
        if reader.task is not None and reader.task is not asyncio.current_task():
            reader.task.cancel()

    async def _connect(self, reader: _Reader, backoff: Backoff) -> SegmentConsumer | None:
        """One attempt to attach to the segment; ``None`` after a failure (backed off)."""
        assert self._session is not None and self._watcher is not None
        url = reader.moved_to or self._segment_url(reader.segment_id)
        reader.moved_to = None
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
                buckets=sorted(reader.buckets) if reader.buckets is not None else None,
                permits=self.permits,
                session=self._session,
            )
        except SegmentNotFoundError:
            with contextlib.suppress(TimeoutError):
                await self._watcher.wait_update(backoff.delay())
            return None
        except AccessDeniedError as exc:
            self._fail(ConsumerError(exc.code, str(exc)))
            return None
        except SegmentError as exc:
            if exc.code == wire.ERR_SUBSCRIPTION_NOT_FOUND and self._sealed(reader.segment_id):
                raise _NothingToRead(str(exc)) from None
            if exc.code in _WAITING_CODES:
                self._refused(reader, exc)
            else:
                log.info("segment %d: attach failed: %s", reader.segment_id, exc)
            await asyncio.sleep(backoff.delay())
            return None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("segment %d: attach to %s failed: %s", reader.segment_id, url, exc)
            await asyncio.sleep(backoff.delay())
            return None
        if reader.refused_since is not None:
            waited = time.monotonic() - reader.refused_since
            reader.refused_since = None
            if waited >= REFUSALS_REPORTED_AFTER:
                log.info("segment %d: attached after %.1f s of refusals", reader.segment_id, waited)
        return consumer

    @staticmethod
    def _refused(reader: _Reader, exc: SegmentError) -> None:
        """The previous owner has not let go yet: usual during a hand-over, reported once it
        lasts (with the holder the broker names)."""
        now = time.monotonic()
        if reader.refused_since is None:
            reader.refused_since = reader.refusal_logged = now
        waited = now - reader.refused_since
        if now - reader.refusal_logged >= REFUSALS_REPORTED_AFTER:
            reader.refusal_logged = now
            log.info(
                "segment %d buckets %s: attach refused for %.0f s: %s",
                reader.segment_id,
                "all" if reader.buckets is None else sorted(reader.buckets),
                waited,
                exc,
            )
        else:
            log.debug("segment %d: attach refused: %s", reader.segment_id, exc)

    def _segment_url(self, segment_id: int) -> str | None:
        assigned = self._assignment.get(segment_id)
        if assigned is not None and assigned.broker_url:
            return assigned.broker_url
        if self._watcher is None:
            return None
        return self._watcher.dag.brokers().get(segment_id)

    def _sealed(self, segment_id: int) -> bool:
        assigned = self._assignment.get(segment_id)
        if assigned is not None and assigned.state.value == "SEALED":
            return True
        if self._watcher is None:
            return False
        return any(
            s.segment_id == segment_id and s.state.value == "SEALED"
            for s in self._watcher.dag.segments
        )

    async def _read(self, reader: _Reader) -> None:
        backoff = Backoff(0.02, 2.0)
        quarantined = False
        """The segment said it is corrupted: reattach slowly until an operator repairs it."""
        try:
            while not reader.stopped and not reader.releasing and not self._closed:
                try:
                    consumer = await self._connect(reader, backoff)
                except _NothingToRead:
                    log.info("segment %d: sealed without this subscription", reader.segment_id)
                    await self._segment_done(reader)
                    return
                if consumer is None:
                    continue
                reader.consumer = consumer
                reader.count = consumer.buckets
                try:
                    done = await self._pump(reader, consumer)
                except SegmentCorruptedError as exc:
                    # Everything before the damage was delivered; nothing more comes until an
                    # operator repairs the segment (the topic is Stalled with the reason).
                    level = logging.DEBUG if quarantined else logging.ERROR
                    log.log(level, "segment %d: %s; reattaching slowly", reader.segment_id, exc)
                    quarantined = True
                    done = False
                except SegmentMovedError as exc:
                    log.info("segment %d moved to %s; reattaching", reader.segment_id, exc.url)
                    reader.moved_to = exc.url
                    quarantined = done = False
                except (ConnectionClosedError, SegmentError) as exc:
                    log.info(
                        "segment %d: connection lost (%s); reattaching", reader.segment_id, exc
                    )
                    quarantined = False
                    done = False
                finally:
                    reader.consumer = None
                    await consumer.close()
                if done:
                    await self._segment_done(reader)
                    return
                if reader.moved_to is not None:
                    continue
                if not quarantined:
                    backoff.reset()
                await asyncio.sleep(backoff.delay())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("segment %d: reader failed", reader.segment_id)
            self._fail(exc)

    async def _pump(self, reader: _Reader, consumer: SegmentConsumer) -> bool:
        """Read until the segment is done (``True``) or the connection fails (raises)."""
        raise NotImplementedError

    async def _segment_done(self, reader: _Reader) -> None:
        """The segment is drained for this consumer: its readers stop, the next segments in
        DAG order may start. A reader of some of the segment's buckets is done with those only:
        the controller drains the segment once every bucket was reported."""
        segment_id = reader.segment_id
        if reader.buckets is not None and len(reader.buckets) < reader.count:
            log.info("segment %d buckets %s done", segment_id, sorted(reader.buckets))
            if self._readers.get(reader.key) is reader:
                del self._readers[reader.key]
            self._done_buckets.setdefault(segment_id, set()).update(reader.buckets)
            self._evaluate()
            return
        log.info("segment %d drained", segment_id)
        self._drained.add(segment_id)
        for other in self._readers_of(segment_id):
            if other is not reader:
                self._stop_reader(other)
        if self._readers.get(reader.key) is reader:
            del self._readers[reader.key]
        self._evaluate()

    async def _wait_room(self) -> None:
        while not self._delivery.room.is_set():
            await self._delivery.room.wait()

    # -- closing ----------------------------------------------------------------------------------

    async def close(self, *, unregister: bool = True) -> None:
        """Stop reading and leave: what this consumer held goes to the other consumers of the
        subscription at once.

        The readers detach from the brokers first (sending the last acknowledgements), then
        the controller is told (``unregister``), so the next owner attaches without waiting for
        this one to let go, and reads from the last acknowledgement. ``unregister=False`` only
        closes the socket: the controller holds the assignment for the grace period, as for a
        consumer that vanished, and a restart under the same name gets it back (if the
        controller session is down at that moment, that is what happens anyway).

        Bounded whatever the peers do (about a second), also when cancelled.
        """
        if self._closed:
            return
        self._closed = True
        self._delivery.not_empty.set()
        readers = [r.task for r in self._readers.values() if r.task is not None]
        for reader in list(self._readers.values()):
            self._stop_reader(reader)
        try:
            await asyncio.gather(*readers, return_exceptions=True)
            ws = self._ws
            if ws is not None and not ws.closed:
                if unregister:
                    message = proto.encode(proto.UnregisterMessage())
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(ws.send_str(message), CLOSE_TIMEOUT)
                await close_websocket(ws)
        finally:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._watcher is not None:
                await self._watcher.close()
            if self._own_session and self._session is not None:
                await self._session.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
