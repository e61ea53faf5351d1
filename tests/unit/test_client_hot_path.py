"""The SDK's per-message fast paths produce what the general paths do (issue 17): the
producer's entry encoding with the routing hashes, the consumers' one-object decoding, and
``send_many``'s one future for many messages."""

from __future__ import annotations

import asyncio

import pytest

from scalable_topics.client.consumers.common import _Reader, entry_messages
from scalable_topics.client.model import MessageId
from scalable_topics.client.producer import ScalableTopicProducer, _Entry, _Link, _Many, _Out
from scalable_topics.client.segment import EntryAck, EntryRejectedError, ReceivedEntry
from scalable_topics.core import wire


def _outs(
    loop: asyncio.AbstractEventLoop, specs: list[tuple[bytes | None, int | None]]
) -> list[_Out]:
    props = {"a": "b"}
    return [
        _Out(b"v%d" % i, key, ts, props if i == 2 else None, loop.create_future())
        for i, (key, ts) in enumerate(specs)
    ]


async def test_producer_entries_are_the_general_encoding_byte_for_byte() -> None:
    loop = asyncio.get_running_loop()
    producer = ScalableTopicProducer("http://127.0.0.1:1", "ns", "t", name="p-1")
    keyed = _outs(loop, [(b"k-%d" % i, None) for i in range(2)])
    mixed = _outs(loop, [(b"a", None), (None, None), (b"c", 5)])
    for seq, outs in ((7, keyed), (8, mixed)):
        data = producer._encode(seq, outs)
        header = wire.decode_entry_header(data)
        general = wire.encode_entry(
            "p-1", seq, [o.message() for o in outs], publish_time_ms=header.publish_time_ms
        )
        assert data == general
        assert header.sequence_id == seq and header.message_count == len(outs)


def test_consumer_messages_carry_every_field_of_the_entry() -> None:
    msgs = [
        wire.Message(b"x", key=b"k\xff", timestamp_ms=3, properties={"p": "q"}),
        wire.Message(b"y"),
    ]
    entry = wire.encode_entry("prod", 4, msgs, publish_time_ms=99)
    out = entry_messages(6, ReceivedEntry(12, 2, entry))
    assert [(m.key_bytes, m.value, m.event_time_ms, dict(m.properties)) for m in out] == [
        (b"k\xff", b"x", 3, {"p": "q"}),
        (None, b"y", None, {}),
    ]
    for index, m in enumerate(out):
        assert (m.segment_id, m.position, m.batch_index, m.batch_size) == (6, 12, index, 2)
        assert (m.publish_time_ms, m.producer_name, m.redelivery_count) == (99, "prod", 2)
    assert out[0].properties is not out[1].properties


def test_messages_a_previous_consumer_acknowledged_are_left_out() -> None:
    entry = wire.encode_entry("prod", 4, [wire.Message(b"%d" % i) for i in range(4)])
    out = entry_messages(0, ReceivedEntry(12, 1, entry, frozenset({0, 2})))
    assert [(m.value, m.batch_index, m.last_in_entry) for m in out] == [
        (b"1", 1, False),
        (b"3", 3, True),
    ]


def test_a_reader_reports_what_it_acknowledged_of_unfinished_entries() -> None:
    reader = _Reader(0, frozenset({1}))
    reader.started = {5: set(), 6: {0, 1}, 7: set(), 8: {3}}
    reader.acked_through = {5: 2, 8: 1}
    assert reader.partial_acks() == {5: {0, 1, 2}, 6: {0, 1}, 8: {0, 1, 3}}


def _batch(
    loop: asyncio.AbstractEventLoop, count: int
) -> tuple[asyncio.Future[list[MessageId]], list[_Out]]:
    future: asyncio.Future[list[MessageId]] = loop.create_future()
    many = _Many(future, count)
    return future, [_Out(b"v%d" % i, b"k%d" % i, None, None, many, i) for i in range(count)]


async def test_send_many_resolves_in_call_order_once_every_entry_is_acknowledged() -> None:
    loop = asyncio.get_running_loop()
    producer = ScalableTopicProducer("http://127.0.0.1:1", "ns", "t", name="p-1")
    future, outs = _batch(loop, 5)
    single = loop.create_future()
    outs.insert(2, _Out(b"s", b"k", None, None, single))
    link = _Link(3)
    producer._pending = link.pending = 6
    # entries are cut per bucket, so a batch's messages finish in any order
    second, first = _Entry([outs[4], outs[5]]), _Entry([outs[0], outs[1], outs[2], outs[3]])
    producer._finish(link, second, ack=EntryAck(1, 41, False))
    assert not future.done()
    producer._finish(link, first, ack=EntryAck(0, 40, False))
    assert await future == [
        MessageId(3, 40, 0),
        MessageId(3, 40, 1),
        MessageId(3, 40, 3),
        MessageId(3, 41, 0),
        MessageId(3, 41, 1),
    ]
    assert await single == MessageId(3, 40, 2)
    assert producer.pending == 0


async def test_send_many_fails_with_the_first_error_of_any_message() -> None:
    loop = asyncio.get_running_loop()
    producer = ScalableTopicProducer("http://127.0.0.1:1", "ns", "t", name="p-1")
    future, outs = _batch(loop, 4)
    link = _Link(0)
    producer._pending = link.pending = 4
    producer._finish(link, _Entry(outs[:2]), ack=EntryAck(0, 0, False))
    rejected = EntryRejectedError(1, "entry_too_large", "too large")
    producer._finish(link, _Entry(outs[2:3]), error=rejected)
    producer._finish(link, _Entry(outs[3:]), ack=EntryAck(2, 1, False))
    with pytest.raises(EntryRejectedError, match="too large"):
        await future
    assert producer.pending == 0


async def test_send_many_on_a_producer_not_started_raises_like_send_async() -> None:
    producer = ScalableTopicProducer("http://127.0.0.1:1", "ns", "t", name="p-1")
    with pytest.raises(RuntimeError, match="not started"):
        await producer.send_async(b"v", "k")
    with pytest.raises(RuntimeError, match="not started"):
        await producer.send_many([b"v"], ["k"])
    assert producer.pending == 0, "nothing was queued"
