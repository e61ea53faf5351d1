"""Seal semantics, cursors, redelivery and the three subscription types, against a real broker
server (in-process aiohttp on a loopback port) through the low-level client."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scalable_topics.brokeradmin import AdminError
from scalable_topics.client.segment import (
    ReceivedEntry,
    SegmentAdmin,
    SegmentConsumer,
    SegmentError,
    SegmentProducer,
    SegmentSealedError,
    Successor,
)
from scalable_topics.core import wire
from scalable_topics.core.buckets import bucket_of
from scalable_topics.core.hashing import bucket_hash
from scalable_topics.core.wire import Message
from segment_broker.storage import fsutil
from segment_broker.storage import segment as segment_storage
from segment_broker.testing import running_broker

pytestmark = pytest.mark.integration

NS, TOPIC = "team-a", "events"


async def _produce(url: str, entries: list[list[Message]], name: str = "p") -> list[int]:
    producer = await SegmentProducer.connect(url, NS, TOPIC, 0, name)
    futs = [await producer.send_entry(m) for m in entries]
    acks = await asyncio.gather(*futs)
    await producer.close()
    return [a.position for a in acks]


async def _take_items(consumer: SegmentConsumer, n: int) -> list[ReceivedEntry]:
    items: list[ReceivedEntry] = []
    async with asyncio.timeout(20):
        while len(items) < n:
            item = await consumer.receive()
            assert item is not None
            items.append(item)
    return items


async def _take(consumer: SegmentConsumer, n: int) -> list[int]:
    return [item.position for item in await _take_items(consumer, n)]


async def _sub(admin: SegmentAdmin, name: str) -> dict[str, Any]:
    stats = await admin.stats(NS, TOPIC, 0)
    sub: dict[str, Any] = stats["subscriptions"][name]
    return sub


async def _eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll a broker-side condition until it holds (the broker's stats are the ground truth
    of what was dispatched, so "nothing else was sent" is checked there, not by waiting)."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - a remote condition, observed via HTTP
            await asyncio.sleep(0.01)


def _consumer(sub: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in sub["consumers"] if c["name"] == name)
    return found


async def test_seal_redirects_producers_and_ends_consumers(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Stream"})
        positions = await _produce(rb.url, [[Message(value=b"%d" % i)] for i in range(5)])
        assert positions == [0, 1, 2, 3, 4]

        idle = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "idle")
        successors = [
            Successor(1, 0x0000, 0x7FFF, "http://broker-1:8080"),
            Successor(2, 0x8000, 0xFFFF, "http://broker-2:8080"),
        ]
        seal = await admin.terminate(NS, TOPIC, 0, successors)
        assert seal["lastPosition"] == 4 and seal["sealed"]
        again = await admin.terminate(NS, TOPIC, 0, [])
        assert again["lastPosition"] == 4
        assert again["successors"] == [s.to_json() for s in successors]

        # A connected producer is told proactively; a new one at once.
        async with asyncio.timeout(10):
            failure = await idle.wait_failed()
        assert isinstance(failure, SegmentSealedError)
        assert failure.successors == successors
        late = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "late")
        with pytest.raises(SegmentSealedError) as info:
            await (await late.send_entry([Message(value=b"x")]))
        assert info.value.successors == successors
        assert info.value.last_position == 4

        consumer = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c", permits=10)
        got = await _take(consumer, 5)
        assert got == [0, 1, 2, 3, 4]
        assert not consumer.end_of_segment
        for p in got[:4]:
            consumer.ack(p)

        async def one_left() -> bool:
            return bool((await _sub(admin, "s"))["backlog"] == 1)

        await _eventually(one_left)
        assert not consumer.end_of_segment, "end of segment before everything is acked"
        consumer.ack(4)
        async with asyncio.timeout(10):
            assert await consumer.receive() is None
        assert consumer.last_position == 4
        stats = await admin.stats(NS, TOPIC, 0)
        assert stats["sealed"] and stats["subscriptions"]["s"]["drained"]
        assert stats["subscriptions"]["s"]["backlog"] == 0
        await consumer.close()
        for prod in (idle, late):
            await prod.close()


async def test_sealing_tells_version_5_producers_the_successors_before_the_seal(
    tmp_path: Path,
) -> None:
    """``SEALING`` (protocol v5) names the successors as the seal begins, before ``SEALED``, so
    that producers can connect to them meanwhile; a version-4 peer gets ``SEALED`` only, and a
    seal that fails (here: a directory where the seal marker goes) leaves the segment open."""
    successors = [
        Successor(1, 0x0000, 0x7FFF, "http://broker-1:8080"),
        Successor(2, 0x8000, 0xFFFF, "http://broker-2:8080"),
    ]
    async with (
        running_broker(tmp_path) as rb,
        SegmentAdmin(rb.url) as admin,
        aiohttp.ClientSession() as http,
    ):
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
        heard: list[tuple[list[Successor], bool]] = []
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "v5")
        assert producer.version == wire.PROTOCOL_VERSION >= 5
        producer.on_sealing = lambda s: heard.append((s, producer.failure is None))
        ws_url = rb.url.replace("http", "ws", 1)
        old = await http.ws_connect(f"{ws_url}/ws/v1/produce/{NS}/{TOPIC}/0")
        await old.send_bytes(wire.encode_hello(4, {"producerName": "v4"}))
        assert (await old.receive(timeout=10)).data[0] == wire.FRAME_HELLO_OK

        marker = tmp_path / NS / TOPIC / "0000-ffff-0" / "sealed.json"
        marker.mkdir()
        with pytest.raises(AdminError) as info:
            await admin.terminate(NS, TOPIC, 0, successors)
        assert info.value.code == "StorageError"
        async with asyncio.timeout(10):
            while not heard:  # noqa: ASYNC110 - the frame arrives on the producer's reader
                await asyncio.sleep(0.01)
        assert heard == [(successors, True)]
        ack = await (await producer.send_entry([Message(b"after a failed seal")]))
        assert ack.position == 0, "a seal that failed leaves the segment open"

        marker.rmdir()
        seal = await admin.terminate(NS, TOPIC, 0, successors)
        assert seal["lastPosition"] == 0
        async with asyncio.timeout(10):
            failure = await producer.wait_failed()
        assert isinstance(failure, SegmentSealedError) and failure.successors == successors
        assert heard == [(successors, True), (successors, True)], "announced before SEALED"
        frame = await old.receive(timeout=10)
        assert frame.data[0] == wire.FRAME_SEALED, "a version-4 peer gets no SEALING"
        await old.close()
        await producer.close()

        late = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "late")
        late.on_sealing = lambda s: heard.append((s, False))
        async with asyncio.timeout(10):
            assert isinstance(await late.wait_failed(), SegmentSealedError)
        assert len(heard) == 2, "a sealed segment announces nothing more"
        await late.close()


async def test_successors_announced_ahead_of_the_seal_reach_version_5_producers(
    tmp_path: Path,
) -> None:
    """``POST …/successors``: the controller names the children as soon as they exist, and the
    parent's version-5 producers hear them in a ``SEALING`` frame then, before the seal (a
    version-4 peer does not); a sealed segment announces nothing."""
    successors = [Successor(1, 0x0000, 0x7FFF, "http://broker-1:8080")]
    async with (
        running_broker(tmp_path) as rb,
        SegmentAdmin(rb.url) as admin,
        aiohttp.ClientSession() as http,
    ):
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
        heard: list[list[Successor]] = []
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "v5")
        producer.on_sealing = heard.append
        ws_url = rb.url.replace("http", "ws", 1)
        old = await http.ws_connect(f"{ws_url}/ws/v1/produce/{NS}/{TOPIC}/0")
        await old.send_bytes(wire.encode_hello(4, {"producerName": "v4"}))
        assert (await old.receive(timeout=10)).data[0] == wire.FRAME_HELLO_OK

        told = await admin.announce_successors(NS, TOPIC, 0, successors)
        assert told == {"producersTold": 1}
        async with asyncio.timeout(10):
            while not heard:  # noqa: ASYNC110 - the frame arrives on the producer's reader
                await asyncio.sleep(0.01)
        assert heard == [successors]
        ack = await (await producer.send_entry([Message(b"still open")]))
        assert ack.position == 0, "an announcement seals nothing"
        with pytest.raises(AdminError) as bad:
            await admin._call("POST", f"/{NS}/{TOPIC}/0/successors", {"successors": [{}]})
        assert bad.value.status == 400

        await admin.terminate(NS, TOPIC, 0, successors)
        assert (await old.receive(timeout=10)).data[0] == wire.FRAME_SEALED
        assert await admin.announce_successors(NS, TOPIC, 0, successors) == {"producersTold": 0}
        await old.close()
        await producer.close()


async def test_a_producer_refused_during_a_seal_that_fails_reconnects_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry that arrives while the seal is being written is refused (not stored). If the
    seal then fails (a full disk, injected where the marker is written), its connection is
    closed with GoingAway instead of waiting for a seal that will not come, and the entry sent
    again on a new connection is stored: the segment is still open."""
    writing, release = threading.Event(), threading.Event()
    real_write = fsutil.atomic_write_json

    def full_disk_for_the_seal(path: Path, body: Any) -> None:
        if path.name != "sealed.json":
            real_write(path, body)
            return
        writing.set()
        release.wait(10)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(segment_storage, "atomic_write_json", full_disk_for_the_seal)
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        assert (await (await producer.send_entry([Message(b"0")]))).position == 0
        sealing = asyncio.create_task(admin.terminate(NS, TOPIC, 0, [Successor(1, 0, 0xFFFF)]))
        await asyncio.to_thread(writing.wait, 10)
        refused = await producer.send_entry([Message(b"1")])
        connection = rb.broker.store.get(NS, TOPIC, 0).producers["p"]
        async with asyncio.timeout(10):
            while not connection.refused:  # noqa: ASYNC110 - the broker's side of the frame
                await asyncio.sleep(0.01)
        assert not refused.done(), "an entry arriving during the seal is not acknowledged"
        release.set()
        with pytest.raises(AdminError) as info:
            await sealing
        assert (info.value.status, info.value.code) == (507, "StorageError")
        async with asyncio.timeout(10):
            failure = await producer.wait_failed()
        assert failure.code == "GoingAway" and "seal failed" in str(failure)
        with pytest.raises(SegmentError):
            await refused
        await producer.close()

        again = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        assert again.last_sequence_id == 0, "the refused entry was not stored"
        ack = await (await again.send_entry([Message(b"1")], sequence_id=1))
        assert (ack.position, ack.duplicate) == (1, False)
        stats = await admin.stats(NS, TOPIC, 0)
        assert not stats["sealed"] and stats["lastPosition"] == 1
        await again.close()


