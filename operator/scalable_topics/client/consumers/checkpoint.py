"""Checkpoint consumers: assigned like stream consumers, positions kept by the application
(per segment, and per ``(segment, bucket)`` while sharing)."""

from __future__ import annotations

import asyncio
from typing import Unpack

import aiohttp

from scalable_topics.core import sessions as proto
from scalable_topics.core import wire
from scalable_topics.core.backoff import Backoff
from scalable_topics.core.hashing import bucket_hash

from ..model import Checkpoint, Message
from ..segment import (
    AdminError,
    SegmentAdmin,
    SegmentConsumer,
)
from .base import _ConsumerBase
from .common import (
    ConsumerOptions,
    _Reader,
    entry_messages,
    log,
)


class CheckpointConsumer(_ConsumerBase):
    """Assigned like a stream consumer, but keeps its positions itself (no broker acks).

    :meth:`checkpoint` returns a JSON-serialisable :class:`Checkpoint` covering every message
    the iterator has yielded; ``start_from=`` resumes after one. Take the checkpoint after
    processing a message (and store it with the results, e.g. in the same transaction).

    A sealed segment's end is known from its last position (asked from the broker's admin
    API, hence ``admin_token`` when the brokers require one).
    """

    consumer_type = proto.ConsumerType.CHECKPOINT

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        *,
        start_from: Checkpoint | None = None,
        admin_token: str | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(service_url, namespace, topic, subscription, name, **options)
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
        self._bucket_positions: dict[tuple[int, int], tuple[int, int]] = (
            dict(start_from.bucket_positions) if start_from else {}
        )
        if start_from is not None:
            self._drained |= start_from.drained
        self._admin_token = admin_token
        self._state_changed: dict[int, asyncio.Event] = {}
        self._bucket_counts: dict[int, int] = {}

    def checkpoint(self) -> Checkpoint:
        """Positions of everything yielded so far (per segment, and per ``(segment, bucket)``
        for buckets read while the segment was shared), and the drained segments."""
        return Checkpoint(
            self.namespace,
            self.topic,
            self.subscription,
            dict(self._positions),
            frozenset(self._drained),
            dict(self._bucket_positions),
        )

    def _bucket(self, message: Message) -> int | None:
        """The entry bucket of a keyed message of a segment with several buckets."""
        n = self._bucket_counts.get(message.segment_id, 1)
        key = message.key_bytes
        return None if n < 2 or key is None else wire.bucket_of(bucket_hash(key), n)

    def _covered(self, message: Message) -> bool:
        start = (message.position, message.batch_index)
        last = self._positions.get(message.segment_id)
        if last is not None and start <= last:
            return True
        bucket = self._bucket(message)
        if bucket is None:
            return False
        in_bucket = self._bucket_positions.get((message.segment_id, bucket))
        return in_bucket is not None and start <= in_bucket

    def _delivered(self, reader: _Reader, message: Message) -> None:
        position = (message.position, message.batch_index)
        bucket = self._bucket(message) if reader.buckets is not None else None
        if bucket is None:
            self._positions[message.segment_id] = position
        else:
            self._bucket_positions[(message.segment_id, bucket)] = position
        if message.last_in_entry:
            self._report_position(message.segment_id, message.position)

    def _evaluate(self) -> None:
        super()._evaluate()
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
        self._bucket_counts[segment_id] = consumer.buckets
        changed = self._state_changed.setdefault(segment_id, asyncio.Event())
        last: int | None = None
        received = -1
        loop = asyncio.get_running_loop()
        asking = Backoff(0.1, 5.0)
        ask_at: float | None = None
        """When to ask a sealed segment's last position (again, after a failed answer):
        nothing else wakes this loop once the broker has delivered every entry."""
        while not reader.stopped and not reader.releasing:
            if reader.buckets is not None:
                # Sharing the segment: the broker says when every entry of our buckets up to
                # the seal was delivered (protocol v2).
                if consumer.end_of_buckets and consumer.queued == 0:
                    while reader.outstanding > 0:
                        reader.taken.clear()
                        await reader.taken.wait()
                    return True
            elif last is None and self._sealed(segment_id) and loop.time() >= (ask_at or 0.0):
                last = await self._last_position(reader)
                ask_at = None if last is not None else loop.time() + asking.delay()
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
                retry = None if ask_at is None else max(0.0, ask_at - loop.time())
                try:
                    await asyncio.wait(
                        {ready, moved}, timeout=retry, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    ready.cancel()
                    moved.cancel()
                continue
            for item in items:
                received = max(received, item.position)
                messages = entry_messages(segment_id, item)
                self._delivery.put(reader, [m for m in messages if not self._covered(m)])
        if reader.releasing:
            await reader.halted.wait()
        return False

    async def _segment_done(self, reader: _Reader) -> None:
        if reader.buckets is not None and len(reader.buckets) < reader.count:
            await super()._segment_done(reader)  # only our buckets are done
            return
        self._state_changed.pop(reader.segment_id, None)
        self._positions.pop(reader.segment_id, None)
        for unit in [u for u in self._bucket_positions if u[0] == reader.segment_id]:
            del self._bucket_positions[unit]
        await super()._segment_done(reader)
