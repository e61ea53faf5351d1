"""What every consumer kind shares: errors, options, the segment reader and delivery queue
records, and the drain-gating rule."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import aiohttp

from scalable_topics.core import sessions as proto
from scalable_topics.core import wire

from ..dag import TopicNotFoundError
from ..model import EMPTY_PROPERTIES, Message
from ..segment import (
    ReceivedEntry,
    SegmentConsumer,
)

log = logging.getLogger("scalable_topics.client.consumers")

_FATAL_CODES = {
    proto.ErrorCode.SUPERSEDED,
    proto.ErrorCode.INVALID_SUBSCRIPTION,
    proto.ErrorCode.UNKNOWN_TOPIC,
    proto.ErrorCode.UNAUTHENTICATED,
    proto.ErrorCode.FORBIDDEN,
}
_FATAL_CLOSES = {
    proto.CloseCode.SUPERSEDED,
    proto.CloseCode.INVALID_SUBSCRIPTION,
    proto.CloseCode.UNKNOWN_TOPIC,
    proto.CloseCode.BAD_MESSAGE,
    proto.CloseCode.UNAUTHENTICATED,
    proto.CloseCode.FORBIDDEN,
}
_WAITING_CODES = {wire.ERR_CONSUMER_BUSY, wire.ERR_BUCKET_CONFLICT}
"""Attach refusals that only mean "the previous owner has not let go yet"."""
REFUSALS_REPORTED_AFTER = 10.0
"""Seconds of such refusals after which they are logged (at INFO, then every as many): a
previous owner that does not let go is a stall to see, a hand-over's usual wait is not."""

_new_tuple: Callable[[type[Message], tuple[Any, ...]], Message] = tuple.__new__


