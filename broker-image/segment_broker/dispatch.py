"""Consumer dispatch for one subscription of one segment.

Entries are pushed to attached consumers while they have permits (one permit = one entry).
Dispatch state lives in memory; only the cursor is persisted:

* ``next_read`` — the next position never examined by this dispatcher (starts at the cursor's
  ack floor after a restart, skipping individually acknowledged positions).
* ``pending`` per consumer — delivered, not yet acknowledged. When a consumer detaches (or
  negatively acknowledges), its pending entries go back to a *lane* for redelivery to the next
  consumer, ahead of new entries, in position order.
* *lanes* — positions waiting for redelivery. Round-robin dispatch has one lane. Keyed
  dispatch has one lane per entry bucket (and one for unkeyed entries): an entry whose bucket's
  owner is absent or out of permits is parked in its bucket's lane, and every later entry of
  that bucket queues behind it, so per-bucket (hence per-key) order holds while other buckets
  keep flowing. Parking is bounded (``max_parked``); beyond it dispatch waits.

Subscription types: Exclusive (one consumer of the whole segment - the SDK's stream and
checkpoint consumers - or, from protocol version 2, several consumers each naming the buckets
the controller assigned it: PIP-486 key-shared ordered consumption, dispatched like KeyShared,
individual acks only; the two kinds never attach at once, the other gets ``ConsumerBusy``),
KeyShared (PIP-486: an entry goes only to the consumer owning the bucket of its ``hashB``
minimum; bucket boundaries ``i * 65536 // N``), and Queue, whose dispatch follows its
consumers: consumers naming buckets make it keyed like KeyShared (the SDK's queue consumers,
which the controller assigns disjoint buckets), consumers naming none make it round-robin by
entry among those with permits. The two kinds never share a Queue subscription of a segment
at once: a consumer of the other kind is refused (``BucketConflict``) until the attached ones
are gone, and the parked entries are re-sorted into the new kind's lanes when it switches.
A bucket has one owner at a time, so a bucket moves to a new consumer only once its previous
owner has detached; what that owner had not acknowledged is redelivered first, in position
order.

On a sealed segment a bucket owner hears, per bucket, when every entry of it up to the seal is
acknowledged (``BUCKETS_DONE``, protocol v3): the children's buckets covering those keys may
start before the rest of the segment is consumed (per-bucket ordering, PIP-486).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from scalable_topics.core.subscriptions import BrokerSubscriptionType
from scalable_topics.core.wire import bucket_of, entry_bucket_hash

from .storage.cursor import Cursor
from .storage.log import Corruption
from .storage.segment import Segment

UNKEYED_LANE = -1
_ROUND_BYTES = 4 * 1024 * 1024
_READ_BATCH = 512


class DispatchError(Exception):
    """A consumer request that cannot be served; ``code`` is a wire error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConsumerSink(Protocol):
    def deliver(self, items: list[tuple[int, int, Any]]) -> None:
        """Queue ``(position, redelivery_count, entry)`` items for sending (must not block)."""

    def end_of_segment(self, last_position: int) -> None: ...

    def end_of_buckets(self, last_position: int) -> None:
        """Every entry of the consumer's buckets up to the seal was delivered to it."""

    def buckets_done(self, last_position: int, buckets: list[int]) -> None:
        """Every entry of ``buckets`` (of the consumer's) up to the seal is acknowledged."""

    def corrupted(self, corruption: Corruption) -> None:
        """The consumer reached the first damaged position of a quarantined segment."""


class Consumer:
    __slots__ = (
        "buckets",
        "buckets_done_sent",
        "buckets_end_sent",
        "corruption_sent",
        "eos_sent",
        "id",
        "in_order",
        "name",
        "pending",
        "permits",
        "sink",
    )

    _ids = itertools.count(1)

    def __init__(self, name: str, buckets: frozenset[int] | None, sink: ConsumerSink) -> None:
        self.id = next(Consumer._ids)
        self.name = name
        self.buckets = buckets
        self.sink = sink
        self.permits = 0
        self.pending: dict[int, int] = {}
        """Delivered, unacknowledged position -> lane, in delivery order."""
        self.in_order = True
        """``pending`` is in ascending position order (no redelivery went out of order)."""
        self.eos_sent = False
        self.buckets_end_sent = False
        self.buckets_done_sent: set[int] = set()
        self.corruption_sent = False


