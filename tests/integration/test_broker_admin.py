"""Admin HTTP of the segment broker: idempotent create, errors, auth, deletes, metrics."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scalable_topics.client.segment import (
    AdminError,
    ConnectionClosedError,
    SegmentAdmin,
    SegmentConsumer,
    SegmentError,
    SegmentNotFoundError,
    SegmentProducer,
)
from scalable_topics.core.hashing import segment_hash
from scalable_topics.core.wire import Message
from segment_broker.load import LoadTracker, SegmentRates
from segment_broker.metrics import BrokerMetrics
from segment_broker.testing import running_broker

pytestmark = pytest.mark.integration

NS, TOPIC = "ops", "payments"


async def test_create_is_idempotent_and_conflicts_are_explicit(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        first = await admin.create_segment(
            NS, TOPIC, 3, 0x8000, 0xBFFF, buckets=2, subscriptions={"a": "Stream"}
        )
        assert first["descriptor"] == "8000-bfff-3"
        assert (tmp_path / NS / TOPIC / "8000-bfff-3" / "segment.json").exists()
        again = await admin.create_segment(
            NS, TOPIC, 3, 0x8000, 0xBFFF, buckets=2, subscriptions={"a": "Stream", "b": "Queue"}
        )
        assert set(again["subscriptions"]) == {"a", "b"}
        with pytest.raises(AdminError) as info:
            await admin.create_segment(NS, TOPIC, 3, 0x8000, 0xFFFF, buckets=2)
        assert (info.value.status, info.value.code) == (409, "Conflict")
        with pytest.raises(AdminError) as info:
            await admin.create_segment(
                NS, TOPIC, 3, 0x8000, 0xBFFF, buckets=2, subscriptions={"a": "Queue"}
            )
        assert info.value.status == 400
        for bad in ((NS, "Bad_Topic", 1, 0, 5), (NS, TOPIC, 4, 9, 3), ("../x", TOPIC, 4, 0, 1)):
            with pytest.raises(AdminError) as info:
                await admin.create_segment(*bad)
            assert info.value.status in (400, 404)
        with pytest.raises(AdminError) as info:
            await admin.stats(NS, TOPIC, 99)
        assert (info.value.status, info.value.code) == (404, "SegmentNotFound")
        listed = await admin.list_segments()
        assert [s["descriptor"] for s in listed] == ["8000-bfff-3"]

        async with aiohttp.ClientSession() as s:
            async with s.put(f"{rb.url}/admin/v1/segments/{NS}/{TOPIC}/7", data=b"{nope") as r:
                assert r.status == 400
                assert (await r.json())["error"]["code"] == "BadRequest"
            async with s.get(f"{rb.url}/healthz") as r:
                assert r.status == 200
            async with s.get(f"{rb.url}/readyz") as r:
                assert r.status == 200


async def test_bearer_token_guards_admin_routes(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    async with running_broker(tmp_path / "data", admin_token_file=str(token_file)) as rb:
        async with SegmentAdmin(rb.url) as anonymous:
            with pytest.raises(AdminError) as info:
                await anonymous.list_segments()
            assert info.value.status == 401
        async with SegmentAdmin(rb.url, token="wrong") as wrong:
            with pytest.raises(AdminError):
                await wrong.list_segments()
        async with SegmentAdmin(rb.url, token="s3cret") as admin:
            assert await admin.list_segments() == []
        async with aiohttp.ClientSession() as s, s.get(f"{rb.url}/metrics") as r:
            assert r.status == 200, "metrics and probes stay open"


async def test_deleting_a_segment_closes_its_connections_and_data(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Queue"})
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        await (await producer.send_entry([Message(b"v")]))
        consumer = await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "c")
        assert await admin.delete_subscription(NS, TOPIC, 0, "s")
        with pytest.raises(SegmentError):
            async with asyncio.timeout(10):
                while True:
                    assert await consumer.receive() is not None
        assert not await admin.delete_subscription(NS, TOPIC, 0, "s")
        assert await admin.delete_segment(NS, TOPIC, 0)
        async with asyncio.timeout(10):
            failure = await producer.wait_failed()
        assert isinstance(failure, ConnectionClosedError)
        assert failure.code == "SegmentDeleted"
        assert not (tmp_path / NS / TOPIC / "0000-ffff-0").exists()
        assert not await admin.delete_segment(NS, TOPIC, 0)
        with pytest.raises(SegmentNotFoundError):
            await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        await producer.close()
        await consumer.close()


async def test_metrics_expose_backlog_fsync_and_counters(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 5, 0, 0xFFFF, subscriptions={"s": "Stream"})
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 5, "p")
        futs = [await producer.send_entry([Message(b"x" * 10)] * 3) for _ in range(4)]
        await asyncio.gather(*futs)
        await producer.close()
        async with aiohttp.ClientSession() as s, s.get(f"{rb.url}/metrics") as r:
            text = await r.text()
        samples = {
            (smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text)
            for smp in fam.samples
        }
        seg = (("namespace", NS), ("segment", "5"), ("topic", TOPIC))

        def value(name: str, *extra: tuple[str, str]) -> float:
            return samples[(name, tuple(sorted(seg + extra)))]

        assert value("segment_broker_backlog_entries", ("subscription", "s")) == 4
        assert value("segment_broker_produced_entries_total") == 4
        assert value("segment_broker_produced_messages_total") == 12
        assert value("segment_broker_entries_in_flight") == 0
        assert samples[("segment_broker_fsync_seconds_count", ())] >= 1

        def stage_count(stage: str) -> float:
            return samples[("segment_broker_produce_stage_seconds_count", (("stage", stage),))]

        chunks = stage_count("stage")
        assert 1 <= chunks <= 4
        assert stage_count("write") == stage_count("sync") == stage_count("visible") == chunks
        assert 1 <= stage_count("frame") <= 4
        assert 1 <= stage_count("ack") <= 4
        assert samples[("segment_broker_torn_tail_truncations_total", ())] == 0
        stats = await admin.stats(NS, TOPIC, 5)
        assert stats["counters"]["messagesIn"] == 12


async def test_interval_fsync_mode_acknowledges_and_recovers(tmp_path: Path) -> None:
    async with running_broker(tmp_path, fsync="interval", fsync_interval_ms=5) as rb:
        async with SegmentAdmin(rb.url) as admin:
            await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Stream"})
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        acks = await asyncio.gather(
            *[await producer.send_entry([Message(b"v")]) for _ in range(20)]
        )
        assert [a.position for a in acks] == list(range(20))
        await producer.close()
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        assert (await admin.stats(NS, TOPIC, 0))["lastPosition"] == 19


class _Reports:
    def __init__(self) -> None:
        self.rates: dict[int, SegmentRates] = {}

    async def write(self, namespace: str, topic: str, segment_id: int, rates: SegmentRates) -> None:
        self.rates[segment_id] = rates


async def test_load_tracker_sees_durable_and_dispatched_entries(tmp_path: Path) -> None:
    metrics = BrokerMetrics()
    reports = _Reports()
    tracker = LoadTracker(reports, None, registry=metrics.registry)
    async with running_broker(tmp_path / "d", metrics=metrics, tracker=tracker) as rb:
        async with SegmentAdmin(rb.url) as admin:
            await admin.create_segment(NS, TOPIC, 1, 0x8000, 0xFFFF, subscriptions={"s": "Stream"})
        key = next(k for k in (f"k{i}".encode() for i in range(100)) if segment_hash(k) >= 0x8000)
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 1, "p")
        futs = [await producer.send_entry([Message(b"x" * 10, key=key)] * 5) for _ in range(4)]
        await asyncio.gather(*futs)
        await producer.close()
        consumer = await SegmentConsumer.connect(rb.url, NS, TOPIC, 1, "s", "c")
        for _ in range(4):
            item = await consumer.receive()
            assert item is not None
        await consumer.close()
        (record,) = tracker.tick(tracker.clock() + 1.0)
        assert (record.segment_id, record.range_start, record.range_end) == (1, 0x8000, 0xFFFF)
        assert record.descriptor == "8000-ffff-1"
        assert record.messages_in == 20
        assert sum(record.key_hist) == 20
        assert record.rates.msg_rate_out > 0
        async with SegmentAdmin(rb.url) as admin:
            await admin.delete_segment(NS, TOPIC, 1)
        assert len(tracker) == 0


async def test_a_new_connection_fences_the_old_one_with_the_same_producer_name(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
        old = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "same")
        assert (await (await old.send_entry([Message(b"1")]))).position == 0
        new = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "same")
        async with asyncio.timeout(10):
            failure = await old.wait_failed()
        assert failure.code == "ProducerFenced"
        ack = await (await new.send_entry([Message(b"2")]))
        assert (ack.sequence_id, ack.position) == (1, 1)
        await old.close()
        await new.close()


async def test_a_storage_failure_is_reported_and_the_broker_keeps_serving(tmp_path: Path) -> None:
    """A segment directory that cannot be created (here: a file where the topic's directory
    belongs; a full disk takes the same path with 507) is an explicit StorageError for that
    request, nothing half-made is hosted, and every other segment is served."""
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
        (tmp_path / NS).mkdir(exist_ok=True)
        (tmp_path / NS / "broken").write_text("not a directory")
        with pytest.raises(AdminError) as info:
            await admin.create_segment(NS, "broken", 0, 0, 0xFFFF)
        assert (info.value.status, info.value.code) == (500, "StorageError")
        assert "Not a directory" in info.value.message
        assert all(s["topic"] != "broken" for s in await admin.list_segments())
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        assert (await (await producer.send_entry([Message(b"still served")]))).position == 0
        await producer.close()


async def test_listing_one_topics_segments_uses_the_filter_and_follows_deletes(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        for ns, topic, sid in ((NS, "t", 0), (NS, "t", 1), (NS, "t2", 0), ("other", "t", 0)):
            await admin.create_segment(ns, topic, sid, 0, 0xFFFF)
        assert len(await admin.list_segments()) == 4
        mine = await admin.list_segments(NS, "t")
        assert [(s["namespace"], s["topic"], s["segmentId"]) for s in mine] == [
            (NS, "t", 0),
            (NS, "t", 1),
        ]
        assert await admin.list_segments(NS, "absent") == []
        assert await admin.delete_segment(NS, "t", 0)
        assert [s["segmentId"] for s in await admin.list_segments(NS, "t")] == [1]
        assert await admin.delete_segment(NS, "t", 1)
        assert await admin.list_segments(NS, "t") == []
        url = f"{rb.url}/admin/v1/segments?namespace={NS}"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "BadRequest"


async def test_an_ack_is_persisted_by_the_next_housekeeping_round_while_the_broker_runs(
    tmp_path: Path,
) -> None:
    """Cursors are persisted in the background by the store's housekeeping rounds (not by a
    task per segment): an ack reaches the cursor file while the broker runs, without a close."""
    async with running_broker(tmp_path, cursor_flush_ms=20) as rb, SegmentAdmin(rb.url) as admin:
        for sid in range(20):
            await admin.create_segment(NS, TOPIC, sid, 0, 0xFFFF, subscriptions={"s": "Stream"})
        producer = await SegmentProducer.connect(rb.url, NS, TOPIC, 7, "p")
        for _ in range(3):
            await (await producer.send_entry([Message(b"v")]))
        consumer = await SegmentConsumer.connect(rb.url, NS, TOPIC, 7, "s", "c")
        received = [await consumer.receive() for _ in range(3)]
        assert received[-1] is not None
        consumer.ack_cumulative(received[-1].position)
        cursor_file = next((tmp_path / NS / TOPIC).glob("*-7/cursors/s.json"))
        async with asyncio.timeout(10):
            while json.loads(cursor_file.read_text())["ackFloor"] != 3:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await producer.close()
        await consumer.close()


async def test_event_loop_lag_and_gc_pauses_are_measured(tmp_path: Path) -> None:
    """The stalls no produce stage shows: a blocked event loop shows in the lag histogram and
    a full collection in the GC pause histogram of generation 2."""
    metrics = BrokerMetrics()
    async with running_broker(tmp_path, metrics=metrics):

        def count(name: str, labels: dict[str, str] | None = None) -> float:
            value = metrics.registry.get_sample_value(f"{name}_count", labels or {})
            return value or 0.0

        def over_50ms() -> float:
            value = metrics.registry.get_sample_value(
                "segment_broker_event_loop_lag_seconds_bucket", {"le": "0.05"}
            )
            return count("segment_broker_event_loop_lag_seconds") - (value or 0.0)

        before = count("segment_broker_gc_pause_seconds", {"generation": "2"})
        gc.collect()
        assert count("segment_broker_gc_pause_seconds", {"generation": "2"}) == before + 1
        async with asyncio.timeout(10):
            while count("segment_broker_event_loop_lag_seconds") == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        stalled = over_50ms()
        time.sleep(0.2)  # noqa: ASYNC251 - a blocked event loop, on purpose
        async with asyncio.timeout(10):
            while over_50ms() == stalled:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
