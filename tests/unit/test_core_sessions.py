"""Session messages (core.sessions): DAG and assignment builders, parsing, versioning."""

from __future__ import annotations

import json

import pytest

from scalable_topics.core.assignment import QueueCoordinator, SubscriptionCoordinator
from scalable_topics.core.buckets import bucket_boundaries, initial_layout_buckets, layout_buckets
from scalable_topics.core.layout import SegmentLayout, SegmentState
from scalable_topics.core.sessions import (
    AssignmentMessage,
    CloseCode,
    ConsumerType,
    DagMessage,
    DrainedMessage,
    ErrorCode,
    ErrorMessage,
    PositionMessage,
    RedirectMessage,
    RegisterMessage,
    SessionProtocolError,
    UnregisterMessage,
    assignment_message,
    consumers_path,
    dag_message,
    dag_path,
    encode,
    parse_client_message,
    parse_server_message,
)


def _split_layout() -> tuple[SegmentLayout, dict[int, int]]:
    initial = SegmentLayout.initial(2)
    buckets = initial_layout_buckets(initial, budget=8)
    layout = initial.split(0).merge(3, 1)
    return layout, layout_buckets(layout, buckets)


def test_dag_message_has_every_segment_with_broker_and_buckets() -> None:
    layout, buckets = _split_layout()
    brokers = {i: f"http://127.0.0.{i + 1}:8080" for i in layout.segments if i != 2}
    message = dag_message(
        "ns", "orders", layout, brokers=brokers, buckets=buckets, controller_url="http://ctl"
    )

    assert message.epoch == layout.epoch == 2
    assert message.next_segment_id == layout.next_segment_id
    assert message.controller_url == "http://ctl"
    assert [s.segment_id for s in message.segments] == sorted(layout.segments)
    for segment in message.segments:
        info = layout.segments[segment.segment_id]
        assert segment.hash_range.to_hash_range() == info.hash_range
        assert segment.state is info.state
        assert segment.parent_ids == info.parent_ids
        assert segment.child_ids == info.child_ids
        assert segment.descriptor == info.descriptor
        assert segment.broker_url == brokers.get(segment.segment_id)
        assert segment.buckets == buckets[segment.segment_id]
        assert list(segment.bucket_boundaries) == bucket_boundaries(buckets[segment.segment_id])
    # 8 buckets over 2 segments: 4 each; split children 2 each; merge child 2 + 4
    assert {s.segment_id: s.buckets for s in message.segments} == {0: 4, 1: 4, 2: 2, 3: 2, 4: 6}
    assert [s.segment_id for s in message.active()] == [2, 4]
    assert message.brokers() == brokers


def test_dag_message_round_trips_through_json_to_the_layout() -> None:
    layout, buckets = _split_layout()
    message = dag_message("ns", "t", layout, brokers={}, buckets=buckets, controller_url=None)
    text = encode(message)
    data = json.loads(text)
    assert data["v"] == 1 and data["type"] == "dag"
    assert data["controllerUrl"] is None
    first = data["segments"][0]
    assert set(first) >= {
        "segmentId",
        "descriptor",
        "hashRange",
        "state",
        "parentIds",
        "childIds",
        "brokerUrl",
        "buckets",
        "bucketBoundaries",
    }
    parsed = parse_server_message(text)
    assert isinstance(parsed, DagMessage)
    assert parsed == message
    assert parsed.to_layout() == layout


def test_dag_message_without_bucket_count_has_no_boundaries() -> None:
    layout = SegmentLayout.initial(1)
    message = dag_message("ns", "t", layout, brokers={0: ""}, buckets={}, controller_url="")
    (segment,) = message.segments
    assert segment.buckets is None and segment.bucket_boundaries == ()
    assert segment.broker_url is None
    assert message.controller_url is None


def test_assignment_message_carries_flags_and_broker_urls() -> None:
    layout = SegmentLayout.initial(2)
    coordinator = SubscriptionCoordinator(layout)
    coordinator.register("c1", 0.0)
    coordinator.layout_changed(layout.split(0), 1.0)
    assignment = coordinator.assignment("c1")

    message = assignment_message("ns", "t", "sub", assignment, {0: "http://b0", 2: "http://b2"})
    assert message.layout_epoch == 1
    by_id = {s.segment_id: s for s in message.segments}
    assert [s.segment_id for s in message.segments] == list(assignment.segment_ids)
    assert by_id[0].state is SegmentState.SEALED and by_id[0].consumable
    assert not by_id[2].consumable and by_id[2].blocked_by == (0,)
    assert by_id[0].broker_url == "http://b0" and by_id[2].broker_url == "http://b2"
    assert by_id[3].broker_url is None
    data = json.loads(encode(message))
    expected = assignment.to_dict()["segments"]
    assert all(s["buckets"] is None for s in data["segments"])  # whole segments
    assert [
        {k: v for k, v in s.items() if k not in ("brokerUrl", "buckets")} for s in data["segments"]
    ] == expected
    assert parse_server_message(encode(message)) == message


