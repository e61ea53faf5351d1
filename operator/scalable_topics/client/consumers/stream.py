"""Stream consumers: ordered, acknowledged on the brokers (whole segments, or PIP-486 buckets)."""

from __future__ import annotations

from collections.abc import Iterable

from scalable_topics.core import sessions as proto

from ..model import Message
from ..segment import (
    SegmentConsumer,
)
from .base import _ConsumerBase
from .common import (
    _Reader,
)


class StreamConsumer(_ConsumerBase):
    """Ordered consumption of what the controller assigns to ``name``: whole segments, or -
    with more consumers than segments (PIP-486 key-shared) - entry buckets of segments.

    ``ack(msg)`` is cumulative per reader: it acknowledges ``msg`` and every message this
    consumer handed out before it from the same segment (and the same buckets). A sealed
    segment is drained (and the next segments in DAG order start) once every message of it
    is acknowledged by the subscription. Buckets taken away are handed over once the
    application acknowledged what it took of them (``release_timeout`` bounds the wait).
    """

    consumer_type = proto.ConsumerType.STREAM

    async def _pump(self, reader: _Reader, consumer: SegmentConsumer) -> bool:
        whole = reader.buckets is None
        if whole and reader.acked >= consumer.ack_floor:
            consumer.ack_cumulative(reader.acked)
        while not reader.stopped and not reader.releasing:
            await self._wait_room()
            if reader.releasing:
                break
            if reader.buckets is not None:
                # protocol v3: every entry of our buckets of the sealed segment is acknowledged
                # by the subscription; the children's buckets holding their keys may start
                if reader.buckets <= consumer.buckets_done:
                    return True
                if not consumer.queued and not consumer.end_of_segment:
                    if consumer.failure is not None:
                        raise consumer.failure
                    await consumer.wait_frame()
                    continue
            item = await consumer.receive()
            if item is None:
                return True
            if reader.releasing or (whole and item.position <= reader.acked):
                continue
            self._queue_entry(reader, consumer, item)
        # Handing over: take nothing more; the release stops this reader once the application
        # has acknowledged what it took (the connection stays open for those acks).
        await reader.halted.wait()
        return False

    async def ack(self, message: Message) -> None:
        """Acknowledge ``message`` and every message handed out before it from its reader."""
        self.ack_nowait(message)

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge every message of ``messages`` (and what was handed out before them):
        a batch from :meth:`receive_many` costs one cumulative acknowledgement per segment."""
        last: dict[int, Message] = {}
        for message in messages:
            last[message.segment_id] = message
        for message in last.values():
            self.ack_nowait(message)

    def ack_nowait(self, message: Message) -> None:
        segment_id = message.segment_id
        reader = self._holder(message)
        if reader is None:
            return  # no longer ours (or already acknowledged): the new owner gets it again
        if not message.last_in_entry:
            through = reader.acked_through
            if through.get(message.position, -1) < message.batch_index:
                through[message.position] = message.batch_index
        if reader.buckets is None:
            target = message.position if message.last_in_entry else message.position - 1
            if target < 0 or target <= reader.acked:
                return
            reader.acked = target
            for position in [p for p in reader.started if p <= target]:
                self._settle(reader, position)
            if reader.consumer is not None:
                reader.consumer.ack_cumulative(target)
            self._report_position(segment_id, target)
            return
        # Buckets: entries come in position order per bucket but not across buckets, so
        # "everything before" is in the order the application took them.
        done: list[int] = []
        for position in reader.started:
            if position == message.position:
                if message.last_in_entry:
                    done.append(position)
                break
            done.append(position)
        for position in done:
            self._settle(reader, position)
        if done and reader.consumer is not None:
            reader.consumer.ack_many(done)
