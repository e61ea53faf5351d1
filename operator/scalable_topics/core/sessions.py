"""Messages of the operator's WebSocket sessions (DESIGN §6, PIP-468), version 1.

Two sessions, both JSON text frames with a ``"v"`` (protocol version) and a ``"type"`` field:

* **DAG watch** (``/v1/topics/{namespace}/{name}/dag``, any replica): the server sends a
  :class:`DagMessage` on connect and another on every change of the DAG, its broker placement or
  the controller URL. The client sends nothing.
* **Consumer controller session** (``/v1/topics/{namespace}/{name}/consumers``, the leader of
  the topic's shard): the client sends :class:`RegisterMessage` first, then any number of
  :class:`DrainedMessage` and :class:`PositionMessage`, and :class:`UnregisterMessage` when it
  leaves for good. The server sends :class:`AssignmentMessage` whenever the consumer's
  assignment changes (and once right after registering), :class:`ErrorMessage` for a refused
  message, and :class:`RedirectMessage` before closing when the topic's leadership moves.
  Stream and checkpoint consumers are assigned segments of a Stream subscription (entry buckets
  of them when they outnumber the segments, PIP-486 key-shared); queue consumers are assigned
  entry buckets of the segments of a Queue subscription (PIP-486).

Versioning: a peer rejects a message whose ``v`` it does not speak (close code
:attr:`CloseCode.BAD_MESSAGE`); inside version 1 unknown fields are ignored, so fields can be
added without a version bump. Everything here is pure (pydantic models and builders); the
controller serialises with :func:`encode` and the client SDK parses with
:func:`parse_server_message`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from .assignment import ConsumerAssignment
from .buckets import bucket_boundaries
from .layout import HashRange, SegmentInfo, SegmentLayout, SegmentState, descriptor

__all__ = [
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "AssignedSegmentModel",
    "AssignmentMessage",
    "ClientMessage",
    "CloseCode",
    "ConsumerType",
    "DagMessage",
    "DagSegment",
    "DrainedMessage",
    "ErrorCode",
    "ErrorMessage",
    "HashRangeModel",
    "PositionMessage",
    "RedirectMessage",
    "RegisterMessage",
    "ReleasedMessage",
    "ReleasingModel",
    "ServerMessage",
    "SessionProtocolError",
    "UnregisterMessage",
    "assignment_message",
    "consumers_path",
    "dag_message",
    "dag_path",
    "encode",
    "parse_client_message",
    "parse_server_message",
    "to_json_dict",
]

PROTOCOL_VERSION: Final = 1

MAX_MESSAGE_BYTES = 64 * 1024
"""Largest client message the controller reads; client messages are small."""


class CloseCode(enum.IntEnum):
    """WebSocket close codes of the sessions (4000-4999 is the application range).

    The close reason repeats the last :class:`ErrorMessage` or :class:`RedirectMessage` for
    clients that only look at the close frame.
    """

    NORMAL = 1000
    """The consumer unregistered."""
    GOING_AWAY = 1001
    """The replica is shutting down: reconnect (through the DAG's ``controllerUrl``)."""
    MOVED = 4307
    """Leadership of the topic moved: a :class:`RedirectMessage` says where to reconnect."""
    BAD_MESSAGE = 4400
    """Malformed JSON, an unknown message type or version, or a message out of order."""
    UNKNOWN_TOPIC = 4404
    """No such topic (or it was deleted)."""
    SUPERSEDED = 4409
    """A newer session registered the same consumer name; this one is closed."""
    INVALID_SUBSCRIPTION = 4422
    """The subscription is not in the topic's spec, is a Queue subscription, or was removed."""
    UNAVAILABLE = 4503
    """The controller cannot serve the session now; retry after the redirect's ``retryAfter``."""
    UNAUTHENTICATED = 4401
    """No token, or one the API server refused (invalid, expired, wrong audience)."""
    FORBIDDEN = 4403
    """RBAC does not grant the verb the session needs (docs/security.md)."""
    AUTH_UNAVAILABLE = 1013
    """The API server could not be asked about the credentials; retry."""


class ErrorCode(enum.StrEnum):
    BAD_MESSAGE = "BadMessage"
    UNKNOWN_TOPIC = "UnknownTopic"
    INVALID_SUBSCRIPTION = "InvalidSubscription"
    SUPERSEDED = "Superseded"
    REJECTED = "Rejected"
    """A well-formed report the coordinator refused (e.g. a drained report for a segment the
    consumer no longer holds); not fatal, the session stays open."""
    UNAUTHENTICATED = "Unauthenticated"
    FORBIDDEN = "Forbidden"
    AUTH_UNAVAILABLE = "AuthUnavailable"
    """Refused credentials (docs/security.md); fatal (the first two: retrying does not help)."""


class ConsumerType(enum.StrEnum):
    STREAM = "stream"
    CHECKPOINT = "checkpoint"
    QUEUE = "queue"
    """A worker of a Queue subscription: assigned entry buckets, not whole segments."""


class SessionProtocolError(ValueError):
    """A message that does not follow the protocol; ``str()`` is safe to send back."""


class _Message(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    v: Literal[1] = 1


def dag_path(namespace: str, name: str) -> str:
    """Path of a topic's DAG watch session (any replica; plain GET returns the DAG as JSON)."""
    return f"/v1/topics/{namespace}/{name}/dag"


def consumers_path(namespace: str, name: str) -> str:
    """Path of a topic's consumer controller session (the leader of the topic's shard)."""
    return f"/v1/topics/{namespace}/{name}/consumers"


# -- DAG watch --------------------------------------------------------------------------------


class HashRangeModel(BaseModel):
    """An inclusive hash range ``{"start", "end"}`` (as in PIP-468's metadata)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    start: int = Field(ge=0, le=0xFFFF)
    end: int = Field(ge=0, le=0xFFFF)

    def to_hash_range(self) -> HashRange:
        return HashRange(self.start, self.end)


def _range_model(hash_range: HashRange) -> HashRangeModel:
    return HashRangeModel(start=hash_range.start, end=hash_range.end)


class _SegmentModel(BaseModel):
    """What every segment in a message says of itself."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    segment_id: int = Field(ge=0)
    descriptor: str
    hash_range: HashRangeModel
    state: SegmentState


class DagSegment(_SegmentModel):
    """One segment of the DAG, active or sealed, with where it lives and its entry buckets.

    ``brokerUrl`` is ``None`` while the segment is not placed (or its broker is unknown);
    ``buckets`` is ``None`` when the controller does not know the segment's bucket count, and
    then ``bucketBoundaries`` is empty. ``bucketBoundaries[i]`` is the first ``hashB`` of bucket
    ``i`` (``i * 65536 // buckets``).
    """

    parent_ids: tuple[int, ...] = ()
    child_ids: tuple[int, ...] = ()
    created_at_epoch: int = Field(0, ge=0)
    sealed_at_epoch: int = Field(0, ge=0)
    broker_url: str | None = None
    buckets: int | None = Field(None, ge=1)
    bucket_boundaries: tuple[int, ...] = ()

    def to_segment_info(self) -> SegmentInfo:
        return SegmentInfo(
            segment_id=self.segment_id,
            hash_range=self.hash_range.to_hash_range(),
            state=self.state,
            parent_ids=self.parent_ids,
            child_ids=self.child_ids,
            created_at_epoch=self.created_at_epoch,
            sealed_at_epoch=self.sealed_at_epoch,
        )


class DagMessage(_Message):
    """The whole DAG of a topic: pushed on connect and on every change (latest wins)."""

    type: Literal["dag"] = "dag"
    namespace: str
    topic: str
    epoch: int = Field(ge=0)
    next_segment_id: int = Field(ge=0)
    segments: tuple[DagSegment, ...]
    """Every segment, active and sealed, by id."""
    controller_url: str | None = None
    """Base URL of the controller leading the topic (consumer sessions go there); ``None`` while
    no leader is known."""

    def to_layout(self) -> SegmentLayout:
        """The :class:`SegmentLayout` this message describes (validated)."""
        layout = SegmentLayout(
            self.epoch,
            self.next_segment_id,
            {s.segment_id: s.to_segment_info() for s in self.segments},
        )
        layout.validate()
        return layout

    def brokers(self) -> dict[int, str]:
        """Segment id → broker URL, for the placed segments."""
        return {s.segment_id: s.broker_url for s in self.segments if s.broker_url}

    def active(self) -> list[DagSegment]:
        """Active segments by range start."""
        return sorted(
            (s for s in self.segments if s.state is SegmentState.ACTIVE),
            key=lambda s: s.hash_range.start,
        )


def dag_message(
    namespace: str,
    name: str,
    layout: SegmentLayout,
    *,
    brokers: Mapping[int, str],
    buckets: Mapping[int, int],
    controller_url: str | None,
) -> DagMessage:
    """The full DAG message of ``layout``: every segment with its range, state, links, broker
    URL (from ``brokers``), bucket count and boundaries (from ``buckets``), plus the epoch and
    the controller URL. Entries of ``brokers``/``buckets`` for segments not in the layout are
    ignored; missing ones come out as ``None``."""
    segments = []
    for segment_id in sorted(layout.segments):
        info = layout.segments[segment_id]
        count = buckets.get(segment_id)
        segments.append(
            DagSegment(
                segment_id=segment_id,
                descriptor=descriptor(info),
                hash_range=_range_model(info.hash_range),
                state=info.state,
                parent_ids=info.parent_ids,
                child_ids=info.child_ids,
                created_at_epoch=info.created_at_epoch,
                sealed_at_epoch=info.sealed_at_epoch,
                broker_url=brokers.get(segment_id) or None,
                buckets=count,
                bucket_boundaries=tuple(bucket_boundaries(count)) if count is not None else (),
            )
        )
    return DagMessage(
        namespace=namespace,
        topic=name,
        epoch=layout.epoch,
        next_segment_id=layout.next_segment_id,
        segments=tuple(segments),
        controller_url=controller_url or None,
    )


# -- consumer controller session: client → server ---------------------------------------------


class RegisterMessage(_Message):
    """First message of a consumer session: who is consuming what.

    ``consumer`` is the consumer's identity across reconnects (its grace-period key);
    ``consumerType`` is ``stream`` or ``checkpoint`` on a Stream subscription (both get
    segments, or buckets of them when they outnumber the segments; a checkpoint consumer keeps
    its own positions and reports them for information), ``queue`` on a Queue subscription
    (entry buckets of segments).
    """

    type: Literal["register"] = "register"
    subscription: str = Field(min_length=1, max_length=253)
    consumer: str = Field(min_length=1, max_length=253)
    consumer_type: ConsumerType = ConsumerType.STREAM


class DrainedMessage(_Message):
    """The consumer has consumed all of sealed segment ``segment`` for its subscription, or,
    with ``buckets``, all of those buckets of it (a consumer reading the segment by bucket)."""

    type: Literal["drained"] = "drained"
    segment: int = Field(ge=0)
    buckets: tuple[int, ...] | None = None


class PositionMessage(_Message):
    """Informational: the last position the consumer processed in ``segment``."""

    type: Literal["position"] = "position"
    segment: int = Field(ge=0)
    position: int = Field(ge=-1)


class ReleasedMessage(_Message):
    """The consumer has let go of ``buckets`` of ``segment`` that its assignment listed under
    ``releasing``: every entry of them it handed to the application is acknowledged and it has
    detached from the broker for them, so the controller may hand them to their new owner
    (PIP-486 hand-off). Sent only in answer to a ``releasing`` entry (servers that send none do
    not know this message)."""

    type: Literal["released"] = "released"
    segment: int = Field(ge=0)
    buckets: tuple[int, ...] = Field(min_length=1, max_length=65536)


class UnregisterMessage(_Message):
    """The consumer leaves for good: its segments are redistributed at once (no grace)."""

    type: Literal["unregister"] = "unregister"


ClientMessage = Annotated[
    RegisterMessage | DrainedMessage | PositionMessage | ReleasedMessage | UnregisterMessage,
    Field(discriminator="type"),
]

# -- consumer controller session: server → client ---------------------------------------------


class AssignedSegmentModel(_SegmentModel):
    """One assigned segment: :meth:`AssignedSegment.to_dict` plus the broker that hosts it.

    The client reads a segment only while ``consumable`` is true, or once it has itself drained
    and reported every segment in ``blockedBy`` (see :mod:`.assignment`). ``buckets`` are the
    indexes of the entry buckets of the segment the consumer owns and names when it attaches
    (as in the broker's consume ``HELLO``); ``None`` is the whole segment. (In the DAG, a
    segment's ``buckets`` is its bucket count.) ``ready_buckets``: of a segment not consumable
    yet, the buckets the consumer may read already (per-bucket ordering: the parents' buckets
    holding their keys are consumed).
    """

    consumable: bool
    blocked_by: tuple[int, ...] = ()
    broker_url: str | None = None
    buckets: tuple[int, ...] | None = None
    ready_buckets: tuple[int, ...] = ()


class ReleasingModel(BaseModel):
    """Buckets of a segment taken from the consumer and withheld from their new owner until
    the consumer sends :class:`ReleasedMessage` for them."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    segment_id: int = Field(ge=0)
    buckets: tuple[int, ...]


class AssignmentMessage(_Message):
    """A consumer's full assignment (not a delta): replaces whatever it held before.

    ``segments`` is in DAG order, parents before children. An empty list means the consumer
    holds nothing for now (more consumers than segments) and stays registered.
    """

    type: Literal["assignment"] = "assignment"
    namespace: str
    topic: str
    subscription: str
    consumer: str
    layout_epoch: int = Field(ge=0)
    segments: tuple[AssignedSegmentModel, ...] = ()
    releasing: tuple[ReleasingModel, ...] = ()


def assignment_message(
    namespace: str,
    topic: str,
    subscription: str,
    assignment: ConsumerAssignment,
    brokers: Mapping[int, str],
) -> AssignmentMessage:
    body = assignment.to_dict()
    return AssignmentMessage(
        namespace=namespace,
        topic=topic,
        subscription=subscription,
        consumer=body["consumer"],
        layout_epoch=body["layoutEpoch"],
        segments=tuple(
            AssignedSegmentModel.model_validate(
                {**segment, "brokerUrl": brokers.get(segment["segmentId"]) or None}
            )
            for segment in body["segments"]
        ),
        releasing=tuple(ReleasingModel.model_validate(r) for r in body.get("releasing", ())),
    )


class ErrorMessage(_Message):
    """A refused message. ``fatal``: the server closes the socket right after."""

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    fatal: bool = True


class RedirectMessage(_Message):
    """The session must continue elsewhere; the server closes the socket right after.

    ``url`` is the consumers endpoint on the new leader (``http(s)://``; the client switches to
    ``ws(s)://``). When ``url`` is ``None`` the new leader is not known yet: reconnect after
    ``retryAfter`` seconds to the ``controllerUrl`` of the topic's DAG.
    """

    type: Literal["redirect"] = "redirect"
    url: str | None = None
    retry_after: float = Field(1.0, ge=0)
    reason: str = ""


ServerMessage = Annotated[
    DagMessage | AssignmentMessage | ErrorMessage | RedirectMessage,
    Field(discriminator="type"),
]

_M = TypeVar("_M")

_CLIENT: TypeAdapter[
    RegisterMessage | DrainedMessage | PositionMessage | ReleasedMessage | UnregisterMessage
] = TypeAdapter(ClientMessage)
_SERVER: TypeAdapter[DagMessage | AssignmentMessage | ErrorMessage | RedirectMessage] = TypeAdapter(
    ServerMessage
)


def encode(message: BaseModel) -> str:
    """The JSON text frame of a message (camelCase keys, every field present)."""
    return message.model_dump_json(by_alias=True)


def to_json_dict(message: BaseModel) -> dict[str, Any]:
    """The message as a JSON-ready dict (what :func:`encode` serialises)."""
    data: dict[str, Any] = message.model_dump(mode="json", by_alias=True)
    return data


def _parse(text: str | bytes, adapter: TypeAdapter[_M], limit: int | None) -> _M:
    """One JSON text frame of this protocol version, validated by ``adapter``;
    :class:`SessionProtocolError` when it is not (``limit``: largest accepted size)."""
    if limit is not None and len(text) > limit:
        raise SessionProtocolError(f"message of {len(text)} bytes exceeds {limit}")
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SessionProtocolError(f"message is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SessionProtocolError(f"message must be a JSON object, got {type(data).__name__}")
    version = data.get("v")
    if version != PROTOCOL_VERSION:
        raise SessionProtocolError(
            f"unsupported protocol version {version!r}: this peer speaks v={PROTOCOL_VERSION}"
        )
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise SessionProtocolError(f"invalid message: {_describe(exc)}") from None


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"])
        parts.append(f"{where}: {item['msg']}" if where else str(item["msg"]))
    return "; ".join(parts)


def parse_client_message(
    text: str | bytes,
) -> RegisterMessage | DrainedMessage | PositionMessage | ReleasedMessage | UnregisterMessage:
    """Parse a frame sent by a consumer; :class:`SessionProtocolError` when malformed."""
    return _parse(text, _CLIENT, MAX_MESSAGE_BYTES)


def parse_server_message(
    text: str | bytes,
) -> DagMessage | AssignmentMessage | ErrorMessage | RedirectMessage:
    """Parse a frame sent by the controller; :class:`SessionProtocolError` when malformed."""
    return _parse(text, _SERVER, None)
