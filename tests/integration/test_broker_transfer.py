"""Ownership transfer between two real brokers (segment_broker.transfer, relayed by
scalable_topics.transferadmin): catch-up copy while the source serves, a fence that keeps
producers connected and acknowledges nothing, the final tail, cursors (ack floor and individual
acks), producers' sequence ids and the seal on the destination, clients held at the destination
until it owns the segment, the moved close frame carrying the new owner's URL, and the source's
copy deleted only on release."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scalable_topics.brokeradmin import AdminError
from scalable_topics.client.segment import SegmentAdmin, SegmentConsumer, SegmentProducer
from scalable_topics.core import wire
from scalable_topics.core.transfer import CLOSE_SEGMENT_MOVED, ERR_SEGMENT_MOVED, moved_to
from scalable_topics.transferadmin import TransferAdmin, copy
from segment_broker.testing import running_broker

pytestmark = pytest.mark.integration

NS, TOPIC, SID = "team-a", "orders", 1


async def _until(check: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - a condition observed over HTTP
            await asyncio.sleep(0.02)


class RawProducer:
    """A produce WebSocket spoken frame by frame, to see exactly what the broker sends."""

    def __init__(self, session: aiohttp.ClientSession, url: str, name: str) -> None:
        self.session, self.url, self.name = session, url, name
        self.acks: list[wire.SendAck] = []
        self.closing: dict[str, Any] | None = None
        self.close_code: int | None = None
        self.hello: dict[str, Any] = {}

    async def open(self) -> None:
        ws_url = self.url.replace("http://", "ws://") + f"/ws/v1/produce/{NS}/{TOPIC}/{SID}"
        self.ws = await self.session.ws_connect(ws_url)
        await self.ws.send_bytes(
            wire.encode_hello(wire.PROTOCOL_VERSION, {"producerName": self.name})
        )
        msg = await self.ws.receive()
        _, self.hello = wire.decode_hello_ok(msg.data)
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = msg.data
            if data[0] == wire.FRAME_SEND_ACK:
                self.acks.extend(wire.decode_send_ack(data))
            elif data[0] == wire.FRAME_ERROR:
                self.closing = wire.decode_json_frame(data)
        self.close_code = self.ws.close_code

    async def send(self, seq: int, value: bytes) -> None:
        entry = wire.encode_entry(self.name, seq, [wire.Message(value=value, key=b"k")])
        await self.ws.send_bytes(wire.encode_send([entry]))


async def test_active_segment_moves_with_log_cursors_sequence_ids_and_moved_close(
    tmp_path: Path,
) -> None:
    async with (
        running_broker(tmp_path / "a") as a,
        running_broker(tmp_path / "b", fence_wait_s=30.0) as b,
        SegmentAdmin(a.url) as admin_a,
        SegmentAdmin(b.url) as admin_b,
        aiohttp.ClientSession() as session,
    ):
        await admin_a.create_segment(
            NS, TOPIC, SID, 0, 0xFFFF, subscriptions={"s": "Exclusive", "q": "Queue"}
        )
        src, dst = (TransferAdmin(x, NS, TOPIC, SID) for x in (admin_a, admin_b))
        raw = RawProducer(session, a.url, "raw")
        await raw.open()
        for seq in range(40):
            await raw.send(seq, b"v%d" % seq)
        await _until(lambda: _acked(raw, 40))

        consumer = await SegmentConsumer.connect(a.url, NS, TOPIC, SID, "s", "c-1", permits=100)
        got = [await consumer.receive() for _ in range(25)]
        assert [e.position for e in got if e is not None] == list(range(25))
        consumer.ack_cumulative(9)
        consumer.ack(20)
        consumer.ack(21)

        async def acks_seen() -> bool:
            snap = await src.snapshot()
            assert snap is not None
            cur = snap["cursors"]["s"]
            return bool(cur["ackFloor"] == 10 and cur["ackedRanges"] == [[20, 22]])

        await _until(acks_seen)

        # catch up while the source keeps serving
        first = await copy(src, dst)
        assert first.entries == 40 and first.last_position == 39
        assert (await admin_b.stats(NS, TOPIC, SID))["writable"] is False
        for seq in range(40, 60):
            await raw.send(seq, b"v%d" % seq)
        await _until(lambda: _acked(raw, 60))
        second = await copy(src, dst)
        assert second.entries == 20 and second.complete

        # a client reaching the destination now is held, not refused
        held = asyncio.create_task(
            SegmentConsumer.connect(b.url, NS, TOPIC, SID, "s", "c-1", permits=100)
        )

        # fence: the producer stays connected, its publishes are ignored (not acknowledged)
        fenced = await src.fence()
        assert fenced["fenceReason"] == "releasing" and fenced["lastPosition"] == 59
        for seq in range(60, 65):
            await raw.send(seq, b"v%d" % seq)

        async def ignored() -> bool:
            snap = await src.snapshot()
            return snap is not None and snap["ignoredEntries"] == 5

        await _until(ignored)
        assert len(raw.acks) == 60 and raw.close_code is None and not raw.ws.closed
        tail = await copy(src, dst)
        assert tail.complete and tail.last_position == 59
        assert not held.done()

        # ownership: the destination admits held clients, the source closes with the URL
        await dst.own()
        async with asyncio.timeout(15):
            moved_consumer = await held
        released = await src.release(b.url)
        assert released is not None and released["released"] is True
        await asyncio.wait_for(raw.reader, 15)
        assert raw.close_code == CLOSE_SEGMENT_MOVED
        assert raw.closing is not None and raw.closing["code"] == ERR_SEGMENT_MOVED
        assert moved_to(raw.closing, raw.close_code) == b.url
        with pytest.raises(AdminError) as gone:
            await admin_a.stats(NS, TOPIC, SID)
        assert gone.value.status == 404
        await dst.state(released["cursors"], None)

        # the destination has every entry at its position, the cursor with its individual acks
        assert moved_consumer.ack_floor == 10
        positions = []
        while len(positions) < 48:
            entry = await moved_consumer.receive()
            assert entry is not None
            positions.append(entry.position)
        assert positions == [p for p in range(10, 60) if p not in (20, 21)]
        await moved_consumer.close()
        await consumer.close()

        # producers' sequence ids came along: the re-sent ignored entries are new, older ones dup
        producer = await SegmentProducer.connect(b.url, NS, TOPIC, SID, "raw")
        assert producer.last_sequence_id == 59
        await producer.close()
        again = RawProducer(session, b.url, "raw")
        await again.open()
        await again.send(59, b"v59")
        for seq in range(60, 65):
            await again.send(seq, b"v%d" % seq)
        await _until(lambda: _acked(again, 6))
        assert again.acks[0].duplicate and again.acks[0].position == 59
        assert [(x.position, x.duplicate) for x in again.acks[1:]] == [
            (p, False) for p in range(60, 65)
        ]
        await again.ws.close()


async def test_sealed_segment_moves_with_its_seal_and_drained_cursor(tmp_path: Path) -> None:
    async with (
        running_broker(tmp_path / "a") as a,
        running_broker(tmp_path / "b") as b,
        SegmentAdmin(a.url) as admin_a,
        SegmentAdmin(b.url) as admin_b,
    ):
        await admin_a.create_segment(NS, TOPIC, SID, 0, 0xFFFF, subscriptions={"s": "Exclusive"})
        producer = await SegmentProducer.connect(a.url, NS, TOPIC, SID, "p")
        for i in range(10):
            await (await producer.send_entry([wire.Message(b"m%d" % i, key=b"k")]))
        await producer.close()
        successors = [{"segmentId": 2, "range": {"start": 0, "end": 0x7FFF}, "brokerUrl": a.url}]
        seal = await admin_a._call(
            "POST", f"/{NS}/{TOPIC}/{SID}/terminate", {"successors": successors}
        )
        src, dst = (TransferAdmin(x, NS, TOPIC, SID) for x in (admin_a, admin_b))
        await src.fence()
        report = await copy(src, dst)
        assert report.complete and report.last_position == 9
        await dst.own()
        released = await src.release(b.url)
        assert released is not None
        await dst.state(released["cursors"], None)
        stats = await admin_b.stats(NS, TOPIC, SID)
        assert stats["sealed"] is True
        assert stats["seal"] == {
            "lastPosition": 9,
            "successors": successors,
            "sealedAt": seal["sealedAt"],
        }
        consumer = await SegmentConsumer.connect(b.url, NS, TOPIC, SID, "s", "c", permits=100)
        for i in range(10):
            entry = await consumer.receive()
            assert entry is not None and entry.position == i
            consumer.ack(i)

        async def drained() -> bool:
            return bool((await admin_b.stats(NS, TOPIC, SID))["subscriptions"]["s"]["drained"])

        await _until(drained)
        await consumer.close()


async def test_fence_survives_restart_and_roll_back_reopens_the_source(tmp_path: Path) -> None:
    data = tmp_path / "a"
    async with running_broker(data) as a, SegmentAdmin(a.url) as admin:
        await admin.create_segment(NS, TOPIC, SID, 0, 0xFFFF, subscriptions={"s": "Exclusive"})
        await TransferAdmin(admin, NS, TOPIC, SID).fence()
    async with (
        running_broker(data, fence_wait_s=0.5) as a,
        SegmentAdmin(a.url) as admin,
        aiohttp.ClientSession() as session,
    ):
        src = TransferAdmin(admin, NS, TOPIC, SID)
        snap = await src.snapshot()
        assert snap is not None and snap["fenceReason"] == "releasing"
        assert snap["writable"] is False
        with pytest.raises(AdminError) as refused:
            await src.own()
        assert refused.value.status == 409
        # roll back: the source takes writes again
        await src.unfence()
        raw = RawProducer(session, a.url, "p")
        await raw.open()
        await raw.send(0, b"x")
        await _until(lambda: _acked(raw, 1))
        assert raw.acks[0].position == 0 and not raw.acks[0].duplicate
        await raw.ws.close()


async def test_release_needs_a_fenced_source_and_copies_refuse_gaps(tmp_path: Path) -> None:
    async with (
        running_broker(tmp_path / "a") as a,
        running_broker(tmp_path / "b") as b,
        SegmentAdmin(a.url) as admin_a,
        SegmentAdmin(b.url) as admin_b,
    ):
        await admin_a.create_segment(NS, TOPIC, SID, 0, 0xFFFF)
        src, dst = (TransferAdmin(x, NS, TOPIC, SID) for x in (admin_a, admin_b))
        with pytest.raises(AdminError) as refused:
            await src.release(b.url)
        assert refused.value.status == 409
        snap = await src.snapshot()
        assert snap is not None
        await dst.incoming(snap)
        entry = wire.encode_entry("p", 0, [wire.Message(value=b"x", key=b"k")])
        from segment_broker.transfer import encode_records

        with pytest.raises(AdminError) as gap:
            await dst.append(encode_records([(3, entry)]))
        assert gap.value.status == 409 and "expects position 0" in gap.value.message


async def _acked(producer: RawProducer, n: int) -> bool:
    return len(producer.acks) >= n


async def test_copy_of_large_entries_passes_the_admin_body_limit(tmp_path: Path) -> None:
    """The copy moves more than the admin API's 1 MiB request bodies: a read of several MiB and
    a single entry larger than 1 MiB both reach the destination intact."""
    async with (
        running_broker(tmp_path / "a") as a,
        running_broker(tmp_path / "b") as b,
        SegmentAdmin(a.url) as admin_a,
        SegmentAdmin(b.url) as admin_b,
    ):
        await admin_a.create_segment(NS, TOPIC, SID, 0, 0xFFFF, subscriptions={"s": "Exclusive"})
        producer = await SegmentProducer.connect(a.url, NS, TOPIC, SID, "big")
        sizes = [700_000, 700_000, 700_000, 2_500_000]
        for i, size in enumerate(sizes):
            await (await producer.send_entry([wire.Message(bytes([i]) * size)]))
        await producer.close()
        src, dst = (TransferAdmin(x, NS, TOPIC, SID) for x in (admin_a, admin_b))
        report = await copy(src, dst)
        assert report.complete and report.entries == len(sizes)
        assert report.bytes > sum(sizes)
        await dst.own()
        consumer = await SegmentConsumer.connect(b.url, NS, TOPIC, SID, "s", "c", permits=10)
        for i, size in enumerate(sizes):
            entry = await consumer.receive()
            assert entry is not None and entry.position == i
            (message,) = entry.messages()
            assert message.value == bytes([i]) * size
        await consumer.close()
