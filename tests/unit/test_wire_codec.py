"""The binary wire codec shared by the broker and the client (docs/protocol.md)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.core import buckets as core_buckets
from scalable_topics.core import wire
from scalable_topics.core.hashing import bucket_hash, key_hash, segment_hash
from scalable_topics.core.wire import Message, WireError

keys = st.one_of(st.none(), st.binary(max_size=40))
messages = st.builds(
    Message,
    value=st.binary(max_size=100),
    key=keys,
    timestamp_ms=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    properties=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)


@given(
    name=st.text(min_size=1, max_size=30),
    seq=st.integers(0, 2**63 - 1),
    msgs=st.lists(messages, min_size=1, max_size=20),
)
def test_entry_round_trip_and_hash_summary(name: str, seq: int, msgs: list[Message]) -> None:
    entry = wire.encode_entry(name, seq, msgs, publish_time_ms=123)
    header, decoded = wire.decode_entry(entry)
    assert decoded == msgs
    assert (header.producer_name, header.sequence_id, header.message_count) == (
        name,
        seq,
        len(msgs),
    )
    assert header.publish_time_ms == 123
    keyed = [m.key for m in msgs if m.key is not None]
    assert header.keyed == bool(keyed)
    if keyed:
        hb = [bucket_hash(k) for k in keyed]
        assert (header.hashb_min, header.hashb_max) == (min(hb), max(hb))
        assert header.key_hash_sample == segment_hash(keyed[0])
        assert wire.entry_bucket_hash(entry) == min(hb)
    else:
        assert header.key_hash_sample is None
        assert wire.entry_bucket_hash(entry) is None


def test_known_hash_values_reach_the_header() -> None:
    header, _ = wire.decode_entry(wire.encode_entry("p", 0, [Message(b"v", key=b"hello")]))
    assert (header.hashb_min, header.hashb_max, header.key_hash_sample) == (0xFA47, 0xFA47, 0x248B)


@given(st.lists(st.tuples(st.binary(min_size=1, max_size=20), st.binary(max_size=50)), min_size=1))
def test_fast_paths_match_the_general_encoder(pairs: list[tuple[bytes, bytes]]) -> None:
    ks = [k for k, _ in pairs]
    vs = [v for _, v in pairs]
    fast = wire.encode_keyed_values(ks, vs)
    general = wire.encode_messages([Message(v, key=k) for k, v in pairs])
    assert fast == general
    assert wire.encode_values(vs) == wire.encode_messages([Message(v) for v in vs])[0]
    # a producer passes the hashes it computed to route the keys: the same bytes, no rehash
    hashes = [key_hash(k) for k in ks]
    assert wire.encode_keyed_values(ks, vs, hashes) == general
    with pytest.raises(ValueError, match="differ in length"):
        wire.encode_keyed_values(ks, vs, hashes[1:])


@given(st.lists(messages, min_size=1, max_size=20))
def test_message_fields_are_what_the_decoder_yields(msgs: list[Message]) -> None:
    payload, count, *_ = wire.encode_messages(msgs)
    fields = list(wire.iter_message_fields(payload, count))
    assert fields == [
        (m.value, m.key, m.timestamp_ms, dict(m.properties) if m.properties else None) for m in msgs
    ]
    assert list(wire.iter_messages(payload, count)) == msgs
    with pytest.raises(WireError, match="declares"):
        list(wire.iter_message_fields(payload, count + 1))


@given(st.integers(0, 0xFFFF), st.integers(1, 1024))
def test_bucket_of_matches_core(hashb: int, n: int) -> None:
    assert wire.bucket_of(hashb, n) == core_buckets.bucket_of(hashb, n)


@given(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=20))
def test_send_frame_round_trip(entries: list[bytes]) -> None:
    assert [bytes(e) for e in wire.decode_send(wire.encode_send(entries))] == entries


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(-1, 2**62), st.integers(0, 1))))
def test_send_ack_round_trip(acks: list[tuple[int, int, int]]) -> None:
    decoded = wire.decode_send_ack(wire.encode_send_ack(acks))
    assert [(a.sequence_id, a.position, a.status) for a in decoded] == acks


def test_consumer_frames_round_trip() -> None:
    items = [(5, 0, b"abc"), (9, 2, b"")]
    got = wire.decode_deliver(wire.encode_deliver(items))
    assert [(d.position, d.redelivery_count, bytes(d.entry)) for d in got] == items
    assert wire.decode_flow(wire.encode_flow(77)) == 77
    assert wire.decode_ack(wire.encode_ack([1, 2, 3])) == (False, (1, 2, 3))
    assert wire.decode_ack(wire.encode_ack([9], cumulative=True)) == (True, (9,))
    assert wire.decode_nack(wire.encode_nack([4])) == (4,)
    assert wire.decode_end_of_segment(wire.encode_end_of_segment(-1)) == -1
    version, body = wire.decode_hello(wire.encode_hello(1, {"producerName": "p"}))
    assert (version, body) == (1, {"producerName": "p"})


@pytest.mark.parametrize(
    ("entry", "kind"),
    [
        (b"", "bad_entry"),
        (wire.encode_entry("p", 1, [Message(b"v")])[:-1], "bad_entry"),
        (b"\x02" + wire.encode_entry("p", 1, [Message(b"v")])[1:], "bad_entry"),
        (wire.encode_entry_raw(b"", 1, b"x", 1), "bad_entry"),
        (wire.encode_entry_raw(b"p", 1, b"", 0), "bad_entry"),
        (
            wire.encode_entry_raw(b"p", 1, b"x", 1, keyed=True, hashb_min=9, hashb_max=3),
            "bad_entry",
        ),
    ],
)
def test_bad_entries_are_rejected(entry: bytes, kind: str) -> None:
    with pytest.raises(WireError) as info:
        wire.decode_entry_header(entry)
    assert info.value.kind == kind


@given(st.binary(max_size=200))
def test_decoders_raise_only_wire_errors(data: bytes) -> None:
    for decode in (
        wire.decode_entry,
        wire.decode_send,
        wire.decode_send_ack,
        wire.decode_deliver,
        wire.decode_flow,
        wire.decode_ack,
        wire.decode_nack,
        wire.decode_hello,
        wire.decode_end_of_segment,
        wire.decode_json_frame,
        wire.decode_partial_ack,
        wire.decode_acked_indexes,
        wire.decode_sealing,
    ):
        with contextlib.suppress(WireError):
            decode(data)


@given(st.binary(max_size=200))
def test_message_decoder_raises_only_wire_errors(payload: bytes) -> None:
    with contextlib.suppress(WireError):
        list(wire.iter_messages(payload))


def test_buckets_done_frame_round_trips_and_rejects_bad_lengths() -> None:
    frame = wire.encode_buckets_done(41, [0, 3, 65535])
    assert frame[0] == wire.FRAME_BUCKETS_DONE and len(frame) == 1 + 8 + 2 + 3 * 2
    assert wire.decode_buckets_done(frame) == (41, (0, 3, 65535))
    for bad in (frame[:-1], frame + b"\x00", frame[:11], wire.encode_end_of_buckets(41)):
        with pytest.raises(wire.WireError):
            wire.decode_buckets_done(bad)
    with pytest.raises(wire.WireError):
        wire.decode_buckets_done(frame[:9] + b"\x00\x00")  # a count of 0
    with pytest.raises(ValueError):
        wire.encode_buckets_done(41, [])


successors = st.lists(
    st.builds(
        lambda sid, a, b, url: wire.Successor(sid, min(a, b), max(a, b), url),
        st.integers(0, wire.MAX_ID),
        st.integers(0, wire.RING_SIZE - 1),
        st.integers(0, wire.RING_SIZE - 1),
        st.none() | st.text(max_size=40),
    ),
    max_size=4,
)


@given(successors)
def test_sealing_frame_round_trips(items: list[wire.Successor]) -> None:
    frame = wire.encode_sealing(items)
    assert frame[0] == wire.FRAME_SEALING
    assert wire.decode_sealing(frame) == items


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        wire.encode_sealed({"successors": []}),
        bytes((wire.FRAME_SEALING,)) + b'{"successors": 3}',
        bytes((wire.FRAME_SEALING,)) + b'{"successors": [{"segmentId": -1, "range": {}}]}',
        bytes((wire.FRAME_SEALING,))
        + b'{"successors": [{"segmentId": 2, "range": {"start": 9, "end": 3}}]}',
    ],
)
def test_malformed_sealing_frames_are_wire_errors(frame: bytes) -> None:
    with pytest.raises(WireError):
        wire.decode_sealing(frame)


batch_indexes = st.dictionaries(
    st.integers(0, 2**62), st.frozensets(st.integers(0, 2**32 - 1), min_size=1), min_size=1
)


@given(batch_indexes)
def test_partial_ack_and_acked_indexes_frames_round_trip(items: dict[int, frozenset[int]]) -> None:
    ack = wire.encode_partial_ack(items)
    assert wire.is_partial_ack(ack) and not wire.is_partial_ack(wire.encode_ack([1]))
    assert wire.decode_partial_ack(ack) == items
    assert wire.decode_acked_indexes(wire.encode_acked_indexes(items)) == items
    with pytest.raises(WireError):
        wire.decode_ack(ack)  # a version 3 decoder does not take it for positions


def test_batch_index_frames_reject_bad_shapes() -> None:
    ack = wire.encode_partial_ack({7: [0, 2]})
    assert len(ack) == 4 + 8 + 4 + 2 * 4
    indexes = wire.encode_acked_indexes({7: [0, 2]})
    for bad in (ack[:-1], ack + b"\x00", ack[:4], ack[:2] + b"\x00\x00" + ack[4:]):
        with pytest.raises(WireError):
            wire.decode_partial_ack(bad)
    for bad in (indexes[:-1], indexes + b"\x00", indexes[:1] + b"\x00\x00" + indexes[3:]):
        with pytest.raises(WireError):
            wire.decode_acked_indexes(bad)
    no_index = ack[:4] + (7).to_bytes(8, "little") + (0).to_bytes(4, "little")
    negative = ack[:4] + (-1).to_bytes(8, "little", signed=True) + ack[12:]
    for bad in (no_index, negative):
        with pytest.raises(WireError):
            wire.decode_partial_ack(bad)
    bad_items: list[dict[int, list[int]]] = [{}, {7: []}, {-1: [0]}, {7: [2**32]}]
    for items in bad_items:
        with pytest.raises(ValueError):
            wire.encode_partial_ack(items)
