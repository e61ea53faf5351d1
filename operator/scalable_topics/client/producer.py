"""The key-routing producer of a scalable topic (DESIGN §1, §3, §5; PIP-460/PIP-486).

``ScalableTopicProducer`` follows the topic's DAG watch session and keeps one
:class:`~scalable_topics.client.segment.SegmentProducer` connection per segment it writes to:

* a keyed message goes to the segment whose range holds ``segment_hash(key)``; unkeyed messages
  go round-robin over the active segments;
* messages are batched per segment and cut into entries per entry bucket (each entry holds one
  bucket's keys, the codec stamps its ``hashB`` min/max), bounded by ``batch_max_messages``,
  ``batch_max_bytes`` and ``linger_ms``. This is the SDK's only batching: a segment's batches,
  entries and sequence ids live in its ``_Link``, which outlives connections, and each entry is
  encoded once, when it first reaches the head of the link's outbox, and handed to the
  connection with :meth:`SegmentProducer.publish` - on its first send and on every re-send alike
  (the connection itself only sends entries, within its in-flight window);
* ``send`` resolves once the broker acknowledged the entry as durable, to a :class:`MessageId`;
* sequence ids are per segment and producer name, kept across reconnects: after a broker
  restart the unacknowledged entries are resent byte for byte and the broker answers the ones
  it already stored as duplicates;
* on ``SEALED`` the unacknowledged messages, and everything queued behind them, are re-routed to
  the successors named in the frame, at once and in order (see :mod:`.routing` for why a key
  can never overtake itself);
* when the topic is deleted (the DAG watcher gives up, :class:`~.dag.TopicNotFoundError`) every
  pending and later send fails with that error, as the consumers' ``receive`` does;
* ``close()`` waits only for acknowledgements that can still come (no reconnect, no DAG wait
  once closing), and leaving on ``CancelledError``/``KeyboardInterrupt`` waits for none, so
  Ctrl-C ends a program within about a second whatever state the connections are in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import operator
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from scalable_topics.core import wire
from scalable_topics.core.hashing import key_hash
from scalable_topics.core.sessions import DagMessage
from scalable_topics.core.wire import Successor
from scalable_topics.credentials import client_session

from .dag import Backoff, DagWatcher, TopicNotFoundError
from .model import MessageId
from .routing import RoutingTable, plan_entries
from .segment import (
    AccessDeniedError,
    ConnectionClosedError,
    EntryAck,
    EntryRejectedError,
    ProtocolError,
    SegmentCorruptedError,
    SegmentError,
    SegmentMovedError,
    SegmentNotFoundError,
    SegmentNotWritableError,
    SegmentProducer,
    SegmentSealedError,
)

__all__ = ["MessageId", "ProducerClosedError", "ScalableTopicProducer"]

log = logging.getLogger("scalable_topics.client.producer")


class ProducerClosedError(Exception):
    """The producer was closed before the message was acknowledged."""


def _fail_all(outs: list[_Out], error: Exception) -> None:
    for out in outs:
        _fail_one(out, error)


def _fail_one(out: _Out, error: BaseException) -> None:
    _fail_future(out.future.future if isinstance(out.future, _Many) else out.future, error)


def _fail_future(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
        future.exception()  # retrieved: a caller that dropped the future is not warned


class _Many:
    """The one future of a :meth:`ScalableTopicProducer.send_many` call and the ids gathered
    for it: it resolves when the last of its messages is acknowledged, and fails with the
    first error of any of them."""

    __slots__ = ("future", "ids", "left")

    def __init__(self, future: asyncio.Future[list[MessageId]], count: int) -> None:
        self.future = future
        self.ids: list[MessageId | None] = [None] * count
        self.left = count

    def settle(self, slot: int, message_id: MessageId) -> None:
        if self.ids[slot] is not None or self.future.done():
            return
        self.ids[slot] = message_id
        self.left -= 1
        if self.left == 0:
            self.future.set_result(self.ids)  # type: ignore[arg-type]  # every slot is set


class _Out:
    """One message on its way to a broker."""

    __slots__ = (
        "future",
        "hash32",
        "hashb",
        "key",
        "properties",
        "size",
        "slot",
        "timestamp_ms",
        "value",
    )

    def __init__(
        self,
        value: bytes,
        key: bytes | None,
        timestamp_ms: int | None,
        properties: Mapping[str, str] | None,
        future: asyncio.Future[MessageId] | _Many,
        slot: int = 0,
    ) -> None:
        self.value = value
        self.key = key
        self.timestamp_ms = timestamp_ms
        self.properties = properties
        self.future = future
        self.slot = slot
        """The message's index in its ``send_many`` call."""
        self.hash32: int | None = None if key is None else key_hash(key)
        self.hashb: int | None = None if self.hash32 is None else self.hash32 & 0xFFFF
        """The key's bucket hash (``hashB``), None without a key."""
        self.size = len(value) + (len(key) if key is not None else 0) + 7

    def message(self) -> wire.Message:
        return wire.Message(
            value=self.value,
            key=self.key,
            timestamp_ms=self.timestamp_ms,
            properties=self.properties or {},
        )


