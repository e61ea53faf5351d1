"""Pure values of the client SDK: checkpoints, received messages, drain gating."""

from __future__ import annotations

import json

import pytest

from scalable_topics.client.consumers import entry_messages, readable
from scalable_topics.client.model import Checkpoint, Message, MessageId, decode_key
from scalable_topics.client.segment import ReceivedEntry
from scalable_topics.core.sessions import AssignedSegmentModel
from scalable_topics.core.wire import Message as WireMessage
from scalable_topics.core.wire import encode_entry


def _checkpoint() -> Checkpoint:
    return Checkpoint("ns", "orders", "etl", {3: (41, 9), 5: (0, 0)}, frozenset({0, 1}))


def test_checkpoint_round_trips_through_json() -> None:
    cp = _checkpoint()
    text = cp.dumps()
    data = json.loads(text)
    assert data == {
        "version": 1,
        "namespace": "ns",
        "topic": "orders",
        "subscription": "etl",
        "positions": {
            "3": {"position": 41, "batchIndex": 9},
            "5": {"position": 0, "batchIndex": 0},
        },
        "drained": [0, 1],
    }
    assert Checkpoint.loads(text) == cp
    assert Checkpoint.from_json(cp.to_json()) == cp


def test_checkpoint_covers_processed_messages_only() -> None:
    cp = _checkpoint()
    assert cp.covers(3, 41, 9)
    assert cp.covers(3, 40, 99)
    assert not cp.covers(3, 41, 10)
    assert not cp.covers(3, 42, 0)
    assert cp.covers(0, 10**6, 0), "a drained segment is covered entirely"
    assert not cp.covers(7, 0, 0)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "not json",
        '{"version": 2, "namespace": "n", "topic": "t", "subscription": "s"}',
        '{"version": 1, "topic": "t", "subscription": "s"}',
        '{"version": 1, "namespace": "n", "topic": "t", "subscription": "s",'
        ' "positions": {"x": {"position": 1}}}',
        '{"version": 1, "namespace": "n", "topic": "t", "subscription": "s",'
        ' "positions": {"1": {"position": -5}}}',
    ],
)
def test_malformed_checkpoints_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Checkpoint.loads(text)


def test_entry_messages_carry_their_ids_and_keys() -> None:
    entry = encode_entry(
        "p-1",
        7,
        [
            WireMessage(b"a", key=b"k1", timestamp_ms=5, properties={"x": "y"}),
            WireMessage(b"b", key=b"\xff\xfe"),
            WireMessage(b"c"),
        ],
        publish_time_ms=1234,
    )
    messages = entry_messages(4, ReceivedEntry(position=12, redelivery_count=1, entry=entry))
    assert [m.value for m in messages] == [b"a", b"b", b"c"]
    first, second, third = messages
    assert first.key == "k1" and first.event_time_ms == 5 and first.properties == {"x": "y"}
    assert first.message_id == MessageId(4, 12, 0)
    assert first.publish_time_ms == 1234 and first.producer_name == "p-1"
    assert first.redelivery_count == 1
    assert second.key_bytes == b"\xff\xfe", "undecodable keys survive the str round trip"
    assert third.key is None and third.last_in_entry and not first.last_in_entry
    assert [m.batch_size for m in messages] == [3, 3, 3]


def test_messages_and_ids_are_immutable_values() -> None:
    messages = entry_messages(
        2,
        ReceivedEntry(
            position=3,
            redelivery_count=0,
            entry=encode_entry("p", 0, [WireMessage(b"v", key=b"k")]),
        ),
    )
    (message,) = messages
    assert type(message) is Message, "the consumers' fast constructor builds the public type"
    assert message == Message("k", b"v", 2, 3, 0, 1, {}, None, message.publish_time_ms, "p")
    with pytest.raises(AttributeError):
        message.value = b"changed"  # type: ignore[misc]
    assert Message("k", b"v", 0, 0).properties == {}
    with pytest.raises(TypeError):
        Message("k", b"v", 0, 0).properties["x"] = "y"  # type: ignore[index]
    ids = [MessageId(1, 0, 2), MessageId(0, 9), MessageId(1, 0, 1)]
    assert sorted(ids) == [MessageId(0, 9, 0), MessageId(1, 0, 1), MessageId(1, 0, 2)]
    assert len({MessageId(0, 9), MessageId(0, 9, 0)}) == 1
    with pytest.raises(AttributeError):
        ids[0].position = 5  # type: ignore[misc]


def test_decode_key() -> None:
    assert decode_key(None) is None
    assert decode_key("é".encode()) == "é"
    assert Message("é", b"", 0, 0).key_bytes == "é".encode()


def _assigned(consumable: bool, blocked: tuple[int, ...]) -> AssignedSegmentModel:
    return AssignedSegmentModel.model_validate(
        {
            "segmentId": 5,
            "descriptor": "0000-7fff-5",
            "hashRange": {"start": 0, "end": 0x7FFF},
            "state": "ACTIVE",
            "consumable": consumable,
            "blockedBy": list(blocked),
        }
    )


def test_drain_gating() -> None:
    assert readable(_assigned(True, ()), set())
    assert not readable(_assigned(False, (1, 2)), {1})
    assert readable(_assigned(False, (1, 2)), {1, 2, 9})


async def test_stopping_a_reader_task_does_not_swallow_the_callers_cancellation() -> None:
    import asyncio

    from scalable_topics.client.segment import _cancel_and_wait

    reader = asyncio.create_task(asyncio.Event().wait())
    await _cancel_and_wait(reader)
    assert reader.cancelled(), "the reader itself is stopped and its cancellation absorbed"

    stubborn_started = asyncio.Event()

    async def stubborn() -> None:
        stubborn_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            raise

    other = asyncio.create_task(stubborn())
    await stubborn_started.wait()
    closer = asyncio.create_task(_cancel_and_wait(other))
    await asyncio.sleep(0)
    closer.cancel()
    try:
        await closer
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the caller's cancellation was swallowed")
    assert closer.cancelled()


def test_checkpoint_bucket_positions_cover_their_bucket_and_merge() -> None:
    """PIP-486: buckets read while a segment was shared are checkpointed per (segment,
    bucket); a message is covered by its segment's position or by its bucket's."""
    a = Checkpoint("ns", "t", "s", {3: (10, 0)}, frozenset(), {(3, 1): (40, 2)})
    assert a.covers(3, 10, 0) and not a.covers(3, 11, 0)
    assert a.covers(3, 40, 2, bucket=1) and not a.covers(3, 40, 3, bucket=1)
    assert not a.covers(3, 20, 0, bucket=0), "bucket 0 only up to the segment position"
    text = a.dumps()
    assert json.loads(text)["bucketPositions"] == {"3/1": {"position": 40, "batchIndex": 2}}
    assert Checkpoint.loads(text) == a
    b = Checkpoint("ns", "t", "s", {3: (12, 0)}, frozenset({1}), {(3, 0): (30, 0), (3, 1): (5, 0)})
    merged = a.merge(b)
    assert merged.positions == {3: (12, 0)} and merged.drained == frozenset({1})
    assert merged.bucket_positions == {(3, 0): (30, 0), (3, 1): (40, 2)}
    with pytest.raises(ValueError):
        a.merge(Checkpoint("ns", "t", "other"))
    with pytest.raises(ValueError):
        Checkpoint.loads(text.replace('"3/1"', '"3"'))
