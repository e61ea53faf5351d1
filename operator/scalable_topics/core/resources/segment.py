"""The ``Segment`` resource: spec (fixed for the segment's life), the status its broker and the
leader write, and the manifest the leader creates.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field

from ..layout import HashRange, SegmentState
from ..transfer import TransferPhase
from .common import DNS_SUBDOMAIN_PATTERN, Int, Range, Timestamp, _Spec, _Status, _validate
from .names import (
    API_VERSION,
    MAX_BUCKETS,
    MAX_PARENTS,
    MAX_TOPIC_NAME,
    SEGMENT_KIND,
    segment_labels,
    segment_name,
    topic_owner_reference,
)


class SegmentPhase(enum.StrEnum):
    """A Segment resource's lifecycle: created (no broker yet), taking writes, sealed."""

    PENDING = "Pending"
    ACTIVE = "Active"
    SEALED = "Sealed"

    @classmethod
    def from_layout(cls, state: SegmentState) -> SegmentPhase:
        return cls.ACTIVE if state is SegmentState.ACTIVE else cls.SEALED


class SegmentSpec(_Spec):
    """A segment of a topic: fixed for its whole life (immutable)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "Segment spec is immutable"}
            ]
        }
    )

    topic: str = Field(
        min_length=1,
        max_length=MAX_TOPIC_NAME,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the owning ScalableTopic (same namespace).",
    )
    segment_id: Int = Field(ge=0, description="Segment id in the topic's DAG.")
    range: Range = Field(description="Hash range served by the segment.")
    parents: list[Int] = Field(
        default_factory=list, max_length=MAX_PARENTS, description="Parent segment ids."
    )
    buckets: Int = Field(1, ge=1, le=MAX_BUCKETS, description="Entry-bucket count (PIP-486).")


class BrokerRef(_Status):
    pod: str | None = Field(None, description="Broker pod hosting the segment.")
    url: str | None = Field(None, description="Broker URL for produce/consume.")


class SegmentLoad(_Status):
    """Rates written by the owning broker when one moved by more than 25 %."""

    msg_rate_in: float = Field(0.0, ge=0, description="Messages/s in.")
    bytes_rate_in: float = Field(0.0, ge=0, description="Bytes/s in.")
    msg_rate_out: float = Field(0.0, ge=0, description="Messages/s out.")
    bytes_rate_out: float = Field(0.0, ge=0, description="Bytes/s out.")
    updated_at: Timestamp | None = Field(None, description="When the sample was taken.")


class SegmentCorruption(_Status):
    """Written by the owning broker when it quarantined the segment: its log is damaged, it
    takes no writes, and consumers get nothing from ``position`` on (docs/operations.md)."""

    position: int = Field(ge=0, description="First position not served: the damaged record's.")
    file: str = Field(description="Log file holding the damaged record.")
    offset: int = Field(ge=0, description="Byte offset of the damaged record in that file.")
    reason: str = Field(description="What is damaged, e.g. checksum mismatch.")
    source: str = Field(description="Who found it: recovery (at start) or read.")
    detected_at: Timestamp | None = Field(None, description="When the broker found it.")


class TransferEndpoint(_Status):
    pod: str = Field(description="Broker pod.")
    url: str = Field(description="Broker URL.")


class SegmentTransfer(_Status):
    """An ownership transfer in flight (DESIGN §9, ``core.transfer.Transfer``): a new leader
    completes it (from ``Owned`` only forward) or rolls it back."""

    id: str = Field(description="Transfer id (also in events).")
    segment_id: int = Field(ge=0, description="The segment moving.")
    source: TransferEndpoint = Field(description="The broker it leaves.")
    destination: TransferEndpoint = Field(description="The broker it goes to.")
    phase: TransferPhase = Field(description="Releasing, Assigned, Owned or RollingBack.")
    trigger: str = Field("manual", description="manual, drain, shed or shutdown.")
    reason: str | None = Field(None, description="Why.")
    request_id: str | None = Field(None, description="Id of the manual request, if any.")
    started_at: Timestamp | None = Field(None, description="When the transfer was recorded.")


class SegmentStatus(_Status):
    state: SegmentPhase = Field(SegmentPhase.PENDING, description="Pending, Active or Sealed.")
    broker: BrokerRef | None = Field(None, description="Where the segment lives.")
    load: SegmentLoad | None = Field(None, description="Latest load sample.")
    corruption: SegmentCorruption | None = Field(
        None,
        description="Set by the broker while the segment is quarantined for a damaged log; "
        "removed when an operator truncated it.",
    )
    backlog: dict[str, int] = Field(
        default_factory=dict,
        description="Entries not acknowledged, per subscription (written by the owning broker "
        "when a count moved by more than 25 % or a subscription came or went).",
    )
    sealed_at: Timestamp | None = Field(None, description="When the segment was sealed.")
    created_at_epoch: int | None = Field(
        None,
        ge=0,
        description="Layout epoch that created the segment (recorded from status.layout; a lost "
        "layout is rebuilt from the Segments).",
    )
    sealed_at_epoch: int | None = Field(
        None, ge=0, description="Layout epoch that sealed the segment (recorded as above)."
    )
    recorded_at_epoch: int | None = Field(
        None,
        ge=0,
        description="Layout epoch when a rebuild of a lost layout, or a recovery of this "
        "Segment from its broker, last wrote it: a later rebuild goes above it too.",
    )
    subscriptions: list[str] = Field(
        default_factory=list,
        description="Subscriptions the operator has provisioned on the segment's broker.",
    )
    transfer: SegmentTransfer | None = Field(
        None, description="Ownership transfer in flight (cleared when it ends)."
    )


class Segment(_Status):
    model_config = ConfigDict(extra="forbid")

    api_version: Literal["scalabletopics.io/v1alpha1"] = Field(
        "scalabletopics.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["Segment"] = "Segment"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SegmentSpec
    status: SegmentStatus | None = None


def parse_segment_spec(spec: Mapping[str, Any]) -> SegmentSpec:
    return _validate(SegmentSpec, spec, "Segment spec", "spec")


def parse_segment(obj: Mapping[str, Any]) -> Segment:
    return _validate(Segment, obj, "Segment", "")


def segment_manifest(
    *,
    topic: str,
    namespace: str,
    topic_uid: str,
    segment_id: int,
    hash_range: HashRange,
    parents: Sequence[int] = (),
    buckets: int = 1,
) -> dict[str, Any]:
    """The Segment object the leader creates: named, labelled and owned by its topic (so it is
    garbage-collected with it), with a validated spec."""
    spec = SegmentSpec(
        topic=topic,
        segment_id=segment_id,
        range=Range.of(hash_range),
        parents=list(parents),
        buckets=buckets,
    )
    return {
        "apiVersion": API_VERSION,
        "kind": SEGMENT_KIND,
        "metadata": {
            "name": segment_name(topic, segment_id),
            "namespace": namespace,
            "labels": segment_labels(topic, segment_id),
            "ownerReferences": [topic_owner_reference(topic, topic_uid)],
        },
        "spec": spec.model_dump(by_alias=True, mode="json"),
    }