_new_id: Callable[[type[MessageId], tuple[int, int, int]], MessageId] = tuple.__new__
_HASHB_OF = operator.attrgetter("hashb")
_SIZE_OF = operator.attrgetter("size")


class _Entry:
    __slots__ = ("data", "finished", "future", "messages", "seq")

    def __init__(self, messages: list[_Out]) -> None:
        self.messages = messages
        self.finished = False
        self.seq: int | None = None
        self.data: bytes | None = None
        self.future: asyncio.Future[EntryAck] | None = None


class _Link:
    """The producer's side of one segment: a batch buffer, entries waiting to be sent, entries
    in flight, and the task that keeps a connection to the segment's broker."""

    def __init__(self, segment_id: int) -> None:
        self.segment_id = segment_id
        self.buffer: list[_Out] = []
        self.buffer_bytes = 0
        self.linger: asyncio.TimerHandle | None = None
        self.outbox: deque[_Entry] = deque()
        self.inflight: deque[_Entry] = deque()
        self.pending = 0
        self.producer: SegmentProducer | None = None
        self.buckets: int | None = None
        self.next_seq = 0
        self.stored_seq = -1
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.retired = False
        self.connects = 0
        self.moved_to: str | None = None
        """The new owner a moved close frame named: the next connect goes there instead of to
        the DAG's URL (which catches up later); later ones follow the DAG again."""
        self.ahead = False
        """Opened on a parent's ``SEALING``, before anything routes here: given up (not
        retried) if it fails while it has nothing to send; the ``SEALED`` frame opens it again."""