def test_queue_assignments_carry_the_owned_buckets() -> None:
    layout = SegmentLayout.initial(1)
    coordinator = QueueCoordinator(layout, buckets={0: 4})
    coordinator.register("w1", 0.0)
    coordinator.register("w2", 0.0)
    message = assignment_message("ns", "t", "jobs", coordinator.assignment("w2"), {0: "http://b"})
    data = json.loads(encode(message))
    assert data["segments"][0]["buckets"] == [2, 3]
    assert data["segments"][0]["brokerUrl"] == "http://b"
    parsed = parse_server_message(encode(message))
    assert isinstance(parsed, AssignmentMessage) and parsed.segments[0].buckets == (2, 3)


def test_client_messages_parse() -> None:
    register = parse_client_message(
        '{"v": 1, "type": "register", "subscription": "s", "consumer": "c"}'
    )
    assert register == RegisterMessage(subscription="s", consumer="c")
    assert register.consumer_type is ConsumerType.STREAM
    checkpoint = parse_client_message(
        encode(RegisterMessage(subscription="s", consumer="c", consumer_type="checkpoint"))
    )
    assert isinstance(checkpoint, RegisterMessage)
    assert checkpoint.consumer_type is ConsumerType.CHECKPOINT
    queue = parse_client_message(
        '{"v":1,"type":"register","subscription":"jobs","consumer":"w","consumerType":"queue"}'
    )
    assert isinstance(queue, RegisterMessage) and queue.consumer_type is ConsumerType.QUEUE
    assert parse_client_message('{"v":1,"type":"drained","segment":3}') == DrainedMessage(segment=3)
    assert parse_client_message(
        '{"v":1,"type":"position","segment":3,"position":17}'
    ) == PositionMessage(segment=3, position=17)
    assert isinstance(parse_client_message('{"v":1,"type":"unregister"}'), UnregisterMessage)
    # unknown fields are ignored inside a version
    assert parse_client_message(
        '{"v":1,"type":"drained","segment":3,"reason":"end of segment"}'
    ) == DrainedMessage(segment=3)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": "drained", "segment": 1}', "protocol version None"),
        ('{"v": 2, "type": "drained", "segment": 1}', "protocol version 2"),
        ('{"v": 1, "type": "subscribe"}', "invalid message"),
        ('{"v": 1}', "invalid message"),
        ('{"v": 1, "type": "register", "subscription": "s"}', "consumer"),
        ('{"v": 1, "type": "register", "subscription": "", "consumer": "c"}', "subscription"),
        (
            '{"v":1,"type":"register","subscription":"s","consumer":"c","consumerType":"pipe"}',
            "consumerType",
        ),
        ('{"v": 1, "type": "drained", "segment": -1}', "segment"),
        ('{"v": 1, "type": "drained", "segment": "x"}', "segment"),
        ('{"v": 1, "type": "position", "segment": 1}', "position"),
        (b"\xff\xfe", "not valid JSON"),
        ('{"v": 1, "type": "unregister", "pad": "' + "x" * 70000 + '"}', "exceeds"),
    ],
)
def test_malformed_client_messages_are_protocol_errors(text: str | bytes, fragment: str) -> None:
    with pytest.raises(SessionProtocolError, match=fragment):
        parse_client_message(text)


def test_server_messages_parse() -> None:
    error = ErrorMessage(code=ErrorCode.REJECTED, message="no", fatal=False)
    redirect = RedirectMessage(url="http://leader/v1/topics/a/b/consumers", reason="moved")
    for message in (error, redirect):
        assert parse_server_message(encode(message)) == message
    data = json.loads(encode(redirect))
    assert data == {
        "v": 1,
        "type": "redirect",
        "url": "http://leader/v1/topics/a/b/consumers",
        "retryAfter": 1.0,
        "reason": "moved",
    }
    assert isinstance(parse_server_message(encode(error)), ErrorMessage)
    with pytest.raises(SessionProtocolError):
        parse_server_message('{"v": 1, "type": "register", "subscription": "s", "consumer": "c"}')
    with pytest.raises(SessionProtocolError):
        parse_server_message('{"v": 1, "type": "assignment"}')
    assert isinstance(
        parse_server_message(
            encode(
                AssignmentMessage(
                    namespace="n", topic="t", subscription="s", consumer="c", layout_epoch=0
                )
            )
        ),
        AssignmentMessage,
    )


def test_close_codes_and_paths() -> None:
    standard = (CloseCode.NORMAL, CloseCode.GOING_AWAY, CloseCode.AUTH_UNAVAILABLE)
    application = [c for c in CloseCode if c not in standard]
    assert all(4000 <= c <= 4999 for c in application)
    assert int(CloseCode.UNKNOWN_TOPIC) == 4404
    # Refused credentials: the HTTP status + 4000, and 1013 "try again later".
    assert (int(CloseCode.UNAUTHENTICATED), int(CloseCode.FORBIDDEN)) == (4401, 4403)
    assert int(CloseCode.AUTH_UNAVAILABLE) == 1013
    assert dag_path("ns", "t") == "/v1/topics/ns/t/dag"
    assert consumers_path("ns", "t") == "/v1/topics/ns/t/consumers"