class ConsumerError(Exception):
    """The consumer cannot go on (superseded, unknown subscription or topic, bad message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ConsumerTopicNotFoundError(ConsumerError, TopicNotFoundError):
    """The consumer's topic is unknown or was deleted: a :class:`ConsumerError` (code
    ``UnknownTopic``) that is also the :class:`TopicNotFoundError` a producer of the topic
    raises, with the same message."""

    def __init__(self, message: str, *, deleted: bool = False) -> None:
        TopicNotFoundError.__init__(self, message, deleted=deleted)
        self.code = proto.ErrorCode.UNKNOWN_TOPIC.value


def _session_error(code: str, message: str) -> ConsumerError:
    if code in (proto.ErrorCode.UNKNOWN_TOPIC.value, str(int(proto.CloseCode.UNKNOWN_TOPIC))):
        return ConsumerTopicNotFoundError(message, deleted=True)
    return ConsumerError(code, message)


class ConsumerClosedError(Exception):
    pass


class _NothingToRead(Exception):
    """A sealed segment that never had this subscription: nothing to consume there."""


class ConsumerOptions(TypedDict, total=False):
    """Keyword options every consumer takes."""

    permits: int
    """Entries each broker connection may push ahead of the application (default 1000)."""
    receive_queue: int
    """Messages queued for the application before the readers pause (default 10 000)."""
    session: aiohttp.ClientSession | None
    """An HTTP session to use (default: one of the consumer's own)."""
    heartbeat: float
    """Seconds between pings on the controller session (default 20)."""
    ca_file: str | None
    """CA bundle verifying ``https``/``wss`` servers for the consumer's own session (default
    ``$SCALABLE_TOPICS_CA_FILE``, else the system's CAs; docs/security.md)."""


def entry_messages(segment_id: int, item: ReceivedEntry) -> list[Message]:
    """The application messages of a delivered entry.

    The hot path of every consumer: the payload is decoded straight into :class:`Message`
    tuples, built with ``tuple.__new__`` (no intermediate ``wire.Message``, no Python-level
    constructor call), so a message costs one object: without properties it shares one empty
    read-only mapping; with them, the dict is the decoder's own, fresh per message."""
    entry = item.entry
    header = wire.decode_entry_header(entry)
    count = header.message_count
    position = item.position
    publish_time_ms = header.publish_time_ms
    producer_name = header.producer_name
    redelivery_count = item.redelivery_count
    messages = [
        _new_tuple(
            Message,
            (
                None if key is None else key.decode("utf-8", "surrogateescape"),
                value,
                segment_id,
                position,
                i,
                count,
                properties or EMPTY_PROPERTIES,
                timestamp_ms,
                publish_time_ms,
                producer_name,
                redelivery_count,
            ),
        )
        for i, (value, key, timestamp_ms, properties) in enumerate(
            wire.iter_message_fields(wire.entry_payload(entry, header), count)
        )
    ]
    if item.acked:
        # a previous consumer acknowledged these before leaving in the middle of the entry
        return [m for m in messages if m.batch_index not in item.acked]
    return messages


def readable(segment: proto.AssignedSegmentModel, drained: set[int] | frozenset[int]) -> bool:
    """May the consumer read ``segment`` now (``docs/sessions.md``: drain gating)?"""
    return segment.consumable or set(segment.blocked_by) <= drained


# -- the machinery: segment readers feeding one delivery queue ----------------------------------

ReaderKey = tuple[int, frozenset[int] | None]
"""A reader reads one segment, for its named entry buckets (``None``: the whole segment)."""


@dataclass(eq=False)
class _Reader:
    segment_id: int
    buckets: frozenset[int] | None = None
    task: asyncio.Task[None] | None = None
    consumer: SegmentConsumer | None = None
    outstanding: int = 0
    """Messages queued for the application and not yet taken."""
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: bool = False
    halted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once stopped (a pump handing its buckets over waits for it)."""
    acked: int = -1
    """Stream: the highest position acknowledged cumulatively."""
    releasing: bool = False
    """Queue: the buckets are being handed over; entries not started are dropped."""
    started: dict[int, set[int]] = field(default_factory=dict)
    """Entries of which the application took a message → batch indexes acknowledged (queue:
    one by one; stream: those a previous consumer acknowledged)."""
    acked_through: dict[int, int] = field(default_factory=dict)
    """Stream: started entries acknowledged up to this batch index, not whole (an ack is
    cumulative: every message of the entry before it is acknowledged too)."""
    preacked: dict[int, frozenset[int]] = field(default_factory=dict)
    """Entries queued whose messages at these batch indexes a previous consumer acknowledged
    (``ACKED_INDEXES``): they count as acknowledged once the application takes the entry."""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    moved_to: str | None = None
    """The new owner a moved close frame named: the next attach goes there (no DAG wait)."""
    count: int = 1
    """The segment's bucket count (from the broker's ``HELLO_OK``)."""
    refused_since: float | None = None
    """When the broker started refusing this reader's attach as busy (``None``: it is not)."""
    refusal_logged: float = 0.0

    @property
    def key(self) -> ReaderKey:
        return self.segment_id, self.buckets

    def partial_acks(self) -> dict[int, set[int]]:
        """Started entries some of whose messages are acknowledged, with their batch indexes:
        sent as a partial ack when the reader stops in the middle of them."""
        out: dict[int, set[int]] = {}
        for position, indexes in self.started.items():
            through = self.acked_through.get(position, -1)
            if indexes or through >= 0:
                out[position] = indexes.union(range(through + 1))
        return out

    def wants(self, message: Message) -> bool:
        """Does a queued ``message`` still go to the application?"""
        return not self.stopped and (not self.releasing or message.position in self.started)


class _Delivery:
    """The bounded queue between segment readers and the application's iterator.

    It holds each delivered entry's message list as one item (not one tuple per message) and
    counts the messages: fewer objects per message, which the cyclic GC has to visit."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: deque[tuple[_Reader, list[Message]]] = deque()
        self.size = 0
        """Messages queued (the capacity counts messages)."""
        self._next = 0
        """Index of the next message in the first item's list."""
        self.not_empty = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()

    def put(self, reader: _Reader, messages: list[Message]) -> None:
        if not messages:
            return
        self.items.append((reader, messages))
        self.size += len(messages)
        reader.outstanding += len(messages)
        self.not_empty.set()
        if self.size >= self.capacity:
            self.room.clear()

    def take(self) -> tuple[_Reader, Message] | None:
        items = self.items
        while items:
            reader, messages = items[0]
            message = messages[self._next]
            self._next += 1
            if self._next == len(messages):
                items.popleft()
                self._next = 0
            self.size -= 1
            reader.outstanding -= 1
            reader.taken.set()
            if self.size < self.capacity:
                self.room.set()
            if reader.wants(message):
                return reader, message
        self.not_empty.clear()
        return None
