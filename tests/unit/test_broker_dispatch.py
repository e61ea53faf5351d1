"""Dispatcher properties under random consumer behaviour (attach, detach, permits, acks, nacks)
over a real segment: no entry is held by two consumers at once, keyed entries (KeyShared, or a
Queue subscription whose consumers name buckets) only reach their bucket's owner and each bucket
is delivered in position order within a consumer, and once everyone behaves every entry is
acknowledged. A Queue subscription is keyed or round-robin as its consumers are, never both."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalable_topics.core import wire
from scalable_topics.core.subscriptions import BrokerSubscriptionType
from scalable_topics.core.wire import Message
from segment_broker.dispatch import Consumer, Dispatcher, DispatchError
from segment_broker.storage.cursor import Cursor
from segment_broker.storage.log import Corruption
from segment_broker.storage.segment import Segment, SegmentMeta, StorageSettings

BUCKETS = 4
ENTRIES = 120


class Sink:
    def __init__(self) -> None:
        self.items: list[tuple[int, int, Any]] = []
        self.eos: int | None = None
        self.buckets_end: int | None = None
        self.done: list[int] = []
        self.done_at: list[int] = []

    def deliver(self, items: list[tuple[int, int, Any]]) -> None:
        self.items.extend(items)

    def end_of_segment(self, last_position: int) -> None:
        self.eos = last_position

    def end_of_buckets(self, last_position: int) -> None:
        assert self.buckets_end is None, "told once"
        self.buckets_end = last_position

    def buckets_done(self, last_position: int, buckets: list[int]) -> None:
        assert not set(buckets) & set(self.done), "each bucket told once"
        self.done.extend(buckets)
        self.done_at.append(last_position)

    def corrupted(self, corruption: Corruption) -> None:
        raise AssertionError(f"the segment is not corrupted: {corruption}")


def _segment(sealed: bool) -> Iterator[Segment]:
    async def build(path: Path, pool: ThreadPoolExecutor) -> Segment:
        meta = SegmentMeta("ns", "t", 0, 0, 0xFFFF, BUCKETS, 0.0)
        Segment.create_blocking(path, meta, {})
        seg = Segment(path, meta, StorageSettings(cache_bytes=1 << 20), pool)
        await seg.open()
        for i in range(ENTRIES):
            key = None if i % 7 == 0 else f"key-{i % 12}".encode()
            e = wire.encode_entry("p", i, [Message(b"%d" % i, key=key)])
            seg.append(e, wire.decode_entry_header(e))
        async with asyncio.timeout(10):
            while seg.visible_position < ENTRIES - 1:
                await seg.wait_flushed()
        if sealed:
            await seg.terminate([])
        await seg.close()
        return seg

    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(2) as pool:
        yield asyncio.run(build(Path(d) / "seg", pool))


@pytest.fixture(scope="module")
def segment() -> Iterator[Segment]:
    """120 durable entries: mostly single-key entries over 12 keys, every 7th unkeyed."""
    yield from _segment(sealed=False)


@pytest.fixture(scope="module")
def sealed_segment() -> Iterator[Segment]:
    """The same entries, sealed after the last one."""
    yield from _segment(sealed=True)


def _bucket(seg: Segment, pos: int) -> int:
    entry = seg.read_one(pos)
    assert entry is not None
    hb = wire.entry_bucket_hash(entry)
    return -1 if hb is None else wire.bucket_of(hb, BUCKETS)


ops = st.lists(
    st.tuples(
        st.sampled_from(["attach", "detach", "flow", "ack", "nack", "cumulative"]),
        st.integers(0, BUCKETS - 1),
        st.integers(1, 15),
    ),
    max_size=60,
)


MODES = [
    (BrokerSubscriptionType.EXCLUSIVE, False),
    (BrokerSubscriptionType.EXCLUSIVE, True),
    (BrokerSubscriptionType.QUEUE, False),
    (BrokerSubscriptionType.QUEUE, True),
    (BrokerSubscriptionType.KEY_SHARED, True),
]


@pytest.mark.parametrize(("sub_type", "keyed"), MODES)
@settings(max_examples=60, deadline=None)
@given(operations=ops)
def test_dispatch_invariants(
    segment: Segment,
    sub_type: BrokerSubscriptionType,
    keyed: bool,
    operations: list[tuple[str, int, int]],
) -> None:
    asyncio.run(_scenario(segment, sub_type, keyed, operations))


async def _scenario(
    seg: Segment,
    sub_type: BrokerSubscriptionType,
    keyed: bool,
    operations: list[tuple[str, int, int]],
) -> None:
    cursor = Cursor(name="s", type=sub_type)
    disp = Dispatcher(seg, cursor, max_parked=50)
    ordered = keyed or sub_type is BrokerSubscriptionType.EXCLUSIVE

    def buckets(idx: int) -> list[int] | None:
        return [idx] if keyed else None

    whole = sub_type is BrokerSubscriptionType.EXCLUSIVE and not keyed

    live: dict[int, tuple[Consumer, Sink]] = {}
    acked: set[int] = set()

    def check() -> None:
        holders: dict[int, int] = {}
        for idx, (c, sink) in live.items():
            for pos in c.pending:
                assert pos not in holders, f"{pos} held by {holders[pos]} and {idx}"
                holders[pos] = idx
            last: dict[int, int] = {}
            seen: set[int] = set()
            for pos, _, _ in sink.items:
                b = _bucket(seg, pos)
                if keyed and b >= 0:
                    assert c.buckets is not None and b in c.buckets
                if ordered and pos not in seen and not (keyed and b < 0):
                    # What a consumer gets for the first time (new, parked, or inherited from
                    # a detached consumer) arrives in position order per bucket; only its own
                    # nacked entries come back out of order. Unkeyed entries of a keyed
                    # subscription go round-robin: no order (an inherited one may come late).
                    lane = b if keyed else 0
                    assert pos > last.get(lane, -1), f"bucket {lane} out of order at {pos}"
                    last[lane] = pos
                seen.add(pos)

    for op, idx, n in operations:
        entry = live.get(idx)
        if op == "attach" and entry is None:
            sink = Sink()
            try:
                c = disp.attach(f"c{idx}", buckets(idx), sink)
            except DispatchError:
                assert sub_type is BrokerSubscriptionType.EXCLUSIVE and live
                continue
            live[idx] = (c, sink)
        elif entry is None:
            continue
        elif op == "detach":
            disp.detach(entry[0])
            del live[idx]
        elif op == "flow":
            disp.flow(entry[0], n)
        elif op == "ack":
            chosen = list(entry[0].pending)[:n]
            if chosen:
                disp.ack(entry[0], chosen, cumulative=False)
                acked.update(chosen)
        elif op == "cumulative" and whole:
            chosen = sorted(entry[0].pending)[: n // 3 + 1]
            if chosen:
                disp.ack(entry[0], [chosen[-1]], cumulative=True)
                acked.update(range(chosen[-1] + 1))
                assert all(p > chosen[-1] for p in entry[0].pending)
        elif op == "nack":
            chosen = list(entry[0].pending)[:n]
            if chosen:
                disp.nack(entry[0], chosen)
        await asyncio.sleep(0)
        check()

    # Everyone behaves from now on: every bucket owned, plenty of permits, ack all.
    for c, _ in list(live.values()):
        disp.detach(c)
    live.clear()
    owners = [0] if whole else list(range(BUCKETS))
    for idx in owners:
        sink = Sink()
        live[idx] = (disp.attach(f"final{idx}", buckets(idx), sink), sink)
        disp.flow(live[idx][0], 10_000)
    async with asyncio.timeout(10):
        while cursor.ack_floor < ENTRIES:
            await asyncio.sleep(0)
            check()
            for c, _ in live.values():
                if c.pending:
                    disp.ack(c, list(c.pending), cumulative=False)
    assert disp.parked == 0 and not disp.lanes


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_queue_is_keyed_or_round_robin_as_its_consumers_are(segment: Segment) -> None:
    disp = Dispatcher(segment, Cursor(name="q", type=BrokerSubscriptionType.QUEUE))
    keyed = disp.attach("k", [0, 1], Sink())
    assert disp.keyed
    with pytest.raises(DispatchError) as info:
        disp.attach("rr", None, Sink())
    assert info.value.code == "BucketConflict"
    with pytest.raises(DispatchError) as info:
        disp.attach("k2", [1, 2], Sink())
    assert info.value.code == "BucketConflict"
    disp.detach(keyed)
    rr = disp.attach("rr", None, Sink())
    assert not disp.keyed and rr.buckets is None
    with pytest.raises(DispatchError) as info:
        disp.attach("k", [0], Sink())
    assert info.value.code == "BucketConflict"
    assert disp.stats()["keyed"] is False


async def test_switching_kind_sorts_parked_entries_into_bucket_lanes(segment: Segment) -> None:
    """Entries a round-robin consumer held unacknowledged go, once the subscription turns
    keyed, only to their bucket's owner, first and in position order."""
    disp = Dispatcher(segment, Cursor(name="q", type=BrokerSubscriptionType.QUEUE))
    rr_sink = Sink()
    rr = disp.attach("rr", None, rr_sink)
    disp.flow(rr, 40)
    await _settle()
    held = [pos for pos, _, _ in rr_sink.items]
    assert held == list(range(40))
    disp.detach(rr)
    assert disp.parked == 40 and set(disp.lanes) == {0}
    sinks = {b: Sink() for b in range(BUCKETS)}
    for b, sink in sinks.items():
        disp.flow(disp.attach(f"k{b}", [b], sink), 200)
    assert disp.keyed
    await _settle()
    unkeyed = []
    for b, sink in sinks.items():
        positions = [pos for pos, _, _ in sink.items]
        for pos in positions:
            bucket = _bucket(segment, pos)
            assert bucket in (b, -1)
        mine = [pos for pos in positions if _bucket(segment, pos) == b]
        assert mine == sorted(mine), f"bucket {b} out of order"
        redelivered = [pos for pos, count, _ in sink.items if count and _bucket(segment, pos) == b]
        assert redelivered == [pos for pos in held if _bucket(segment, pos) == b]
        unkeyed += [pos for pos in positions if _bucket(segment, pos) == -1]
    assert sorted(unkeyed) == [pos for pos in range(ENTRIES) if pos % 7 == 0]
    assert sum(len(s.items) for s in sinks.values()) == ENTRIES