class Dispatcher:
    def __init__(
        self,
        segment: Segment,
        cursor: Cursor,
        *,
        on_out: Callable[[int, int], None] | None = None,
        max_parked: int = 10_000,
    ) -> None:
        self.segment = segment
        self.cursor = cursor
        self.type = cursor.type
        self.on_out = on_out
        self.max_parked = max_parked
        self.consumers: list[Consumer] = []
        self.owners: dict[int, Consumer] = {}
        self.lanes: dict[int, list[int]] = {}
        self.parked = 0
        self.keyed = cursor.type is BrokerSubscriptionType.KEY_SHARED
        """Entries go to their bucket's owner (KeyShared, or a Queue with bucket owners)."""
        self.redeliveries: dict[int, int] = {}
        self.next_read = cursor.next_unacked(cursor.ack_floor)
        self._rr = 0
        self._scheduled = False
        self.closed = False

    # --- consumers -----------------------------------------------------------------------------

    def attach(self, name: str, buckets: Sequence[int] | None, sink: ConsumerSink) -> Consumer:
        n = self.segment.meta.buckets
        owned: frozenset[int] | None = None
        exclusive = self.type is BrokerSubscriptionType.EXCLUSIVE
        if exclusive and (buckets is None or any(c.buckets is None for c in self.consumers)):
            if self.consumers:
                raise DispatchError(
                    "ConsumerBusy",
                    f"subscription {self.cursor.name!r} already has consumer "
                    f"{self.consumers[0].name!r}",
                )
        elif self.type is BrokerSubscriptionType.KEY_SHARED or buckets is not None:
            if buckets is None:
                if n != 1:
                    raise DispatchError(
                        "ProtocolError", "a KeyShared consumer must name the buckets it owns"
                    )
                buckets = [0]
            owned = frozenset(buckets)
            bad = [b for b in owned if not 0 <= b < n]
            if bad:
                raise DispatchError("ProtocolError", f"buckets {bad} outside 0..{n - 1}")
            taken = sorted(b for b in owned if b in self.owners)
            if taken:
                raise DispatchError(
                    "BucketConflict",
                    f"buckets {taken} are owned by {self.owners[taken[0]].name!r}",
                )
        if self.type is BrokerSubscriptionType.QUEUE:
            self._check_kind(owned is not None)
        elif exclusive and not self.consumers:
            self._set_keyed(owned is not None)
        consumer = Consumer(name, owned, sink)
        self.consumers.append(consumer)
        if owned:
            for b in owned:
                self.owners[b] = consumer
        self._check_end(consumer)
        self.schedule()
        return consumer

    def _check_kind(self, keyed: bool) -> None:
        """A Queue subscription is keyed or round-robin, as its attached consumers are."""
        if not self.consumers:
            self._set_keyed(keyed)
        elif keyed != self.keyed:
            mine, theirs = ("bucket", "round-robin") if keyed else ("round-robin", "bucket")
            raise DispatchError(
                "BucketConflict",
                f"subscription {self.cursor.name!r} is consumed by {theirs} consumers; a "
                f"{mine} consumer can attach once they are gone",
            )

    def _set_keyed(self, keyed: bool) -> None:
        """Switch dispatch kind; parked entries move to the new kind's lanes (every consumer
        has detached, so whatever was delivered and not acknowledged is parked)."""
        if keyed == self.keyed:
            return
        self.keyed = keyed
        parked = sorted(p for positions in self.lanes.values() for p in positions)
        self.lanes = {}
        for p in parked:
            lane = 0
            if keyed:
                entry = self.segment.read_one(p)
                lane = UNKEYED_LANE if entry is None else self._lane_of(entry)
            self.lanes.setdefault(lane, []).append(p)

    def detach(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        if consumer.buckets:
            for b in consumer.buckets:
                if self.owners.get(b) is consumer:
                    del self.owners[b]
        self._requeue(consumer, list(consumer.pending))
        self.schedule()

    def close(self) -> None:
        self.closed = True

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.permits = min(consumer.permits + permits, 1 << 31)
        self.schedule()

    def ack(self, consumer: Consumer, positions: Sequence[int], cumulative: bool) -> None:
        last = self.segment.visible_position
        cursor = self.cursor
        if max(positions) > last:
            raise DispatchError("ProtocolError", f"ack beyond the last position {last}")
        if cumulative:
            if self.type is not BrokerSubscriptionType.EXCLUSIVE or consumer.buckets is not None:
                raise DispatchError(
                    "ProtocolError",
                    "cumulative acks are only allowed on Exclusive subscriptions, by a consumer "
                    "of the whole segment",
                )
            upto = positions[0]
            cursor.ack_cumulative(upto)
            pending = consumer.pending
            if consumer.in_order:
                # Delivered in ascending order: the acked ones are a prefix of the dict.
                while pending:
                    p = next(iter(pending))
                    if p > upto:
                        break
                    del pending[p]
                    self.redeliveries.pop(p, None)
            else:
                for p in [p for p in pending if p <= upto]:
                    del pending[p]
                    self.redeliveries.pop(p, None)
                if not pending:
                    consumer.in_order = True
        else:
            pending = consumer.pending
            redeliveries = self.redeliveries
            for p in positions:
                cursor.ack(p)
                pending.pop(p, None)
                if redeliveries:
                    redeliveries.pop(p, None)
        if self.segment.seal is not None or self.segment.corruption is not None:
            self.schedule()

    def ack_partial(self, consumer: Consumer, partial: Mapping[int, frozenset[int]]) -> None:
        """Batch-index acknowledgement (protocol v4). An index must name a message of the entry
        (what a cursor keeps is bounded by the entries' own sizes); an entry whose every
        message is acknowledged by now is acknowledged whole."""
        last = self.segment.visible_position
        if max(partial) > last:
            raise DispatchError("ProtocolError", f"ack beyond the last position {last}")
        whole: list[int] = []
        for position, indexes in partial.items():
            if self.cursor.is_acked(position):
                continue
            entry = self.segment.read_one(position)
            if entry is None:
                continue  # gone (retention, a truncate): nothing to keep
            count = self.segment.message_count(entry)
            if max(indexes) >= count:
                raise DispatchError(
                    "ProtocolError",
                    f"batch index {max(indexes)} of entry {position}, which has {count} messages",
                )
            if len(self.cursor.partial.get(position, frozenset()) | indexes) == count:
                whole.append(position)
            else:
                self.cursor.ack_partial(position, indexes)
        if whole:
            self.ack(consumer, whole, cumulative=False)

    def nack(self, consumer: Consumer, positions: Sequence[int]) -> None:
        self._requeue(consumer, [p for p in positions if p in consumer.pending])
        self.schedule()

    def _requeue(self, consumer: Consumer, positions: list[int]) -> None:
        for p in positions:
            lane = consumer.pending.pop(p)
            if self.cursor.is_acked(p):
                continue
            bisect.insort(self.lanes.setdefault(lane, []), p)
            self.parked += 1
            self.redeliveries[p] = self.redeliveries.get(p, 0) + 1

    # --- dispatch ------------------------------------------------------------------------------

    def schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def on_durable(self, _position: int) -> None:
        if self.consumers:
            self.schedule()

    def _target(self, lane: int) -> Consumer | None:
        if self.keyed and lane != UNKEYED_LANE:
            owner = self.owners.get(lane)
            return owner if owner is not None and owner.permits > 0 else None
        consumers = self.consumers
        n = len(consumers)
        for i in range(n):
            c = consumers[(self._rr + i) % n]
            if c.permits > 0:
                self._rr = (self._rr + i + 1) % n
                return c
        return None

    def _lane_of(self, entry: Any) -> int:
        if not self.keyed:
            return 0
        hb = entry_bucket_hash(entry)
        if hb is None:
            return UNKEYED_LANE
        return bucket_of(hb, self.segment.meta.buckets)

    def _run(self) -> None:
        self._scheduled = False
        if self.closed or not self.consumers:
            return
        out: dict[Consumer, list[tuple[int, int, Any]]] = {}
        seg = self.segment
        cursor = self.cursor
        budget = _ROUND_BYTES
        msgs = 0
        nbytes = 0

        def give(c: Consumer, pos: int, lane: int, entry: Any) -> None:
            nonlocal msgs, nbytes
            c.permits -= 1
            if c.in_order and c.pending and pos < next(reversed(c.pending)):
                c.in_order = False
            c.pending[pos] = lane
            items = out.get(c)
            if items is None:
                items = out[c] = []
            items.append((pos, self.redeliveries.get(pos, 0), entry))
            msgs += Segment.message_count(entry)
            nbytes += len(entry)

        for lane in list(self.lanes):
            positions = self.lanes[lane]
            i = 0
            while i < len(positions):
                pos = positions[i]
                if cursor.is_acked(pos):
                    i += 1
                    continue
                c = self._target(lane)
                if c is None:
                    break
                entry = seg.read_one(pos)
                if entry is not None:
                    give(c, pos, lane, entry)
                    budget -= len(entry)
                i += 1
            if i:
                del positions[:i]
                self.parked -= i
            if not positions:
                del self.lanes[lane]

        more = False
        key_shared = self.keyed
        stop = False
        while not stop and self.next_read <= seg.servable_position:
            if budget <= 0:
                more = True
                break
            if not any(c.permits > 0 for c in self.consumers):
                break
            batch = seg.read(self.next_read, _READ_BATCH, budget)
            if not batch:
                break
            for pos, entry in batch:
                if cursor.is_acked(pos):
                    self.next_read = pos + 1
                    continue
                lane = self._lane_of(entry)
                blocked = lane in self.lanes
                c = None if blocked else self._target(lane)
                if c is None:
                    if key_shared and self.parked < self.max_parked:
                        self.lanes.setdefault(lane, []).append(pos)
                        self.parked += 1
                        self.next_read = pos + 1
                        continue
                    stop = True
                    break
                give(c, pos, lane, entry)
                budget -= len(entry)
                self.next_read = pos + 1
        for c, items in out.items():
            c.sink.deliver(items)
        if out:
            seg.entries_out += sum(len(v) for v in out.values())
            seg.messages_out += msgs
            seg.bytes_out += nbytes
            if self.on_out is not None:
                self.on_out(msgs, nbytes)
        if more:
            self.schedule()
        if seg.seal is not None or seg.corruption is not None:
            for c in list(self.consumers):
                self._check_end(c)

    def _check_end(self, consumer: Consumer) -> None:
        seal = self.segment.seal
        if (
            seal is not None
            and consumer.buckets is not None
            and not consumer.buckets_end_sent
            and self.next_read > seal.last_position
            and not self._parked_for(consumer)
        ):
            consumer.buckets_end_sent = True
            consumer.sink.end_of_buckets(seal.last_position)
        done = self._buckets_done(consumer)
        if done:
            assert seal is not None
            consumer.buckets_done_sent.update(done)
            consumer.sink.buckets_done(seal.last_position, done)
        if seal is not None and not consumer.eos_sent and self.segment.drained(self.cursor):
            consumer.eos_sent = True
            consumer.sink.end_of_segment(seal.last_position)
            return
        corruption = self.segment.corruption
        if (
            corruption is not None
            and not consumer.eos_sent
            and not consumer.corruption_sent
            and not consumer.pending
            and self.next_read >= corruption.position
            and not self._parked_for(consumer)
        ):
            # Everything before the damage was delivered and acknowledged: say why nothing
            # more comes instead of leaving the consumer waiting.
            consumer.corruption_sent = True
            consumer.sink.corrupted(corruption)

    def _buckets_done(self, consumer: Consumer) -> list[int]:
        """The consumer's buckets of a sealed segment, not reported yet, every entry of which
        up to the seal is acknowledged by the subscription: every position was examined
        (``next_read`` is past the seal), none of the bucket is parked for redelivery and none
        is delivered and unacknowledged. Only for bucket owners (keyed dispatch, where lanes
        are buckets); a whole-segment consumer hears ``END_OF_SEGMENT``."""
        seal = self.segment.seal
        if (
            seal is None
            or consumer.buckets is None
            or not self.keyed
            or self.segment.corruption is not None
            or self.next_read <= seal.last_position
        ):
            return []
        unsent = consumer.buckets - consumer.buckets_done_sent
        if not unsent:
            return []
        busy = set(self.lanes)
        for c in self.consumers:
            busy.update(c.pending.values())
        return sorted(b for b in unsent if b not in busy)

    def _parked_for(self, consumer: Consumer) -> bool:
        """Entries parked for redelivery that could still go to ``consumer``."""
        if not self.keyed:
            return bool(self.lanes)
        owned = consumer.buckets or frozenset()
        return any(lane == UNKEYED_LANE or lane in owned for lane in self.lanes)

    # --- stats ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "keyed": self.keyed,
            "ackFloor": self.cursor.ack_floor,
            "backlog": self.segment.backlog(self.cursor),
            "drained": self.segment.drained(self.cursor),
            "parked": self.parked,
            "partiallyAcked": len(self.cursor.partial),
            "consumers": [
                {
                    "name": c.name,
                    "permits": c.permits,
                    "unacked": len(c.pending),
                    **({"buckets": sorted(c.buckets)} if c.buckets is not None else {}),
                }
                for c in self.consumers
            ],
        }