class ScalableTopicProducer:
    """Produces to a scalable topic; use as ``async with`` or call :meth:`start`/:meth:`close`.

    ``service_url`` is the operator's URL (any replica serves the DAG watch). ``name`` is the
    producer name the brokers deduplicate on: give a stable one to keep deduplication across
    process restarts; by default a unique one is generated.
    """

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        *,
        name: str | None = None,
        batch_max_messages: int = 1000,
        batch_max_bytes: int = 256 * 1024,
        linger_ms: float = 1.0,
        max_pending: int = 10_000,
        max_inflight_bytes: int | None = None,
        session: aiohttp.ClientSession | None = None,
        ca_file: str | None = None,
    ) -> None:
        if batch_max_messages < 1 or batch_max_bytes < 1 or max_pending < 1 or linger_ms < 0:
            raise ValueError("batch limits and max_pending must be positive, linger_ms >= 0")
        self.namespace = namespace
        self.topic = topic
        self.name = name or f"{topic}-{uuid.uuid4().hex[:12]}"
        self._name_bytes = self.name.encode("utf-8")
        if not 0 < len(self._name_bytes) <= wire.MAX_PRODUCER_NAME:
            raise ValueError("producer name must be 1..255 bytes of UTF-8")
        self.batch_max_messages = batch_max_messages
        self.batch_max_bytes = batch_max_bytes
        self.linger = linger_ms / 1000.0
        self.max_pending = max_pending
        self.max_inflight_bytes = max_inflight_bytes
        self._own_session = session is None
        self._session = session
        self._ca_file = ca_file
        self._watcher = DagWatcher(service_url, namespace, topic, session=session)
        self._table = RoutingTable()
        self._links: dict[int, _Link] = {}
        self._parked: list[_Out] = []
        self._pending = 0
        self._space = asyncio.Event()
        self._space.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._round_robin = 0
        self._closing = asyncio.Event()
        """Set when close() begins: no new sends, no reconnects, no DAG waits."""
        self._closed = False
        self._started = False
        self._failure: TopicNotFoundError | None = None
        self.resent_entries = 0
        """Entries sent again on a new connection after one was lost without a verdict."""
        self.connections = 0
        """Segment connections opened so far (reconnects included)."""
        self.reroutes = 0
        """How many times a sealed segment's messages were re-routed (for tests and metrics)."""
        self.moves = 0
        """How many times a segment's moved close frame sent a link straight to the new owner."""
        self.early_connects = 0
        """Successors connected to on a parent's ``SEALING``, ahead of its ``SEALED``."""
        self._bucket_batches: dict[tuple[int, int], list[int]] = {}

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self) -> ScalableTopicProducer:
        if self._started:
            return self
        if self._session is None:
            self._session = client_session(ca_file=self._ca_file)
            self._watcher = DagWatcher(
                self._watcher.service_url, self.namespace, self.topic, session=self._session
            )
        dag = await self._watcher.start()
        self._table.update_dag(dag)
        self._watcher.add_listener(self._on_dag)
        self._watcher.add_failure_listener(self._on_topic_gone)
        self._started = True
        return self

    async def __aenter__(self) -> ScalableTopicProducer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Leaving normally (or on an application error) flushes as :meth:`close` does;
        leaving on ``CancelledError``, ``KeyboardInterrupt`` or ``SystemExit`` (Ctrl-C) waits
        for no acknowledgement."""
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        await self.close(0.0 if interrupted else 30.0)

    @property
    def dag(self) -> DagMessage:
        return self._watcher.dag

    @property
    def pending(self) -> int:
        """Messages sent and not acknowledged yet."""
        return self._pending

    # -- sending ----------------------------------------------------------------------------------

    async def send(
        self,
        value: bytes,
        key: str | bytes | None = None,
        *,
        timestamp_ms: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> MessageId:
        """Send one message and wait until it is durable; returns where it is stored."""
        future = await self.send_async(value, key, timestamp_ms=timestamp_ms, properties=properties)
        return await future

    async def send_async(
        self,
        value: bytes,
        key: str | bytes | None = None,
        *,
        timestamp_ms: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue one message (waiting only while ``max_pending`` messages are unacknowledged);
        the returned future resolves once it is durable. Messages of one key are stored in the
        order of the ``send_async`` calls."""
        await self._wait_space()
        kb = key.encode("utf-8") if isinstance(key, str) else key
        future: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        self._queue(_Out(bytes(value), kb, timestamp_ms, properties, future))
        return future

    async def send_many(
        self,
        values: Sequence[bytes],
        keys: Sequence[str | bytes | None] | None = None,
    ) -> asyncio.Future[list[MessageId]]:
        """Queue ``values`` (with ``keys[i]`` as the key of ``values[i]``; no keys: unkeyed) in
        order, as that many :meth:`send_async` calls would, and return one future: it resolves
        to their ids, in the order given, once every one of them is durable.

        The throughput path: a message costs no future, no coroutine and no callback of its
        own, about half of ``send_async``'s client CPU per message at 100 B (docs/client.md).
        If any message fails, the future fails with that error; the others may be stored
        (resend the whole batch, as after a failed ``send``). Waits for room as ``send_async``
        does, message by message, so a batch larger than ``max_pending`` is fine."""
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(values)} values but {len(keys)} keys")
        future: asyncio.Future[list[MessageId]] = asyncio.get_running_loop().create_future()
        if not values:
            future.set_result([])
            return future
        many = _Many(future, len(values))
        for slot, value in enumerate(values):
            # The first message always asks (a producer not started, closed or failed raises
            # as send_async does); the others only when the fast checks say it may have to wait.
            if (
                slot == 0
                or not self._space.is_set()
                or self._failure is not None
                or self._closing.is_set()
            ):
                try:
                    await self._wait_space()
                except Exception as exc:
                    _fail_future(future, exc)
                    raise
                except BaseException:
                    future.cancel()
                    raise
            key = None if keys is None else keys[slot]
            kb = key.encode("utf-8") if isinstance(key, str) else key
            self._queue(_Out(bytes(value), kb, None, None, many, slot))
        return future

    async def _wait_space(self) -> None:
        """Return once a message may be queued; raise if the producer cannot take it."""
        if not self._started:
            raise RuntimeError("the producer is not started (use 'async with' or start())")
        while True:
            if self._failure is not None:
                raise self._failure
            if self._closing.is_set():
                raise ProducerClosedError("producer closed")
            if self._space.is_set():
                return
            await self._space.wait()

    def _queue(self, out: _Out) -> None:
        self._pending += 1
        self._idle.clear()
        if self._pending >= self.max_pending:
            self._space.clear()
        self._enqueue(out)

    async def flush(self) -> None:
        """Send every batch now and wait until everything sent so far is acknowledged."""
        for link in list(self._links.values()):
            self._flush(link)
        await self._idle.wait()

    def _enqueue(self, out: _Out) -> _Link | None:
        """Route one message into its segment's batch (``None``: parked until the DAG moves)."""
        if out.hash32 is None:
            targets = self._table.segment_ids()
            if not targets:
                self._parked.append(out)
                return None
            self._round_robin = (self._round_robin + 1) % len(targets)
            segment_id = targets[self._round_robin]
        else:
            segment_id = self._table.route(out.hash32 >> 16).segment_id
        link = self._links.get(segment_id)
        if link is None:
            link = self._open_link(segment_id)
        link.buffer.append(out)
        link.buffer_bytes += out.size
        link.pending += 1
        if len(link.buffer) >= self.batch_max_messages or link.buffer_bytes >= self.batch_max_bytes:
            self._flush(link)
        elif link.linger is None:
            if self.linger > 0:
                link.linger = asyncio.get_running_loop().call_later(self.linger, self._flush, link)
            else:
                self._flush(link)
        return link

    def _open_link(self, segment_id: int, *, ahead_to: str | None = None) -> _Link:
        link = _Link(segment_id)
        link.buckets = self._table.buckets(segment_id)
        if ahead_to is not None:
            link.ahead = True
            link.moved_to = ahead_to
        self._links[segment_id] = link
        if not self._closed:
            link.task = asyncio.create_task(self._run_link(link), name=f"produce-{segment_id}")
        return link

    def _flush(self, link: _Link) -> None:
        if link.linger is not None:
            link.linger.cancel()
            link.linger = None
        if not link.buffer or link.buckets is None:
            link.wake.set()
            return
        entries = plan_entries(
            link.buffer,
            bucket_hash_of=_HASHB_OF,
            size_of=_SIZE_OF,
            buckets=link.buckets,
            max_messages=self.batch_max_messages,
            max_bytes=self.batch_max_bytes,
        )
        link.buffer = []
        link.buffer_bytes = 0
        link.outbox.extend(_Entry(e) for e in entries)
        for messages in entries:
            hb = messages[0].hashb
            bucket = -1 if hb is None else wire.bucket_of(hb, link.buckets)
            counts = self._bucket_batches.setdefault((link.segment_id, bucket), [0, 0])
            counts[0] += 1
            counts[1] += len(messages)
        link.wake.set()

    def bucket_batches(self) -> dict[tuple[int, int], tuple[int, int]]:
        """``(segment, entry bucket)`` -> (entries cut, messages in them) so far: the mean
        batch size per bucket is their ratio (PIP-486's producer metric; the entries of a
        segment's unkeyed messages are under bucket -1). An entry re-routed after a seal is
        cut again for its new segment."""
        return {unit: (e, m) for unit, (e, m) in self._bucket_batches.items()}

    # -- one segment's connection -----------------------------------------------------------------

    async def _run_link(self, link: _Link) -> None:
        backoff = Backoff(0.02, 2.0)
        assert self._session is not None
        failed = False
        """An attempt failed: while closing the link gives up instead of trying again."""
        while not self._closed and not link.retired and self._failure is None:
            if failed and link.ahead and link.pending == 0:
                log.debug("segment %d: not reachable ahead of its parent's seal", link.segment_id)
                if self._links.get(link.segment_id) is link:
                    del self._links[link.segment_id]
                return
            if failed and self._closing.is_set():
                log.info("segment %d: not reachable while closing; giving up", link.segment_id)
                self._fail_link(link, ProducerClosedError("producer closed while reconnecting"))
                return
            failed = True
            url = link.moved_to or self._table.broker_url(link.segment_id)
            link.moved_to = None
            if url is None:
                await self._pause(2.0, dag=True)
                continue
            try:
                producer = await SegmentProducer.connect(
                    url,
                    self.namespace,
                    self.topic,
                    link.segment_id,
                    self.name,
                    session=self._session,
                    max_inflight_bytes=self.max_inflight_bytes,
                )
            except SegmentNotFoundError:
                log.debug("segment %d not on %s yet; waiting for the DAG", link.segment_id, url)
                await self._pause(backoff.delay(), dag=True)
                continue
            except SegmentNotWritableError:
                # A child whose parents' seal redirected us before the controller opened it;
                # the broker already held the handshake for a while.
                log.info("segment %d not writable yet; retrying", link.segment_id)
                await self._pause(backoff.delay())
                continue
            except SegmentCorruptedError as exc:
                self._corrupted(link, exc)
                return
            except AccessDeniedError as exc:
                # Like a quarantined segment: no retry helps until RBAC or the token changes, so
                # the messages fail with the broker's reason; a later send tries again.
                log.error("segment %d: %s", link.segment_id, exc)
                self._fail_link(link, exc)
                if self._links.get(link.segment_id) is link:
                    del self._links[link.segment_id]
                return
            except (aiohttp.ClientError, OSError, ConnectionClosedError, TimeoutError) as exc:
                log.debug("segment %d: connect to %s failed: %s", link.segment_id, url, exc)
                await self._pause(backoff.delay())
                continue
            except ProtocolError as exc:
                log.warning("segment %d: broker refused the connection: %s", link.segment_id, exc)
                await self._pause(backoff.delay())
                continue
            failed = False
            link.connects += 1
            self.connections += 1
            link.producer = producer
            producer.on_sealing = self._on_sealing
            link.buckets = producer.buckets
            link.stored_seq = producer.last_sequence_id
            link.next_seq = max(link.next_seq, producer.last_sequence_id + 1)
            try:
                failure = await self._pump(link, producer)
            except asyncio.CancelledError:
                await producer.close(flush=False)
                raise
            finally:
                link.producer = None
            if isinstance(failure, SegmentSealedError):
                self._reroute(link, failure)
                await producer.close()
                return
            if isinstance(failure, SegmentCorruptedError):
                self._corrupted(link, failure)
                await producer.close()
                return
            # The connection is gone without a verdict: resend what is unacknowledged, with
            # the same sequence ids, on the next connection (the broker deduplicates).
            unacked: list[_Entry] = []
            for entry in link.inflight:
                future = entry.future
                if entry.finished:
                    continue
                if future is not None and future.done() and future.exception() is None:
                    self._finish(link, entry, ack=future.result())
                else:
                    unacked.append(entry)
            link.outbox.extendleft(reversed(unacked))
            self.resent_entries += len(unacked)
            link.inflight.clear()
            with contextlib.suppress(Exception):
                await producer.close()
            if self._closed:
                return
            if isinstance(failure, SegmentMovedError):
                # Lookup-less: straight to the new owner, no DAG round trip, no back-off.
                log.info("segment %d moved to %s; reconnecting there", link.segment_id, failure.url)
                link.moved_to = failure.url
                self.moves += 1
                failed = False
                continue
            if failure is not None:
                log.info("segment %d: connection lost (%s); reconnecting", link.segment_id, failure)
                failed = True
                backoff.reset()
                await self._pause(backoff.delay())

    async def _pause(self, delay: float, *, dag: bool = False) -> None:
        """Wait ``delay`` seconds before a link's next attempt, less when the producer starts
        closing or (``dag``) a newer DAG arrives."""
        if self._closing.is_set():
            return
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._closing.wait())]
        if dag:
            waits.append(asyncio.ensure_future(self._watcher.wait_update()))
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()

    async def _pump(self, link: _Link, producer: SegmentProducer) -> SegmentError | None:
        watch = asyncio.create_task(producer.wait_failed())
        watch.add_done_callback(lambda _: link.wake.set())
        try:
            self._flush(link)
            while not self._closed and producer.failure is None:
                if not link.outbox:
                    link.wake.clear()
                    if link.buffer and link.linger is None:
                        self._flush(link)
                        continue
                    await link.wake.wait()
                    continue
                entry = link.outbox[0]
                if entry.seq is None:
                    entry.seq = link.next_seq
                    link.next_seq += 1
                    entry.data = self._encode(entry.seq, entry.messages)
                assert entry.data is not None
                try:
                    future = await producer.publish(entry.seq, entry.data)
                except SegmentError:
                    break
                link.outbox.popleft()
                entry.future = future
                link.inflight.append(entry)
                future.add_done_callback(functools.partial(self._on_ack, link, entry))
        finally:
            watch.cancel()
        return producer.failure

    def _encode(self, seq: int, outs: list[_Out]) -> bytes:
        """One entry's bytes. Keyed messages without timestamp or properties (the common case)
        take the codec's fast path with the hashes computed for routing (no second hash, no
        ``wire.Message`` per message); any other mix goes through :func:`wire.encode_entry`."""
        publish_time_ms = int(time.time() * 1000)
        if all(o.hash32 is not None and o.timestamp_ms is None and not o.properties for o in outs):
            payload, count, hmin, hmax, sample, keyed = wire.encode_keyed_values(
                [o.key for o in outs],  # type: ignore[misc]  # keyed: checked above
                [o.value for o in outs],
                [o.hash32 for o in outs],  # type: ignore[misc]
            )
            return wire.encode_entry_raw(
                self._name_bytes,
                seq,
                payload,
                count,
                hashb_min=hmin,
                hashb_max=hmax,
                keyed=keyed,
                key_hash_sample=sample,
                publish_time_ms=publish_time_ms,
            )
        return wire.encode_entry(
            self.name, seq, [o.message() for o in outs], publish_time_ms=publish_time_ms
        )

    def _on_ack(self, link: _Link, entry: _Entry, future: asyncio.Future[EntryAck]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None and not isinstance(error, EntryRejectedError):
            return  # the connection failed: the link's task re-sends or re-routes the entry
        with contextlib.suppress(ValueError):
            if link.inflight and link.inflight[0] is entry:
                link.inflight.popleft()
            else:
                link.inflight.remove(entry)
        if error is not None:
            self._finish(link, entry, error=error)
        else:
            self._finish(link, entry, ack=future.result())

    def _finish(
        self,
        link: _Link,
        entry: _Entry,
        *,
        ack: EntryAck | None = None,
        error: BaseException | None = None,
    ) -> None:
        if entry.finished:
            return
        entry.finished = True
        if error is not None:
            for out in entry.messages:
                _fail_one(out, error)
        else:
            assert ack is not None
            segment_id, position = link.segment_id, ack.position
            for index, out in enumerate(entry.messages):
                sink = out.future
                message_id = _new_id(MessageId, (segment_id, position, index))
                if isinstance(sink, _Many):
                    sink.settle(out.slot, message_id)
                elif not sink.done():
                    sink.set_result(message_id)
        self._release(link, len(entry.messages))

    def _corrupted(self, link: _Link, error: SegmentCorruptedError) -> None:
        """The segment is quarantined (its log is damaged): no retry can store these messages
        until an operator repairs it, so they fail with ``error`` at once. The link goes away;
        a later send to the segment opens a new one and gets the same answer until then."""
        log.error("segment %d refuses writes: %s", link.segment_id, error)
        self._fail_link(link, error)
        if self._links.get(link.segment_id) is link:
            del self._links[link.segment_id]

    def _fail_link(self, link: _Link, error: Exception) -> None:
        """Retire ``link``: fail every message of it not acknowledged yet with ``error``."""
        link.retired = True
        if link.linger is not None:
            link.linger.cancel()
            link.linger = None
        for entry in [*link.inflight, *link.outbox]:
            future = entry.future
            if future is not None and future.done() and not future.exception():
                self._finish(link, entry, ack=future.result())
            elif not entry.finished:
                entry.finished = True
                _fail_all(entry.messages, error)
                self._release(link, len(entry.messages))
        link.inflight.clear()
        link.outbox.clear()
        buffer, link.buffer, link.buffer_bytes = link.buffer, [], 0
        _fail_all(buffer, error)
        self._release(link, len(buffer))
        link.wake.set()

    def _fail_parked(self, error: Exception) -> None:
        parked, self._parked = self._parked, []
        _fail_all(parked, error)
        self._release(None, len(parked))

    def _on_topic_gone(self, error: TopicNotFoundError) -> None:
        """The DAG watcher gave up: the topic was deleted. Everything pending fails with
        ``error``, and so does every later send."""
        if self._failure is not None or self._closed:
            return
        self._failure = error
        log.warning("%s: failing %d pending message(s)", error, self._pending)
        for link in list(self._links.values()):
            self._fail_link(link, error)
            if link.task is not None:
                link.task.cancel()
        self._fail_parked(error)
        self._space.set()

    def _release(self, link: _Link | None, count: int) -> None:
        if link is not None:
            link.pending -= count
        self._pending -= count
        if self._pending < self.max_pending:
            self._space.set()
        if self._pending <= 0:
            self._idle.set()

    # -- seals, DAG changes -----------------------------------------------------------------------

    def _reroute(self, link: _Link, sealed: SegmentSealedError) -> None:
        """Move everything the sealed segment did not store to its successors, in order."""
        link.retired = True
        if link.linger is not None:
            link.linger.cancel()
            link.linger = None
        messages: list[_Out] = []
        for entry in link.inflight:
            future = entry.future
            if entry.finished:
                continue
            if future is not None and future.done() and not future.exception():
                self._finish(link, entry, ack=future.result())
            elif entry.seq is not None and entry.seq <= link.stored_seq:
                # Stored by a connection that died before acknowledging it (the broker's
                # HELLO_OK said so); its position is unknown.
                self._finish(link, entry, ack=EntryAck(entry.seq, -1, True))
            else:
                messages.extend(entry.messages)
        for entry in link.outbox:
            if entry.seq is not None and entry.seq <= link.stored_seq:
                self._finish(link, entry, ack=EntryAck(entry.seq, -1, True))
            else:
                messages.extend(entry.messages)
        messages.extend(link.buffer)
        link.inflight.clear()
        link.outbox.clear()
        link.buffer = []
        link.pending = 0
        if self._links.get(link.segment_id) is link:
            del self._links[link.segment_id]
        successors = sealed.successors
        self._table.seal(link.segment_id, successors)
        self.reroutes += 1
        # Connect to every successor now (if SEALING did not already), not when its first
        # message comes: the connection handshake is most of a key's blocked window.
        for successor in successors:
            ahead = self._links.get(successor.segment_id)
            if ahead is None:
                self._open_link(successor.segment_id)
            else:
                ahead.ahead = False
        log.info(
            "segment %d sealed: re-routing %d messages to %s",
            link.segment_id,
            len(messages),
            [s.segment_id for s in successors],
        )
        touched: dict[int, _Link] = {}
        for out in messages:
            if self._routes_to_sealed(out):
                self._parked.append(out)
                continue
            target = self._enqueue(out)
            if target is not None:
                touched[target.segment_id] = target
        for target in touched.values():
            self._flush(target)

    def _on_sealing(self, successors: list[Successor]) -> None:
        """A parent's broker named its successors ahead of its seal (the controller created
        them, or the seal began): connect to them now (their brokers hold the handshakes until
        they are opened), so that ``SEALED`` finds the connections open. Named again as the
        seal begins, a successor already connected is left as it is."""
        if self._closed or self._closing.is_set():
            return
        for successor in successors:
            if successor.segment_id not in self._links and successor.broker_url:
                self._open_link(successor.segment_id, ahead_to=successor.broker_url)
                self.early_connects += 1

    def _routes_to_sealed(self, out: _Out) -> bool:
        if out.hash32 is None:
            return not self._table.segment_ids()
        segment_id = self._table.route(out.hash32 >> 16).segment_id
        link = self._links.get(segment_id)
        return (link is None or link.retired) and self._table.is_sealed(segment_id)

    def _on_dag(self, dag: DagMessage) -> None:
        self._table.update_dag(dag, busy=lambda i: i in self._links and self._links[i].pending > 0)
        for link in self._links.values():
            link.wake.set()
        if self._parked:
            parked, self._parked = self._parked, []
            for out in parked:
                if self._routes_to_sealed(out):
                    self._parked.append(out)
                else:
                    self._enqueue(out)

    # -- closing ----------------------------------------------------------------------------------

    async def close(self, within: float = 30.0) -> None:
        """Flush, waiting up to ``within`` seconds for the acknowledgements that can still
        come, then disconnect. Once closing, new sends raise :class:`ProducerClosedError` and
        nothing is retried: a segment whose broker cannot be reached (or that waits for the
        DAG) gives up at once. Messages unacknowledged in the end fail with
        :class:`ProducerClosedError`. The disconnect itself takes at most about a second,
        also when ``close`` is cancelled; ``flush()`` first to wait through reconnects."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._space.set()  # senders waiting for room raise ProducerClosedError
        try:
            self._fail_parked(ProducerClosedError("producer closed before the DAG routed it"))
            if self._started and within > 0 and self._failure is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(within):
                        await self.flush()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        self._space.set()
        self._watcher.remove_listener(self._on_dag)
        tasks = []
        for link in self._links.values():
            if link.linger is not None:
                link.linger.cancel()
                link.linger = None
            if link.task is not None and not link.task.done():
                link.task.cancel()  # a connected link closes its connection without flushing
                tasks.append(link.task)
        await asyncio.gather(*tasks, self._watcher.close(), return_exceptions=True)
        error = ProducerClosedError("producer closed before the message was acknowledged")
        for link in list(self._links.values()):
            self._fail_link(link, error)
        self._fail_parked(error)
        self._links.clear()
        if self._own_session and self._session is not None:
            await self._session.close()