async def test_a_bucket_changes_owner_only_once_the_owner_let_go(segment: Segment) -> None:
    disp = Dispatcher(segment, Cursor(name="q", type=BrokerSubscriptionType.QUEUE))
    first_sink = Sink()
    first = disp.attach("first", [0, 1, 2, 3], first_sink)
    disp.flow(first, 30)
    await _settle()
    taken = [pos for pos, _, _ in first_sink.items]
    disp.ack(first, taken[:10], cumulative=False)
    with pytest.raises(DispatchError) as info:
        disp.attach("second", [3], Sink())
    assert info.value.code == "BucketConflict"
    disp.detach(first)
    second_sink = Sink()
    second = disp.attach("second", [3], second_sink)
    disp.flow(second, 200)
    await _settle()
    got = [(pos, count) for pos, count, _ in second_sink.items if _bucket(segment, pos) == 3]
    inherited = [pos for pos in taken[10:] if _bucket(segment, pos) == 3]
    assert [pos for pos, _ in got[: len(inherited)]] == inherited
    assert all(count == 1 for _, count in got[: len(inherited)])
    positions = [pos for pos, _ in got]
    assert positions == sorted(positions)
    assert set(positions) == {
        pos for pos in range(ENTRIES) if _bucket(segment, pos) == 3 and pos not in taken[:10]
    }