async def test_concurrent_terminate_acks_everything_staged_before(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Stream"})
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        futs = [await producer.send_entry([Message(value=b"%d" % i)]) for i in range(200)]
        seal = await admin.terminate(NS, TOPIC, 0, [Successor(1, 0, 0xFFFF, None)])
        results = await asyncio.gather(*futs, return_exceptions=True)
        acked = [r.position for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert acked == list(range(len(acked)))
        assert seal["lastPosition"] == len(acked) - 1
        assert all(isinstance(r, SegmentSealedError) for r in refused)
        if refused:
            err = refused[0]
            assert isinstance(err, SegmentSealedError)
            assert [u.messages()[0].value for u in err.unacked] == [
                b"%d" % i for i in range(len(acked), 200)
            ]
        await producer.close()


async def test_cursor_survives_restart_and_unacked_entries_are_redelivered(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Exclusive"})
        await _produce(rb.url, [[Message(value=b"%d" % i)] for i in range(10)])
        consumer = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c1", permits=100)
        got = await _take(consumer, 10)
        consumer.ack_cumulative(3)
        consumer.ack(6)
        consumer.ack(8)
        await consumer.close()

        second = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c2", permits=100)
        assert await _take(second, 4) == [4, 5, 7, 9]

        async def settled() -> bool:
            sub = await _sub(admin, "s")
            return bool(_consumer(sub, "c2")["unacked"] == 4 and sub["ackFloor"] == 4)

        await _eventually(settled)
        await second.close()
        assert got == list(range(10))

    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        stats = await admin.stats(NS, TOPIC, 0)
        assert stats["subscriptions"]["s"]["ackFloor"] == 4
        assert stats["subscriptions"]["s"]["backlog"] == 4
        consumer = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c3", permits=100)
        items = await _take_items(consumer, 4)
        assert [i.position for i in items] == [4, 5, 7, 9]
        assert all(i.redelivery_count == 0 for i in items)
        await consumer.close()


async def _raw_partial_ack(
    url: str, version: int, partial: dict[int, list[int]]
) -> tuple[list[int], str]:
    """A raw consumer speaking ``version`` that sends one partial ACK once it was delivered
    something: (the frame types received before it, the error code it got back). Its
    connection is closed and it is gone from the subscription."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{url}/ws/v1/consume/{NS}/{TOPIC}/0/s") as ws,
    ):
        await ws.send_bytes(wire.encode_hello(version, {"consumerName": "raw", "permits": 10}))
        assert wire.decode_hello_ok((await ws.receive()).data)[0] == version
        kinds: list[int] = []
        while not kinds or kinds[-1] != wire.FRAME_DELIVER:
            kinds.append((await ws.receive()).data[0])
        await ws.send_bytes(wire.encode_partial_ack(partial))
        error = wire.decode_json_frame((await ws.receive()).data)
        await ws.receive()
        assert ws.close_code == wire.CLOSE_PROTOCOL_ERROR
    async with SegmentAdmin(url) as admin:

        async def detached() -> bool:
            return not (await _sub(admin, "s"))["consumers"]

        await _eventually(detached)
    return kinds, str(error["code"])


async def test_a_partly_acknowledged_entry_is_redelivered_with_its_acked_indexes(
    tmp_path: Path,
) -> None:
    """Protocol v4: a consumer leaving in the middle of an entry acknowledges the messages it
    processed by batch index; the entry's next consumer is told to skip them (ACKED_INDEXES),
    after a broker restart too; an entry whose every message is acknowledged so is acknowledged
    whole, and the record goes once the entry is acknowledged."""
    entries = [
        [Message(value=b"m%d" % i, key=b"k%d" % i) for i in range(3)],
        [Message(value=b"single")],
        [Message(value=b"pair-%d" % i) for i in range(2)],
    ]
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Exclusive"})
        await _produce(rb.url, entries)
        first = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c1", permits=10)
        assert first.version == wire.PROTOCOL_VERSION >= 4
        assert {i.acked for i in await _take_items(first, 3)} == {frozenset()}
        first.ack_partial({0: [0]})
        await first.close()

        second = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c2", permits=10)
        items = await _take_items(second, 3)
        assert [(i.position, i.acked) for i in items] == [
            (0, frozenset({0})),
            (1, frozenset()),
            (2, frozenset()),
        ]
        assert (await _sub(admin, "s"))["partiallyAcked"] == 1
        second.ack_partial({0: [1], 2: [0, 1]})  # every message of entry 2: acknowledged whole
        await second.close()

        async def entry_2_acknowledged() -> bool:
            sub = await _sub(admin, "s")
            return bool(sub["backlog"] == 2 and sub["partiallyAcked"] == 1)

        await _eventually(entry_2_acknowledged)

        # a version 3 peer gets the entry whole (no ACKED_INDEXES) and may not send a partial
        # ack; a version 4 peer may not name a message the entry does not have
        kinds, code = await _raw_partial_ack(rb.url, 3, {0: [2]})
        assert (kinds, code) == ([wire.FRAME_DELIVER], wire.ERR_PROTOCOL)
        kinds, code = await _raw_partial_ack(rb.url, 4, {0: [3]})
        assert (kinds, code) == ([wire.FRAME_ACKED_INDEXES, wire.FRAME_DELIVER], wire.ERR_PROTOCOL)
        assert (await _sub(admin, "s"))["partiallyAcked"] == 1

    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        third = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c3", permits=10)
        items = await _take_items(third, 2)
        assert [(i.position, i.acked) for i in items] == [(0, frozenset({0, 1})), (1, frozenset())]
        third.ack_many([0, 1])

        async def settled() -> bool:
            sub = await _sub(admin, "s")
            return bool(sub["ackFloor"] == 3 and sub["partiallyAcked"] == 0)

        await _eventually(settled)
        await third.close()


async def test_exclusive_subscription_refuses_a_second_consumer(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Exclusive"})
        first = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "a")
        with pytest.raises(SegmentError) as info:
            await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "b")
        assert info.value.code == "ConsumerBusy"
        await first.close()


async def test_redelivery_after_disconnect_goes_to_the_next_consumer(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"q": "Queue"})
        await _produce(rb.url, [[Message(value=b"%d" % i)] for i in range(6)])
        a = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "q", "a", permits=6)
        got_a = await _take(a, 6)
        a.ack(got_a[0])
        b = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "q", "b", permits=10)

        async def a_holds_five() -> bool:
            sub = await _sub(admin, "q")
            names = {c["name"]: c for c in sub["consumers"]}
            return bool("b" in names and names["a"]["unacked"] == 5 and names["b"]["unacked"] == 0)

        await _eventually(a_holds_five)
        await a.close()
        items = await _take_items(b, 5)
        assert [i.position for i in items] == [1, 2, 3, 4, 5]
        assert all(i.redelivery_count == 1 for i in items)
        b.nack([3])
        again = await b.receive()
        assert again is not None and again.position == 3 and again.redelivery_count == 2
        await b.close()


async def test_queue_round_robins_entries_between_consumers(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"q": "Queue"})
        consumers = [
            await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "q", f"c{i}", permits=100)
            for i in range(3)
        ]
        await _produce(rb.url, [[Message(value=b"%d" % i)] for i in range(30)])
        counts: Counter[int] = Counter()
        seen: list[int] = []
        for idx, c in enumerate(consumers):
            got = await _take(c, 10)
            counts[idx] = len(got)
            seen.extend(got)
            c.ack_many(got)
        assert sorted(seen) == list(range(30))
        assert set(counts.values()) == {10}
        with pytest.raises(SegmentError):
            consumers[0].ack_cumulative(5)
            await consumers[0].receive()
        for c in consumers:
            await c.close()


async def test_key_shared_delivers_each_bucket_to_its_owner_in_order(tmp_path: Path) -> None:
    buckets = 4
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(
            NS, TOPIC, 0, 0, 0xFFFF, buckets=buckets, subscriptions={"ks": "KeyShared"}
        )
        keys = [f"user-{i}" for i in range(40)]
        owner_of = {b: ("c01" if b < 2 else "c23") for b in range(buckets)}
        c01 = await SegmentConsumer.connect(
            rb.url, NS, TOPIC, 0, "ks", "c01", buckets=[0, 1], permits=1000
        )
        with pytest.raises(SegmentError) as info:
            await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "ks", "x", buckets=[1, 2])
        assert info.value.code == "BucketConflict"

        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        assert producer.buckets == buckets
        futs = []
        for rnd in range(5):
            for k in keys:
                futs.append(
                    await producer.send_entry([Message(f"{k}:{rnd}".encode(), key=k.encode())])
                )
        # An entry whose keys span buckets is refused (the SDK producer cuts entries per bucket).
        spanning = [
            Message(value=b"a", key=b"user-0"),
            *[Message(value=b"b", key=k.encode()) for k in keys],
        ]
        with pytest.raises(SegmentError) as info:
            await (await producer.send_entry(spanning))
        assert info.value.code == "EntrySpansBuckets"
        await asyncio.gather(*futs)
        await producer.close()

        # Buckets 2 and 3 have no owner yet: their entries wait, c01 gets only its own.
        expected = {
            name: [
                f"{k}:{r}"
                for r in range(5)
                for k in keys
                if owner_of[bucket_of(bucket_hash(k), buckets)] == name
            ]
            for name in ("c01", "c23")
        }
        got01 = await _values(c01, len(expected["c01"]))
        assert got01 == expected["c01"]

        async def others_parked() -> bool:
            sub = await _sub(admin, "ks")
            return bool(_consumer(sub, "c01")["unacked"] == 0 and sub["parked"] > 0)

        await _eventually(others_parked)
        assert c01.receive_nowait(1) == []
        c23 = await SegmentConsumer.connect(
            rb.url, NS, TOPIC, 0, "ks", "c23", buckets=[2, 3], permits=1000
        )
        got23 = await _values(c23, len(expected["c23"]))
        # Parked buckets are drained bucket by bucket: order holds per key, not across keys.
        assert sorted(got23) == sorted(expected["c23"])
        for k in keys:
            mine = [v for v in got23 if v.split(":")[0] == k]
            assert mine == sorted(mine, key=lambda v: int(v.split(":")[1]))
        for c in (c01, c23):
            await c.close()


async def _values(consumer: SegmentConsumer, n: int) -> list[str]:
    out: list[str] = []
    async with asyncio.timeout(20):
        while len(out) < n:
            item = await consumer.receive()
            assert item is not None
            out.extend(m.value.decode() for m in item.messages())
            consumer.ack(item.position)
    return out


async def test_flow_control_stops_at_permits(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Exclusive"})
        await _produce(rb.url, [[Message(value=b"%d" % i)] for i in range(20)])
        consumer = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c", permits=6)

        async def stalled() -> bool:
            c = _consumer(await _sub(admin, "s"), "c")
            return bool(c["permits"] == 0 and c["unacked"] == 6)

        await _eventually(stalled)
        got = await _take(consumer, 20)
        assert got == list(range(20))
        await consumer.close()
