"""``SegmentProducer.publish``: the one call through which the SDK's producer sends an entry, on
its first send and on every re-send after a lost connection, against a real broker.

A re-send on a new connection keeps the entry's sequence id, so the broker answers a copy it
already stored as a duplicate at the original position; on one connection the ids must
increase, because a lower id after a higher one would be answered as a duplicate without being
stored (a silent loss), so ``publish`` refuses it before sending anything."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from scalable_topics.client.segment import SegmentAdmin, SegmentConsumer, SegmentProducer
from scalable_topics.core import wire
from segment_broker.testing import running_broker

pytestmark = pytest.mark.integration

NS, TOPIC = "publish", "orders"


def _entry(seq: int) -> bytes:
    return wire.encode_entry("p", seq, [wire.Message(b"m%d" % seq, key=b"k")])


async def test_publish_resends_with_the_same_ids_and_refuses_a_lower_id(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"s": "Stream"})
        first = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        acks = [await (await first.publish(seq, _entry(seq))) for seq in (0, 1, 2)]
        assert [(a.sequence_id, a.position, a.duplicate) for a in acks] == [
            (0, 0, False),
            (1, 1, False),
            (2, 2, False),
        ]
        with pytest.raises(ValueError, match="not above 2"):
            await first.publish(1, _entry(1))
        assert first.inflight_entries == 0
        await first.close()
        assert (await admin.stats(NS, TOPIC, 0))["lastPosition"] == 2

        # A new connection of the same name: the broker remembers id 2; entries a lost
        # connection left without a verdict go out again with their ids, then new ones.
        second = await SegmentProducer.connect(rb.url, NS, TOPIC, 0, "p")
        assert second.last_sequence_id == 2
        again = await (await second.publish(1, _entry(1)))
        assert (again.position, again.duplicate) == (1, True)
        fresh = await (await second.publish(3, _entry(3)))
        assert (fresh.position, fresh.duplicate) == (3, False)
        with pytest.raises(ValueError, match="not above 3"):
            await second.publish(2, _entry(2))
        assert second.last_sequence_id == 3
        await second.close()

        stored: list[tuple[int, int, bytes]] = []
        async with await SegmentConsumer.connect(rb.url, NS, TOPIC, 0, "s", "audit") as reader:
            async with asyncio.timeout(30):
                while len(stored) < 4:
                    item = await reader.receive()
                    assert item is not None
                    header, messages = wire.decode_entry(bytes(item.entry))
                    stored.append((item.position, header.sequence_id, messages[0].value))
        assert stored == [(i, i, b"m%d" % i) for i in range(4)]