async def test_an_exclusive_subscription_is_shared_by_bucket_owners_or_held_whole(
    segment: Segment,
) -> None:
    """Protocol v2 (PIP-486): stream consumers naming buckets share an Exclusive subscription,
    each getting only its buckets, in order, with individual acks; a whole-segment consumer
    and bucket owners never attach at once."""
    disp = Dispatcher(segment, Cursor(name="s", type=BrokerSubscriptionType.EXCLUSIVE))
    whole = disp.attach("whole", None, Sink())
    with pytest.raises(DispatchError) as info:
        disp.attach("b", [0], Sink())
    assert info.value.code == "ConsumerBusy"
    disp.detach(whole)
    sinks = {b: Sink() for b in range(BUCKETS)}
    owners = {b: disp.attach(f"k{b}", [b], sink) for b, sink in sinks.items()}
    assert disp.keyed
    with pytest.raises(DispatchError) as info:
        disp.attach("whole", None, Sink())
    assert info.value.code == "ConsumerBusy"
    with pytest.raises(DispatchError) as info:
        disp.attach("again", [2], Sink())
    assert info.value.code == "BucketConflict"
    for consumer in owners.values():
        disp.flow(consumer, 200)
    await _settle()
    for b, sink in sinks.items():
        keyed = [pos for pos, _, _ in sink.items if _bucket(segment, pos) == b]
        assert keyed == sorted(keyed) and keyed
        assert all(_bucket(segment, pos) in (b, -1) for pos, _, _ in sink.items)
    with pytest.raises(DispatchError):
        disp.ack(owners[0], [sinks[0].items[0][0]], cumulative=True)
    disp.ack(owners[0], [pos for pos, _, _ in sinks[0].items], cumulative=False)
    assert sum(len(s.items) for s in sinks.values()) == ENTRIES
    for consumer in owners.values():
        disp.detach(consumer)
    assert not disp.keyed or not disp.consumers
    again = disp.attach("whole", None, Sink())
    assert not disp.keyed and again.buckets is None


