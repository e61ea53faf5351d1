"""Corruption in a real broker process (issue 11, part 2): one flipped bit in a segment's log
quarantines that segment, loudly, and nothing else.

After a restart the damaged segment keeps its bytes, refuses appends with the documented
``SegmentCorrupted`` error, serves the positions before the damage and then tells its consumer
with an ``ERROR`` frame instead of leaving it waiting; the other segment produces and consumes
as usual. Only the admin truncate call, naming the segment, lifts the quarantine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scalable_topics.client.segment import (
    AdminError,
    SegmentAdmin,
    SegmentConsumer,
    SegmentCorruptedError,
    SegmentProducer,
)
from scalable_topics.core import wire
from scalable_topics.core.wire import Message, decode_entry
from segment_broker.storage.log import RECORD_HEADER_SIZE, scan_records
from segment_broker.testing import BrokerProcess

from .conftest import metric_samples

pytestmark = pytest.mark.integration

NS, TOPIC = "damage", "orders"
BAD = 150
"""The position whose record gets a flipped bit (of 300 in segment 0)."""


async def _produce(url: str, segment_id: int, values: list[bytes]) -> list[int]:
    producer = await SegmentProducer.connect(url, NS, TOPIC, segment_id, "p")
    futures = [await producer.send_entry([Message(value=v)]) for v in values]
    acks = await asyncio.gather(*futures)
    await producer.close()
    return [a.position for a in acks]


async def _consume(url: str, segment_id: int, count: int) -> list[tuple[int, bytes]]:
    """The first ``count`` entries of subscription ``audit`` as ``(position, value)``; acks
    them cumulatively."""
    out: list[tuple[int, bytes]] = []
    async with await SegmentConsumer.connect(
        url, NS, TOPIC, segment_id, "audit", "reader", permits=1000
    ) as consumer:
        async with asyncio.timeout(30):
            while len(out) < count:
                item = await consumer.receive()
                assert item is not None
                out.append((item.position, decode_entry(item.entry)[1][0].value))
        consumer.ack_cumulative(out[-1][0])
    return out


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return await resp.json()


def _values(n: int, start: int = 0) -> list[bytes]:
    return [b"v%d|" % i + b"x" * 100 for i in range(start, start + n)]


@pytest.mark.parametrize("stop", ["terminate", "kill"])
async def test_a_flipped_bit_quarantines_its_segment_and_the_broker_serves_the_others(
    tmp_path: Path, stop: str
) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data)
    broker.start()
    try:
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            for sid, (start, end) in enumerate(((0, 0x7FFF), (0x8000, 0xFFFF))):
                await admin.create_segment(
                    NS, TOPIC, sid, start, end, subscriptions={"audit": "Exclusive"}
                )
        assert await _produce(broker.url, 0, _values(300)) == list(range(300))
        assert await _produce(broker.url, 1, _values(20)) == list(range(20))
        # A clean stop, or a crash after everything was acknowledged (then the damage must be
        # told from a torn tail by the intact records after it).
        broker.terminate() if stop == "terminate" else broker.kill()

        (log_file,) = (data / NS / TOPIC / "0000-7fff-0").glob("log-*.log")
        offsets = {pos: off for pos, off, _ in scan_records(log_file.read_bytes())}
        raw = bytearray(log_file.read_bytes())
        raw[offsets[BAD] + RECORD_HEADER_SIZE + 40] ^= 0x10
        log_file.write_bytes(bytes(raw))
        damaged = bytes(raw)

        broker.start()
        await broker.wait_ready()
        name = f"{NS}/{TOPIC}/0000-7fff-0"

        # Loud: readiness lists it, the stats carry it, metrics count it, an ERROR is logged.
        ready = await _get(broker.url + "/readyz")
        assert ready["status"] == "ready" and ready["segments"] == 2
        assert ready["corrupted"][name]["position"] == BAD
        assert ready["corrupted"][name]["reason"] == (
            "checksum mismatch after a clean shutdown"
            if stop == "terminate"
            else "checksum mismatch; intact records follow it"
        )
        samples = await metric_samples(broker.url)
        assert samples[("segment_broker_corrupt_segments", ())] == 1
        assert samples[("segment_broker_corruptions_total", (("source", "recovery"),))] == 1
        assert samples[("segment_broker_torn_tail_truncations_total", ())] == 0
        assert f"ERROR segment_broker.store: segment {name} is corrupted at position {BAD}" in (
            broker.logs()
        )
        async with SegmentAdmin(broker.url) as admin:
            stats = await admin.stats(NS, TOPIC, 0)
            assert stats["corruption"]["position"] == BAD
            assert stats["corruption"]["file"] == log_file.name
            assert stats["corruption"]["offset"] == offsets[BAD]
            assert stats["lastPosition"] == BAD - 1
            assert (await admin.stats(NS, TOPIC, 1))["corruption"] is None

        # The other segment works as before.
        assert await _produce(broker.url, 1, _values(5, 20)) == list(range(20, 25))
        other = await _consume(broker.url, 1, 25)
        assert [p for p, _ in other] == list(range(25))

        # Appends to the damaged one are refused with the documented error, not retried.
        with pytest.raises(SegmentCorruptedError) as refused:
            await SegmentProducer.connect(broker.url, NS, TOPIC, 0, "p")
        assert refused.value.code == wire.ERR_SEGMENT_CORRUPTED
        assert refused.value.position == BAD

        # Its consumer gets everything before the damage, then an ERROR frame at it.
        async with await SegmentConsumer.connect(
            broker.url, NS, TOPIC, 0, "audit", "reader", permits=1000
        ) as consumer:
            assert consumer.servable_position == BAD - 1, "HELLO_OK claims nothing it cannot serve"
            assert consumer.corruption is not None and consumer.corruption["position"] == BAD
            got: list[int] = []
            async with asyncio.timeout(30):
                while len(got) < BAD:
                    item = await consumer.receive()
                    assert item is not None
                    got.append(item.position)
                assert got == list(range(BAD))
                consumer.ack_cumulative(BAD - 1)
                with pytest.raises(SegmentCorruptedError) as told:
                    await consumer.receive()
        assert told.value.position == BAD
        assert told.value.code == wire.ERR_SEGMENT_CORRUPTED

        async with SegmentAdmin(broker.url) as admin:
            with pytest.raises(AdminError) as sealing:
                await admin.terminate(NS, TOPIC, 0)
            assert (sealing.value.status, sealing.value.code) == (409, "SegmentCorrupted")
            assert log_file.read_bytes() == damaged, "the broker changed no byte of the log"

            # Only an explicit truncation at the damaged position, naming the segment, lifts it.
            with pytest.raises(AdminError) as wrong_name:
                await admin.truncate(NS, TOPIC, 0, BAD, f"{NS}/{TOPIC}/1")
            assert (wrong_name.value.status, wrong_name.value.code) == (400, "BadRequest")
            with pytest.raises(AdminError) as wrong_position:
                await admin.truncate(NS, TOPIC, 0, BAD + 1, f"{NS}/{TOPIC}/0")
            assert (wrong_position.value.status, wrong_position.value.code) == (409, "Conflict")
            with pytest.raises(AdminError) as healthy:
                await admin.truncate(NS, TOPIC, 1, 3, f"{NS}/{TOPIC}/1")
            assert (healthy.value.status, healthy.value.code) == (409, "Conflict")
            assert log_file.read_bytes() == damaged

            done = await admin.truncate(NS, TOPIC, 0, BAD, f"{NS}/{TOPIC}/0")
            assert done["corruption"] is None and done["lastPosition"] == BAD - 1
            assert done["truncated"] == {
                "position": BAD,
                "droppedBytes": len(damaged) - offsets[BAD],
                "droppedFiles": [],
            }
        assert log_file.read_bytes() == damaged[: offsets[BAD]]
        assert "truncated at position 150 by an operator" in broker.logs()
        samples = await metric_samples(broker.url)
        assert samples[("segment_broker_corrupt_segments", ())] == 0
        assert samples[("segment_broker_corruption_truncations_total", ())] == 1

        assert await _produce(broker.url, 0, [b"after"]) == [BAD]
        tail = await _consume(broker.url, 0, 1)
        assert tail == [(BAD, b"after")]
    finally:
        broker.terminate()


async def test_a_good_copy_put_back_lifts_the_quarantine_at_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data)
    broker.start()
    try:
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"audit": "Queue"})
        await _produce(broker.url, 0, _values(50))
        broker.terminate()
        (log_file,) = (data / NS / TOPIC / "0000-ffff-0").glob("log-*.log")
        good = log_file.read_bytes()
        raw = bytearray(good)
        raw[len(raw) // 2] ^= 0x01
        log_file.write_bytes(bytes(raw))

        broker.start()
        await broker.wait_ready()
        name = f"{NS}/{TOPIC}/0000-ffff-0"
        assert name in (await _get(broker.url + "/readyz"))["corrupted"]
        assert (data / NS / TOPIC / "0000-ffff-0" / "quarantined.json").exists()
        broker.terminate()

        log_file.write_bytes(good)  # the backup
        broker.start()
        await broker.wait_ready()
        assert (await _get(broker.url + "/readyz"))["corrupted"] == {}
        assert f"segment {name} was quarantined and is intact now" in broker.logs()
        assert not (data / NS / TOPIC / "0000-ffff-0" / "quarantined.json").exists()
        assert await _produce(broker.url, 0, [b"again"]) == [50]
    finally:
        broker.terminate()
