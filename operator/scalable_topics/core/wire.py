"""Binary wire codec shared by the segment broker and its clients (docs/protocol.md).

Pure functions and dataclasses, no I/O. Two layers:

* **Entries** — a batch of messages from one producer, the unit the broker stores, acknowledges,
  dispatches and deduplicates. The broker parses only the fixed entry header; the message payload
  is opaque to it and forwarded byte for byte to consumers.
* **Frames** — one WebSocket binary message. The first byte is the frame type.

All integers are little-endian. Every decoder validates lengths strictly and raises
:class:`WireError` (with a short ``kind`` usable as a metric label) on malformed input, never any
other exception.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import mmh3

PROTOCOL_VERSION = 5
"""Highest protocol version this codec speaks. Peers negotiate ``min(client, server)``.
Version 2 (PIP-486 key-shared stream/checkpoint consumers): an Exclusive subscription honours
the consume ``HELLO``'s ``buckets``, and ``END_OF_BUCKETS`` exists. Version 3 (per-bucket
ordering across splits, merges and rollovers): ``BUCKETS_DONE`` exists. Version 4 (batch-index
acknowledgement): ``ACK`` of kind ``ACK_PARTIAL`` and ``ACKED_INDEXES`` exist. Version 5 (a
split's blocked window): ``SEALING`` exists."""
MIN_PROTOCOL_VERSION = 1

ENTRY_FORMAT = 1

RING_SIZE = 0x10000

# --- entry -------------------------------------------------------------------------------------

ENTRY_HEADER = struct.Struct("<BBHQHHHIQI")
"""format, flags, producer name length, sequence id, hashB min, hashB max, key hash sample,
message count, publish time (Unix ms), payload length."""
ENTRY_HEADER_SIZE = ENTRY_HEADER.size

ENTRY_FLAG_KEYED = 0x01
"""At least one message has a key; ``hashB`` min/max are meaningful."""
ENTRY_FLAG_KEY_SAMPLE = 0x02
"""``key_hash_sample`` holds the 16-bit segment hash of one key of the entry."""
ENTRY_FLAGS_KNOWN = ENTRY_FLAG_KEYED | ENTRY_FLAG_KEY_SAMPLE

MAX_PRODUCER_NAME = 255
MAX_ENTRY_SIZE = 16 * 1024 * 1024
"""Largest entry the broker accepts (header + producer name + payload)."""

# Byte offsets inside an encoded entry, for readers that need one field without a full parse.
_OFF_FLAGS = 1
_OFF_HASHB_MIN = 12

# --- message (inside an entry's payload; the broker never looks at these) ----------------------

MESSAGE_HEADER = struct.Struct("<BHI")
"""flags, key length, value length; then key, value, [timestamp i64], [properties]."""
MSG_FLAG_KEY = 0x01
MSG_FLAG_TIMESTAMP = 0x02
MSG_FLAG_PROPERTIES = 0x04
MSG_FLAGS_KNOWN = MSG_FLAG_KEY | MSG_FLAG_TIMESTAMP | MSG_FLAG_PROPERTIES
_I64 = struct.Struct("<q")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")

# --- frames ------------------------------------------------------------------------------------

FRAME_HELLO = 0x01
FRAME_HELLO_OK = 0x02
FRAME_SEND = 0x10
FRAME_SEND_ACK = 0x11
FRAME_ENTRY_ERROR = 0x12
FRAME_SEALED = 0x13
FRAME_SEALING = 0x14
FRAME_FLOW = 0x20
FRAME_DELIVER = 0x21
FRAME_ACK = 0x22
FRAME_NACK = 0x23
FRAME_END_OF_SEGMENT = 0x24
FRAME_END_OF_BUCKETS = 0x25
FRAME_BUCKETS_DONE = 0x26
FRAME_ACKED_INDEXES = 0x27
FRAME_ERROR = 0x7F

_HELLO = struct.Struct("<BH")
_COUNT = struct.Struct("<BH")
_SEND_ITEM = struct.Struct("<I")
_ACK_ITEM = struct.Struct("<QqB")
_FLOW = struct.Struct("<BI")
_DELIVER_ITEM = struct.Struct("<qHI")
_ACK_HEAD = struct.Struct("<BBH")
_POSITION = struct.Struct("<q")
_EOS = struct.Struct("<Bq")

ACK_STATUS_OK = 0
ACK_STATUS_DUPLICATE = 1

ACK_INDIVIDUAL = 0
ACK_CUMULATIVE = 1
ACK_PARTIAL = 2
"""Version 4: some messages of entries are acknowledged, by batch index (the entries stay
unacknowledged; a redelivery names those indexes in ``ACKED_INDEXES``)."""

MAX_FRAME_ITEMS = 0xFFFF

# WebSocket close codes (4000-4999 are reserved for applications by RFC 6455).
CLOSE_PROTOCOL_ERROR = 4000
CLOSE_SEGMENT_NOT_FOUND = 4001
CLOSE_UNSUPPORTED_VERSION = 4002
CLOSE_SEGMENT_SEALED = 4003
CLOSE_CONSUMER_BUSY = 4004
CLOSE_SUBSCRIPTION_NOT_FOUND = 4005
CLOSE_BUCKET_CONFLICT = 4006
CLOSE_SEGMENT_DELETED = 4007
CLOSE_PRODUCER_FENCED = 4008
CLOSE_SEGMENT_NOT_WRITABLE = 4009
CLOSE_SEGMENT_CORRUPTED = 4010
CLOSE_GOING_AWAY = 1001

# Error codes carried in ERROR / ENTRY_ERROR frames (JSON "code").
ERR_PROTOCOL = "ProtocolError"
ERR_SEGMENT_NOT_FOUND = "SegmentNotFound"
ERR_SEGMENT_SEALED = "SegmentSealed"
ERR_UNSUPPORTED_VERSION = "UnsupportedVersion"
ERR_CONSUMER_BUSY = "ConsumerBusy"
ERR_SUBSCRIPTION_NOT_FOUND = "SubscriptionNotFound"
ERR_BUCKET_CONFLICT = "BucketConflict"
ERR_SEGMENT_DELETED = "SegmentDeleted"
ERR_PRODUCER_FENCED = "ProducerFenced"
ERR_SEGMENT_NOT_WRITABLE = "SegmentNotWritable"
ERR_SEGMENT_CORRUPTED = "SegmentCorrupted"
ERR_ENTRY_SPANS_BUCKETS = "EntrySpansBuckets"
ERR_ENTRY_TOO_LARGE = "EntryTooLarge"


class WireError(ValueError):
    """Malformed input. ``kind`` is a short, bounded label (used in metrics)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# --- strict parsing of what clients send -------------------------------------------------------

MAX_ID = 0x7FFF_FFFF_FFFF_FFFF
"""Largest segment id (and other id) the protocol accepts: 2^63-1, a signed 64-bit value."""
_ID_TEXT = re.compile(r"0|[1-9][0-9]{0,18}")
MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects accepted in a client's JSON (HELLO, admin bodies)."""


def parse_id(text: str, what: str = "segment id") -> int:
    """An id written in a path: canonical ASCII decimal (no sign, whitespace, underscore or
    leading zero), within 0..2^63-1. One spelling per id, so ``/7`` and ``/007`` cannot name
    the same segment."""
    if not _ID_TEXT.fullmatch(text):
        raise WireError(
            "bad_id",
            f"{what} {text[:40]!r} must be decimal digits without sign, spaces or leading "
            "zeros, in 0..2^63-1",
        )
    value = int(text)
    if value > MAX_ID:
        raise WireError("bad_id", f"{what} {text!r} is outside 0..2^63-1")
    return value


def check_id(value: object, what: str = "segmentId") -> int:
    """An id carried in JSON: an integer (not a boolean) within 0..2^63-1."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ID:
        raise WireError("bad_id", f"{what} must be an integer in 0..2^63-1")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json_object(data: bytes | memoryview, what: str = "frame body") -> dict[str, Any]:
    """Strict JSON object from an untrusted peer, or :class:`WireError` ``bad_json``.

    UTF-8 only; ``NaN``/``Infinity`` refused; nesting beyond :data:`MAX_JSON_DEPTH` refused
    (Python's parser would otherwise raise ``RecursionError`` on thousands of levels); strings
    must be valid Unicode (no lone surrogates, which ``\\ud800`` escapes produce and which
    cannot be encoded again).
    """
    try:
        body = json.loads(bytes(data).decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        raise WireError("bad_json", f"{what} is not UTF-8 JSON") from None
    except RecursionError:
        raise WireError("bad_json", f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(body, dict):
        raise WireError("bad_json", f"{what} is not a JSON object")
    _check_json_value(body, what)
    return body


def _check_json_value(body: dict[str, Any], what: str) -> None:
    """Iterative walk (a recursive one would be the problem it guards against)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise WireError("bad_json", f"{what} holds an invalid string") from None
            continue
        if isinstance(value, dict):
            children: Iterable[Any] = [*value.keys(), *value.values()]
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise WireError("bad_json", f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)


def bucket_of(hashb: int, buckets: int) -> int:
    """Index of the entry bucket holding ``hashB`` when the ring has ``buckets`` buckets.

    Bucket ``i`` covers ``[i*65536//N, (i+1)*65536//N)`` (PIP-486 boundaries), so the bucket is
    the largest ``i`` with ``i*65536//N <= hashB``, which is ``((hashB+1)*N - 1) // 65536``.
    The unchecked hot-path twin of ``core.buckets.bucket_of`` (a test keeps them equal).
    """
    return ((hashb + 1) * buckets - 1) >> 16


# --- entries -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EntryHeader:
    producer_name: str
    sequence_id: int
    hashb_min: int
    hashb_max: int
    key_hash_sample: int | None
    message_count: int
    publish_time_ms: int
    payload_length: int
    flags: int

    @property
    def keyed(self) -> bool:
        return bool(self.flags & ENTRY_FLAG_KEYED)


@dataclass(frozen=True, slots=True)
class Message:
    """One application message. ``key`` decides the segment and the entry bucket."""

    value: bytes
    key: bytes | None = None
    timestamp_ms: int | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


def decode_entry_header(entry: bytes | memoryview) -> EntryHeader:
    """Parse and validate an entry's header; checks that the lengths add up to ``len(entry)``."""
    size = len(entry)
    if size < ENTRY_HEADER_SIZE:
        raise WireError("bad_entry", f"entry of {size} bytes is shorter than its header")
    if size > MAX_ENTRY_SIZE:
        raise WireError("entry_too_large", f"entry of {size} bytes exceeds {MAX_ENTRY_SIZE}")
    (fmt, flags, name_len, seq, hmin, hmax, sample, count, ptime, plen) = ENTRY_HEADER.unpack_from(
        entry, 0
    )
    if fmt != ENTRY_FORMAT:
        raise WireError("bad_entry", f"unknown entry format {fmt}")
    if flags & ~ENTRY_FLAGS_KNOWN:
        raise WireError("bad_entry", f"unknown entry flags 0x{flags:02x}")
    if ENTRY_HEADER_SIZE + name_len + plen != size:
        raise WireError("bad_entry", "entry lengths do not add up")
    if name_len == 0:
        raise WireError("bad_entry", "empty producer name")
    if hmin > hmax:
        raise WireError("bad_entry", "hashB min above max")
    if count == 0:
        raise WireError("bad_entry", "entry without messages")
    if seq > 0x7FFF_FFFF_FFFF_FFFF:
        raise WireError("bad_entry", "sequence id above 2^63-1")
    try:
        name = bytes(entry[ENTRY_HEADER_SIZE : ENTRY_HEADER_SIZE + name_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("bad_entry", "producer name is not UTF-8") from None
    return EntryHeader(
        producer_name=name,
        sequence_id=seq,
        hashb_min=hmin,
        hashb_max=hmax,
        key_hash_sample=sample if flags & ENTRY_FLAG_KEY_SAMPLE else None,
        message_count=count,
        publish_time_ms=ptime,
        payload_length=plen,
        flags=flags,
    )


def entry_bucket_hash(entry: bytes | memoryview) -> int | None:
    """``hashB`` min of an already validated entry, or None when the entry has no keys."""
    if entry[_OFF_FLAGS] & ENTRY_FLAG_KEYED:
        value: int = _U16.unpack_from(entry, _OFF_HASHB_MIN)[0]
        return value
    return None


def entry_payload(entry: bytes | memoryview, header: EntryHeader) -> memoryview:
    start = ENTRY_HEADER_SIZE + len(header.producer_name.encode("utf-8"))
    return memoryview(entry)[start : start + header.payload_length]


def encode_entry_raw(
    producer_name: bytes,
    sequence_id: int,
    payload: bytes,
    message_count: int,
    *,
    hashb_min: int = 0,
    hashb_max: int = 0,
    keyed: bool = False,
    key_hash_sample: int | None = None,
    publish_time_ms: int = 0,
) -> bytes:
    """Wrap an already encoded message payload (see :func:`encode_messages`) into an entry."""
    flags = (ENTRY_FLAG_KEYED if keyed else 0) | (
        ENTRY_FLAG_KEY_SAMPLE if key_hash_sample is not None else 0
    )
    header = ENTRY_HEADER.pack(
        ENTRY_FORMAT,
        flags,
        len(producer_name),
        sequence_id,
        hashb_min if keyed else 0,
        hashb_max if keyed else 0,
        key_hash_sample or 0,
        message_count,
        publish_time_ms,
        len(payload),
    )
    return b"".join((header, producer_name, payload))


def encode_messages(messages: Iterable[Message]) -> tuple[bytes, int, int, int, int | None, bool]:
    """Encode messages into a payload.

    Returns ``(payload, count, hashb_min, hashb_max, key_hash_sample, keyed)``: the bucket-hash
    range and one key's segment hash are computed here, once per key, so the broker never hashes.
    """
    parts: list[bytes] = []
    append = parts.append
    pack = MESSAGE_HEADER.pack
    hmin = 0xFFFF
    hmax = 0
    sample: int | None = None
    count = 0
    for msg in messages:
        count += 1
        key = msg.key
        flags = 0
        if key is not None:
            flags = MSG_FLAG_KEY
            raw = mmh3.hash(key, 0, signed=False)
            hb = raw & 0xFFFF
            if hb < hmin:
                hmin = hb
            if hb > hmax:
                hmax = hb
            if sample is None:
                sample = raw >> 16
        if msg.timestamp_ms is not None:
            flags |= MSG_FLAG_TIMESTAMP
        if msg.properties:
            flags |= MSG_FLAG_PROPERTIES
        append(pack(flags, len(key) if key is not None else 0, len(msg.value)))
        if key is not None:
            append(key)
        append(msg.value)
        if msg.timestamp_ms is not None:
            append(_I64.pack(msg.timestamp_ms))
        if msg.properties:
            append(_encode_properties(msg.properties))
    keyed = sample is not None
    return b"".join(parts), count, hmin if keyed else 0, hmax if keyed else 0, sample, keyed


def encode_keyed_values(
    keys: Sequence[bytes], values: Sequence[bytes], hashes: Sequence[int] | None = None
) -> tuple[bytes, int, int, int, int | None, bool]:
    """Fast path of :func:`encode_messages` for key/value pairs without timestamp or properties.

    ``hashes`` are the keys' 32-bit hashes when the caller has them already (a producer hashes
    each key once, to route it): the keys are then not hashed again."""
    if len(keys) != len(values) or (hashes is not None and len(hashes) != len(keys)):
        raise ValueError("keys, values and hashes differ in length")
    if hashes is None:
        hash32 = mmh3.hash
        hashes = [hash32(key, 0, signed=False) for key in keys]
    parts: list[bytes] = []
    append = parts.append
    pack = MESSAGE_HEADER.pack
    hmin = 0xFFFF
    hmax = 0
    for key, value, raw in zip(keys, values, hashes, strict=True):
        hb = raw & 0xFFFF
        if hb < hmin:
            hmin = hb
        if hb > hmax:
            hmax = hb
        append(pack(MSG_FLAG_KEY, len(key), len(value)))
        append(key)
        append(value)
    if not keys:
        return b"", 0, 0, 0, None, False
    return b"".join(parts), len(keys), hmin, hmax, hashes[0] >> 16, True


def encode_values(values: Sequence[bytes]) -> bytes:
    """Fast path: payload of unkeyed messages with values only."""
    pack = MESSAGE_HEADER.pack
    parts: list[bytes] = []
    append = parts.append
    for value in values:
        append(pack(0, 0, len(value)))
        append(value)
    return b"".join(parts)


def encode_entry(
    producer_name: str,
    sequence_id: int,
    messages: Sequence[Message],
    *,
    publish_time_ms: int = 0,
) -> bytes:
    payload, count, hmin, hmax, sample, keyed = encode_messages(messages)
    if count == 0:
        raise ValueError("an entry needs at least one message")
    return encode_entry_raw(
        producer_name.encode("utf-8"),
        sequence_id,
        payload,
        count,
        hashb_min=hmin,
        hashb_max=hmax,
        keyed=keyed,
        key_hash_sample=sample,
        publish_time_ms=publish_time_ms,
    )


def _encode_properties(props: Mapping[str, str]) -> bytes:
    out = [_U16.pack(len(props))]
    for k, v in props.items():
        kb = k.encode("utf-8")
        vb = v.encode("utf-8")
        out.append(_U16.pack(len(kb)))
        out.append(kb)
        out.append(_U32.pack(len(vb)))
        out.append(vb)
    return b"".join(out)


MessageFields: TypeAlias = tuple[bytes, bytes | None, int | None, dict[str, str] | None]
"""A decoded message as ``(value, key, timestamp_ms, properties)``; ``None``: no properties."""


def iter_messages(payload: bytes | memoryview, count: int | None = None) -> Iterator[Message]:
    """Decode the messages of an entry payload (the consumer side)."""
    for value, key, ts, props in iter_message_fields(payload, count):
        yield Message(value, key, ts, {} if props is None else props)


def iter_message_fields(
    payload: bytes | memoryview, count: int | None = None
) -> Iterator[MessageFields]:
    """:func:`iter_messages` without the :class:`Message` objects, for a caller that builds
    its own (the SDK's consumers: one object per message, not two).

    The payload is copied to ``bytes`` once (a memcpy) so that each key and value is one slice
    of it, not a memoryview slice and then its copy, and a message without properties gets no
    dict: 1.34x the messages per second at 100 B (``bench/decode.py``)."""
    buf = bytes(payload)
    end = len(buf)
    off = 0
    seen = 0
    unpack = MESSAGE_HEADER.unpack_from
    hsize = MESSAGE_HEADER.size
    try:
        while off < end:
            flags, klen, vlen = unpack(buf, off)
            off += hsize
            if flags & ~MSG_FLAGS_KNOWN:
                raise WireError("bad_message", f"unknown message flags 0x{flags:02x}")
            key: bytes | None = None
            if flags & MSG_FLAG_KEY:
                key = buf[off : off + klen]
                off += klen
            value = buf[off : off + vlen]
            off += vlen
            if off > end:
                raise WireError("bad_message", "message runs past the payload")
            ts: int | None = None
            if flags & MSG_FLAG_TIMESTAMP:
                ts = _I64.unpack_from(buf, off)[0]
                off += 8
            props: dict[str, str] | None = None
            if flags & MSG_FLAG_PROPERTIES:
                props = {}
                (n,) = _U16.unpack_from(buf, off)
                off += 2
                for _ in range(n):
                    (kl,) = _U16.unpack_from(buf, off)
                    off += 2
                    pk = buf[off : off + kl].decode("utf-8")
                    off += kl
                    (vl,) = _U32.unpack_from(buf, off)
                    off += 4
                    pv = buf[off : off + vl].decode("utf-8")
                    off += vl
                    props[pk] = pv
            if off > end:
                raise WireError("bad_message", "message runs past the payload")
            seen += 1
            yield value, key, ts, props
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError("bad_message", f"malformed message payload: {exc}") from None
    if count is not None and seen != count:
        raise WireError("bad_message", f"entry declares {count} messages, payload holds {seen}")


def decode_entry(entry: bytes | memoryview) -> tuple[EntryHeader, list[Message]]:
    header = decode_entry_header(entry)
    return header, list(iter_messages(entry_payload(entry, header), header.message_count))


# --- frames ------------------------------------------------------------------------------------


def frame_type(frame: bytes | memoryview) -> int:
    if len(frame) == 0:
        raise WireError("empty_frame", "empty frame")
    return frame[0]


def _json_body(frame: bytes | memoryview, offset: int) -> dict[str, Any]:
    if len(frame) <= offset:
        return {}
    return parse_json_object(memoryview(frame)[offset:])


def _json_frame(kind: int, body: Mapping[str, Any]) -> bytes:
    return bytes((kind,)) + json.dumps(body, separators=(",", ":")).encode("utf-8")


def encode_hello(version: int, body: Mapping[str, Any]) -> bytes:
    return _HELLO.pack(FRAME_HELLO, version) + json.dumps(body, separators=(",", ":")).encode()


def decode_hello(frame: bytes | memoryview) -> tuple[int, dict[str, Any]]:
    if len(frame) < _HELLO.size or frame[0] != FRAME_HELLO:
        raise WireError("bad_hello", "expected a HELLO frame")
    _, version = _HELLO.unpack_from(frame, 0)
    return version, _json_body(frame, _HELLO.size)


def encode_hello_ok(version: int, body: Mapping[str, Any]) -> bytes:
    return _HELLO.pack(FRAME_HELLO_OK, version) + json.dumps(body, separators=(",", ":")).encode()


def decode_hello_ok(frame: bytes | memoryview) -> tuple[int, dict[str, Any]]:
    if len(frame) < _HELLO.size or frame[0] != FRAME_HELLO_OK:
        raise WireError("bad_hello", "expected a HELLO_OK frame")
    _, version = _HELLO.unpack_from(frame, 0)
    return version, _json_body(frame, _HELLO.size)


def encode_error(code: str, message: str, **extra: Any) -> bytes:
    return _json_frame(FRAME_ERROR, {"code": code, "message": message, **extra})


def encode_entry_error(sequence_id: int, code: str, message: str) -> bytes:
    return _json_frame(
        FRAME_ENTRY_ERROR, {"sequenceId": sequence_id, "code": code, "message": message}
    )


def _int_field(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer")
    return value


@dataclass(frozen=True, slots=True)
class Successor:
    """A segment that continues a sealed one: ``{segmentId, range: {start, end}, brokerUrl}``,
    as the controller's ``terminate`` hands it to the broker and the broker's SEALED frame hands
    it to producers. ``broker_url`` is ``None`` while the successor is not placed."""

    segment_id: int
    start: int
    end: int
    broker_url: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "segmentId": self.segment_id,
            "range": {"start": self.start, "end": self.end},
            "brokerUrl": self.broker_url,
        }

    @classmethod
    def from_json(cls, body: object) -> Successor:
        """One successor as ``terminate`` and the SEALED frame carry it, checked; a
        :class:`ValueError` says what is wrong."""
        if not isinstance(body, Mapping):
            raise ValueError("successors must be objects {segmentId, range, brokerUrl}")
        hash_range = body.get("range")
        if not isinstance(hash_range, Mapping):
            raise ValueError("successor range must be an object {start, end}")
        start, end = _int_field(hash_range, "start"), _int_field(hash_range, "end")
        if not 0 <= start <= end < RING_SIZE:
            raise ValueError(f"invalid successor range [{start}, {end}]")
        url = body.get("brokerUrl")
        if url is not None and not isinstance(url, str):
            raise ValueError("brokerUrl must be a string")
        return cls(check_id(body.get("segmentId")), start, end, url)


def encode_sealed(body: Mapping[str, Any]) -> bytes:
    return _json_frame(FRAME_SEALED, body)


def encode_sealing(successors: Sequence[Successor]) -> bytes:
    """The broker began sealing the segment (version 5): a producer may connect to the
    successors now. Nothing may be routed to them before ``SEALED``: the seal can still fail."""
    return _json_frame(FRAME_SEALING, {"successors": [s.to_json() for s in successors]})


def decode_sealing(frame: bytes | memoryview) -> list[Successor]:
    if not len(frame) or frame[0] != FRAME_SEALING:
        raise WireError("malformed", "expected a SEALING frame")
    body = _json_body(frame, 1)
    successors = body.get("successors")
    if not isinstance(successors, list):
        raise WireError("malformed", "SEALING needs a list of successors")
    try:
        return [Successor.from_json(s) for s in successors]
    except ValueError as exc:
        raise WireError("malformed", f"SEALING: {exc}") from None


def decode_json_frame(frame: bytes | memoryview) -> dict[str, Any]:
    """Body of an ERROR, ENTRY_ERROR or SEALED frame."""
    return _json_body(frame, 1)


def encode_send(entries: Sequence[bytes]) -> bytes:
    """One SEND frame carrying one or more entries (pipelining happens across frames)."""
    if not 0 < len(entries) <= MAX_FRAME_ITEMS:
        raise ValueError("a SEND frame carries 1..65535 entries")
    parts: list[bytes] = [_COUNT.pack(FRAME_SEND, len(entries))]
    for entry in entries:
        parts.append(_SEND_ITEM.pack(len(entry)))
        parts.append(entry)
    return b"".join(parts)


def decode_send(frame: bytes | memoryview) -> list[memoryview]:
    """Entries of a SEND frame as zero-copy views (headers are not validated here)."""
    buf = memoryview(frame)
    size = len(buf)
    if size < _COUNT.size or buf[0] != FRAME_SEND:
        raise WireError("bad_frame", "expected a SEND frame")
    _, count = _COUNT.unpack_from(buf, 0)
    if count == 0:
        raise WireError("bad_frame", "SEND frame without entries")
    off = _COUNT.size
    out: list[memoryview] = []
    for _ in range(count):
        if off + 4 > size:
            raise WireError("bad_frame", "SEND frame truncated")
        (length,) = _SEND_ITEM.unpack_from(buf, off)
        off += 4
        if off + length > size:
            raise WireError("bad_frame", "SEND entry runs past the frame")
        out.append(buf[off : off + length])
        off += length
    if off != size:
        raise WireError("bad_frame", "trailing bytes after SEND entries")
    return out


@dataclass(frozen=True, slots=True)
class SendAck:
    sequence_id: int
    position: int
    status: int

    @property
    def duplicate(self) -> bool:
        return self.status == ACK_STATUS_DUPLICATE


def encode_send_ack(acks: Sequence[tuple[int, int, int]]) -> bytes:
    """``acks``: ``(sequence_id, position, status)`` in the order the entries were sent."""
    parts = [_COUNT.pack(FRAME_SEND_ACK, len(acks))]
    pack = _ACK_ITEM.pack
    parts.extend(pack(s, p, st) for s, p, st in acks)
    return b"".join(parts)


def decode_send_ack(frame: bytes | memoryview) -> list[SendAck]:
    if len(frame) < _COUNT.size or frame[0] != FRAME_SEND_ACK:
        raise WireError("bad_frame", "expected a SEND_ACK frame")
    _, count = _COUNT.unpack_from(frame, 0)
    if len(frame) != _COUNT.size + count * _ACK_ITEM.size:
        raise WireError("bad_frame", "SEND_ACK frame has the wrong length")
    return [SendAck(*t) for t in _ACK_ITEM.iter_unpack(memoryview(frame)[_COUNT.size :])]


def encode_flow(permits: int) -> bytes:
    return _FLOW.pack(FRAME_FLOW, permits)


def decode_flow(frame: bytes | memoryview) -> int:
    if len(frame) != _FLOW.size or frame[0] != FRAME_FLOW:
        raise WireError("bad_frame", "malformed FLOW frame")
    permits: int = _FLOW.unpack_from(frame, 0)[1]
    return permits


@dataclass(frozen=True, slots=True)
class DeliveredEntry:
    position: int
    redelivery_count: int
    entry: memoryview

    def header(self) -> EntryHeader:
        return decode_entry_header(self.entry)

    def messages(self) -> list[Message]:
        header = decode_entry_header(self.entry)
        return list(iter_messages(entry_payload(self.entry, header), header.message_count))


def encode_deliver(items: Sequence[tuple[int, int, bytes | memoryview]]) -> bytes:
    """``items``: ``(position, redelivery_count, entry)``."""
    parts: list[bytes | memoryview] = [_COUNT.pack(FRAME_DELIVER, len(items))]
    pack = _DELIVER_ITEM.pack
    for pos, redeliveries, entry in items:
        parts.append(pack(pos, min(redeliveries, 0xFFFF), len(entry)))
        parts.append(entry)
    return b"".join(parts)


def decode_deliver(frame: bytes | memoryview) -> list[DeliveredEntry]:
    buf = memoryview(frame)
    size = len(buf)
    if size < _COUNT.size or buf[0] != FRAME_DELIVER:
        raise WireError("bad_frame", "expected a DELIVER frame")
    _, count = _COUNT.unpack_from(buf, 0)
    off = _COUNT.size
    out: list[DeliveredEntry] = []
    isize = _DELIVER_ITEM.size
    for _ in range(count):
        if off + isize > size:
            raise WireError("bad_frame", "DELIVER frame truncated")
        pos, redeliveries, length = _DELIVER_ITEM.unpack_from(buf, off)
        off += isize
        if off + length > size:
            raise WireError("bad_frame", "DELIVER entry runs past the frame")
        out.append(DeliveredEntry(pos, redeliveries, buf[off : off + length]))
        off += length
    if off != size:
        raise WireError("bad_frame", "trailing bytes after DELIVER entries")
    return out


def encode_ack(positions: Sequence[int], *, cumulative: bool = False) -> bytes:
    if not 0 < len(positions) <= MAX_FRAME_ITEMS:
        raise ValueError("an ACK frame carries 1..65535 positions")
    if cumulative and len(positions) != 1:
        raise ValueError("a cumulative ACK carries exactly one position")
    kind = ACK_CUMULATIVE if cumulative else ACK_INDIVIDUAL
    return _ACK_HEAD.pack(FRAME_ACK, kind, len(positions)) + struct.pack(
        f"<{len(positions)}q", *positions
    )


def decode_ack(frame: bytes | memoryview) -> tuple[bool, tuple[int, ...]]:
    """Returns ``(cumulative, positions)``."""
    if len(frame) < _ACK_HEAD.size or frame[0] != FRAME_ACK:
        raise WireError("bad_ack", "expected an ACK frame")
    _, kind, count = _ACK_HEAD.unpack_from(frame, 0)
    if kind not in (ACK_INDIVIDUAL, ACK_CUMULATIVE):
        raise WireError("bad_ack", f"unknown ack kind {kind}")
    if count == 0 or (kind == ACK_CUMULATIVE and count != 1):
        raise WireError("bad_ack", "wrong number of positions in ACK")
    if len(frame) != _ACK_HEAD.size + 8 * count:
        raise WireError("bad_ack", "ACK frame has the wrong length")
    positions: tuple[int, ...] = struct.unpack_from(f"<{count}q", frame, _ACK_HEAD.size)
    if min(positions) < 0:
        raise WireError("bad_ack", "negative position in ACK")
    return kind == ACK_CUMULATIVE, positions


_BATCH_INDEXES_HEAD = struct.Struct("<qI")

PartialAcks: TypeAlias = dict[int, frozenset[int]]
"""Entry position -> the batch indexes of its messages that are acknowledged."""


def _encode_batch_indexes(items: Mapping[int, Iterable[int]]) -> bytes:
    out = bytearray()
    for position, indexes in items.items():
        idx = sorted(set(indexes))
        if position < 0 or not idx or idx[0] < 0 or idx[-1] > 0xFFFFFFFF:
            raise ValueError(f"bad batch indexes {idx!r} of position {position}")
        out += _BATCH_INDEXES_HEAD.pack(position, len(idx))
        out += struct.pack(f"<{len(idx)}I", *idx)
    return bytes(out)


def _decode_batch_indexes(
    frame: bytes | memoryview, offset: int, count: int, code: str
) -> PartialAcks:
    size = len(frame)
    out: PartialAcks = {}
    for _ in range(count):
        if offset + _BATCH_INDEXES_HEAD.size > size:
            raise WireError(code, "batch indexes truncated")
        position, n = _BATCH_INDEXES_HEAD.unpack_from(frame, offset)
        offset += _BATCH_INDEXES_HEAD.size
        if position < 0 or n == 0 or offset + 4 * n > size:
            raise WireError(code, "bad batch indexes item")
        indexes = frozenset(struct.unpack_from(f"<{n}I", frame, offset))
        offset += 4 * n
        out[position] = out.get(position, frozenset()) | indexes
    if offset != size:
        raise WireError(code, "trailing bytes after the batch indexes")
    return out


def encode_partial_ack(items: Mapping[int, Iterable[int]]) -> bytes:
    """Version 4: acknowledge the messages at these batch indexes of these entries."""
    if not 0 < len(items) <= MAX_FRAME_ITEMS:
        raise ValueError("a partial ACK frame carries 1..65535 entries")
    return _ACK_HEAD.pack(FRAME_ACK, ACK_PARTIAL, len(items)) + _encode_batch_indexes(items)


def is_partial_ack(frame: bytes | memoryview) -> bool:
    return len(frame) >= 2 and frame[0] == FRAME_ACK and frame[1] == ACK_PARTIAL


def decode_partial_ack(frame: bytes | memoryview) -> PartialAcks:
    if len(frame) < _ACK_HEAD.size or not is_partial_ack(frame):
        raise WireError("bad_ack", "expected a partial ACK frame")
    count = _ACK_HEAD.unpack_from(frame, 0)[2]
    if count == 0:
        raise WireError("bad_ack", "a partial ACK names no entry")
    return _decode_batch_indexes(frame, _ACK_HEAD.size, count, "bad_ack")


def encode_acked_indexes(items: Mapping[int, Iterable[int]]) -> bytes:
    """Version 4: sent right before the ``DELIVER`` frame of these entries - the messages at
    these batch indexes are acknowledged already (the consumer does not hand them out)."""
    if not 0 < len(items) <= MAX_FRAME_ITEMS:
        raise ValueError("an ACKED_INDEXES frame carries 1..65535 entries")
    return _COUNT.pack(FRAME_ACKED_INDEXES, len(items)) + _encode_batch_indexes(items)


def decode_acked_indexes(frame: bytes | memoryview) -> PartialAcks:
    if len(frame) < _COUNT.size or frame[0] != FRAME_ACKED_INDEXES:
        raise WireError("bad_frame", "expected an ACKED_INDEXES frame")
    count = _COUNT.unpack_from(frame, 0)[1]
    if count == 0:
        raise WireError("bad_frame", "ACKED_INDEXES names no entry")
    return _decode_batch_indexes(frame, _COUNT.size, count, "bad_frame")


def encode_nack(positions: Sequence[int]) -> bytes:
    if not 0 < len(positions) <= MAX_FRAME_ITEMS:
        raise ValueError("a NACK frame carries 1..65535 positions")
    return _COUNT.pack(FRAME_NACK, len(positions)) + struct.pack(f"<{len(positions)}q", *positions)


def decode_nack(frame: bytes | memoryview) -> tuple[int, ...]:
    if len(frame) < _COUNT.size or frame[0] != FRAME_NACK:
        raise WireError("bad_ack", "expected a NACK frame")
    _, count = _COUNT.unpack_from(frame, 0)
    if count == 0 or len(frame) != _COUNT.size + 8 * count:
        raise WireError("bad_ack", "NACK frame has the wrong length")
    positions: tuple[int, ...] = struct.unpack_from(f"<{count}q", frame, _COUNT.size)
    if min(positions) < 0:
        raise WireError("bad_ack", "negative position in NACK")
    return positions


def encode_end_of_segment(last_position: int) -> bytes:
    return _EOS.pack(FRAME_END_OF_SEGMENT, last_position)


def encode_end_of_buckets(last_position: int) -> bytes:
    """Version 2: every entry of the consumer's buckets up to the seal was delivered to it."""
    return _EOS.pack(FRAME_END_OF_BUCKETS, last_position)


def decode_end_of_buckets(frame: bytes | memoryview) -> int:
    if len(frame) != _EOS.size or frame[0] != FRAME_END_OF_BUCKETS:
        raise WireError("bad_frame", "malformed END_OF_BUCKETS frame")
    last: int = _EOS.unpack_from(frame, 0)[1]
    return last


_BUCKETS_DONE = struct.Struct("<BqH")


def encode_buckets_done(last_position: int, buckets: Sequence[int]) -> bytes:
    """Version 3: every entry of ``buckets`` (bucket indexes of a sealed segment, which the
    consumer named) up to the seal's ``last_position`` is acknowledged by the subscription."""
    if not 1 <= len(buckets) <= 0xFFFF or any(not 0 <= b < RING_SIZE for b in buckets):
        raise ValueError(f"BUCKETS_DONE needs 1..65535 bucket indexes < 65536, got {buckets!r}")
    return _BUCKETS_DONE.pack(FRAME_BUCKETS_DONE, last_position, len(buckets)) + struct.pack(
        f"<{len(buckets)}H", *buckets
    )


def decode_buckets_done(frame: bytes | memoryview) -> tuple[int, tuple[int, ...]]:
    """``(last position, bucket indexes)`` of a ``BUCKETS_DONE`` frame."""
    if len(frame) < _BUCKETS_DONE.size or frame[0] != FRAME_BUCKETS_DONE:
        raise WireError("bad_frame", "malformed BUCKETS_DONE frame")
    _, last, count = _BUCKETS_DONE.unpack_from(frame, 0)
    if count == 0 or len(frame) != _BUCKETS_DONE.size + 2 * count:
        raise WireError("bad_frame", "BUCKETS_DONE frame has the wrong length")
    buckets: tuple[int, ...] = struct.unpack_from(f"<{count}H", frame, _BUCKETS_DONE.size)
    return int(last), buckets


def decode_end_of_segment(frame: bytes | memoryview) -> int:
    if len(frame) != _EOS.size or frame[0] != FRAME_END_OF_SEGMENT:
        raise WireError("bad_frame", "malformed END_OF_SEGMENT frame")
    last: int = _EOS.unpack_from(frame, 0)[1]
    return last