async def test_a_bucket_owner_hears_when_each_bucket_of_a_sealed_segment_is_acknowledged(
    sealed_segment: Segment,
) -> None:
    """Protocol v3: ``BUCKETS_DONE`` names a bucket once every entry of it up to the seal is
    acknowledged by the subscription - per bucket, while other buckets still have backlog."""
    seg = sealed_segment
    assert seg.seal is not None and seg.seal.last_position == ENTRIES - 1
    disp = Dispatcher(seg, Cursor(name="s", type=BrokerSubscriptionType.EXCLUSIVE))
    fast, slow = Sink(), Sink()
    a = disp.attach("a", [0, 1], fast)
    b = disp.attach("b", [2, 3], slow)
    disp.flow(a, 500)
    disp.flow(b, 500)
    await _settle()
    assert fast.items and slow.items and fast.done == [] and slow.done == []
    by_bucket: dict[int, list[int]] = {}
    for pos, _, _ in fast.items:
        by_bucket.setdefault(_bucket(seg, pos), []).append(pos)
    # everything of bucket 0 but its last entry: not done
    disp.ack(a, by_bucket[0][:-1], cumulative=False)
    await _settle()
    assert fast.done == []
    disp.ack(a, by_bucket[0][-1:], cumulative=False)
    await _settle()
    assert fast.done == [0] and fast.done_at == [ENTRIES - 1]
    # a NACKed entry of bucket 1 goes back to its lane: not done until delivered and acked
    disp.nack(a, by_bucket[1][-1:])
    disp.ack(a, by_bucket[1][:-1], cumulative=False)
    await _settle()
    assert fast.done == [0]
    assert [pos for pos, _, _ in fast.items].count(by_bucket[1][-1]) == 2  # redelivered
    disp.ack(a, by_bucket[1][-1:], cumulative=False)
    await _settle()
    assert fast.done == [0, 1]
    assert slow.done == [] and fast.eos is None  # buckets 2 and 3 still have backlog
    disp.ack(b, [pos for pos, _, _ in slow.items], cumulative=False)
    unkeyed = [pos for pos, _, _ in fast.items if _bucket(seg, pos) == -1]
    disp.ack(a, unkeyed, cumulative=False)
    await _settle()
    assert sorted(slow.done) == [2, 3]
    assert fast.eos == slow.eos == ENTRIES - 1
    # a consumer attaching to a bucket already done hears it at once
    disp.detach(b)
    late = Sink()
    disp.attach("c", [2], late)
    assert late.done == [2]
