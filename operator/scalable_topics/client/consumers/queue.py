"""Queue consumers: workers sharing a Queue subscription, individual acks, ordered per key by
entry buckets (or round-robin with ``ordered=False``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from scalable_topics.core import sessions as proto

from ..model import Message
from ..segment import (
    SegmentConsumer,
)
from .base import _ConsumerBase
from .common import (
    ConsumerOptions,
    _Reader,
)


class QueueConsumer(_ConsumerBase):
    """A worker of a Queue subscription: any number of workers share it, messages are
    acknowledged one by one, and (``ordered=True``, the default) each key is processed by one
    worker at a time, in order.

    Ordered, the worker registers with the controller like a stream consumer
    (``consumerType: queue``) and is assigned **entry buckets** of the segments (PIP-486): it
    attaches to each assigned segment naming its buckets, and the broker delivers an entry only
    to the owner of its bucket, in position order. A bucket taken away is handed over only after
    the application has acknowledged (or negatively acknowledged) every message it took of it;
    what was delivered but not taken yet is given back to the broker, which redelivers it to the
    new owner first, in order. ``release_timeout`` bounds that wait (``None``: as long as it
    takes - a shorter bound trades per-key order for progress when the application holds a
    message forever). Across splits and merges a child's buckets are read only once the
    parents are drained for the subscription, as for stream consumers.

    ``ordered=False``: no controller session; the worker attaches to every segment of the topic
    naming no buckets and the brokers spread entries round-robin among the workers (no order
    across them). All workers of a subscription must use the same mode: a broker serves one
    mode per segment at a time and refuses (then retries) a worker of the other.
    """

    consumer_type = proto.ConsumerType.QUEUE

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        subscription: str,
        name: str,
        *,
        ordered: bool = True,
        release_timeout: float | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(service_url, namespace, topic, subscription, name, **options)
        self.ordered = ordered
        self.release_timeout = release_timeout

    async def start(self, within: float = 60.0) -> None:
        if self.ordered:
            await super().start(within)
        elif not self._started:
            self._started = True
            self._on_dag((await self._start_watcher()).dag)

    @property
    def buckets(self) -> dict[int, tuple[int, ...]]:
        """Segment → the entry buckets assigned to this worker (ordered mode)."""
        return {s: tuple(a.buckets or ()) for s, a in self._assignment.items()}

    # -- what to read -------------------------------------------------------------------------

    def _on_dag(self, dag: proto.DagMessage) -> None:
        if self.ordered:
            self._evaluate()
            return
        present = {s.segment_id for s in dag.segments}
        for reader in list(self._readers.values()):
            if reader.segment_id not in present:
                self._stop_reader(reader)
        for segment in dag.segments:
            self._start_reader(segment.segment_id)

    def _evaluate(self) -> None:
        if self.ordered:
            super()._evaluate()

    # -- reading ------------------------------------------------------------------------------

    async def _pump(self, reader: _Reader, consumer: SegmentConsumer) -> bool:
        while not reader.stopped and not reader.releasing:
            await self._wait_room()
            if reader.releasing:
                break
            item = await consumer.receive()
            if item is None:
                return True
            if not reader.releasing:
                self._queue_entry(reader, consumer, item)
        # Handing the buckets over: take nothing more; the release stops this reader.
        await reader.halted.wait()
        return False

    async def ack(self, message: Message) -> None:
        self.ack_nowait(message)

    def ack_nowait(self, message: Message) -> None:
        """Acknowledge one message (the broker is told once all of its entry is acknowledged).
        A message whose connection is gone is not acknowledged: the broker redelivers it."""
        reader = self._holder(message)
        if reader is None:
            return
        acked = reader.started[message.position]
        acked.add(message.batch_index)
        if len(acked) < message.batch_size:
            return
        self._settle(reader, message.position)
        if reader.consumer is not None:
            reader.consumer.ack(message.position)

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge each message of ``messages`` (a batch from :meth:`receive_many`)."""
        for message in messages:
            self.ack_nowait(message)

    def nack(self, message: Message) -> None:
        """Give the message's entry back for redelivery (ordered: to the bucket's owner, which
        may be this worker again, after the entries it already holds of that bucket)."""
        reader = self._holder(message)
        if reader is None:
            return
        self._settle(reader, message.position)
        if reader.consumer is not None:
            reader.consumer.nack([message.position])

    async def _segment_done(self, reader: _Reader) -> None:
        await super()._segment_done(reader)
        if not self.ordered and self._watcher is not None:
            self._on_dag(self._watcher.dag)
