"""What the coordinators hand out and report (DESIGN §3, PIP-468, PIP-486): the assignment
messages, results and effects, sessions, and the pure helpers they share."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..buckets import bucket_of, bucket_range
from ..layout import HashRange, SegmentLayout

DEFAULT_GRACE_PERIOD = 60.0

Unit = tuple[int, int]
"""A queue subscription's unit of assignment: ``(segment id, entry bucket index)``."""


class AssignmentStrategy(enum.StrEnum):
    STICKY = "sticky"
    ROUND_ROBIN = "round-robin"


def round_robin(layout: SegmentLayout, consumers: Iterable[str]) -> dict[str, list[int]]:
    """PIP-468: active segments by range start, consumers by name, segment ``k`` → ``k % C``.

    Every consumer gets a key, possibly with an empty list; no consumers gives ``{}``.
    """
    names = sorted(set(consumers))
    result: dict[str, list[int]] = {name: [] for name in names}
    if names:
        for k, segment in enumerate(layout.active()):
            result[names[k % len(names)]].append(segment.segment_id)
    return result


def parent_buckets(bucket: int, buckets: int, parent_buckets: int) -> range:
    """The buckets of a parent with ``parent_buckets`` buckets that hold keys of ``bucket`` (of
    ``buckets``) of its child: those whose ``hashB`` range overlaps the child bucket's. Every
    segment divides the same ``hashB`` ring, so a key's entries in the parent are in one of
    them (a split halving ``N``: two parent buckets per child bucket; a rollover doubling it:
    one parent bucket per two child buckets)."""
    start, end = bucket_range(bucket, buckets)
    return range(bucket_of(start, parent_buckets), bucket_of(end, parent_buckets) + 1)


def bucket_slices(holders: Iterable[str], buckets: int) -> dict[str, tuple[int, ...]]:
    """Contiguous slices of ``buckets`` bucket indexes for ``holders`` in name order: holder
    ``i`` of ``k`` gets ``[i * buckets // k, (i + 1) * buckets // k)``. With more holders than
    buckets the last ones get empty slices."""
    names = sorted(set(holders))
    k = min(len(names), buckets)
    slices: dict[str, tuple[int, ...]] = {name: () for name in names[k:]}
    for i, name in enumerate(names[:k]):
        slices[name] = tuple(range(i * buckets // k, (i + 1) * buckets // k))
    return slices


# -- what goes out ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignedSegment:
    """One segment of a consumer's assignment, with what the client needs to respect DAG order.

    ``blocked_by`` lists the segment's ancestors that are not drained yet for the subscription,
    parents before children; it is empty exactly when ``consumable`` is true. ``buckets`` are the
    entry buckets of the segment the consumer owns (queue subscriptions; stream subscriptions
    while the segment is shared); ``None`` means the whole segment. ``ready_buckets`` (stream
    subscriptions, a segment not consumable yet) are the buckets the consumer may read already:
    every bucket of the undrained parents that covers keys of theirs was consumed
    (:func:`parent_buckets`; per-bucket ordering across splits, merges and rollovers).
    """

    segment_id: int
    hash_range: HashRange
    sealed: bool
    consumable: bool
    blocked_by: tuple[int, ...] = ()
    buckets: tuple[int, ...] | None = None
    ready_buckets: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "segmentId": self.segment_id,
            "descriptor": f"{self.hash_range.hex()}-{self.segment_id}",
            "hashRange": self.hash_range.to_dict(),
            "state": "SEALED" if self.sealed else "ACTIVE",
            "consumable": self.consumable,
            "blockedBy": list(self.blocked_by),
            "readyBuckets": list(self.ready_buckets),
        }
        if self.buckets is not None:
            body["buckets"] = list(self.buckets)
        return body


@dataclass(frozen=True, slots=True)
class ConsumerAssignment:
    """The full assignment of one consumer; ``segments`` is in DAG order (parents first)."""

    consumer: str
    layout_epoch: int
    segments: tuple[AssignedSegment, ...] = ()
    releasing: tuple[Unit, ...] = ()
    """Stream subscriptions: units taken from this consumer and withheld from their new owner
    until this consumer reports them released (``SubscriptionCoordinator.released``)."""

    @property
    def segment_ids(self) -> tuple[int, ...]:
        return tuple(s.segment_id for s in self.segments)

    @property
    def consumable_ids(self) -> tuple[int, ...]:
        return tuple(s.segment_id for s in self.segments if s.consumable)

    @property
    def units(self) -> tuple[Unit, ...]:
        """The ``(segment, bucket)`` units of a queue assignment (none for a stream one)."""
        return tuple((s.segment_id, b) for s in self.segments for b in s.buckets or ())

    def to_dict(self) -> dict[str, Any]:
        """The body of the assignment message pushed to the consumer (camelCase JSON)."""
        body: dict[str, Any] = {
            "consumer": self.consumer,
            "layoutEpoch": self.layout_epoch,
            "segments": [s.to_dict() for s in self.segments],
        }
        if self.releasing:
            body["releasing"] = _group_units(self.releasing)
        return body


@dataclass(frozen=True, slots=True)
class AssignmentChange:
    """A consumer whose assignment changed: its new assignment (empty when it left) and the
    segment ids added and removed. A change of flags or buckets alone has empty
    ``added``/``removed``."""

    consumer: str
    assignment: ConsumerAssignment
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PersistEffect:
    """The registrations (or the layout epoch they refer to) changed: write ``status``, a
    snapshot of :meth:`Coordinator.to_status`, to the subscription's entry in
    ``status.subscriptions``."""

    status: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PushEffect:
    """Send ``assignment`` to the connected consumer ``consumer``."""

    consumer: str
    assignment: ConsumerAssignment


@dataclass(frozen=True, slots=True)
class CoordinatorResult:
    """What one event did.

    ``changes`` covers every consumer whose assignment changed, connected or not (a consumer that
    left appears with an empty assignment); ``push`` only connected ones, plus a registering
    consumer even when its assignment did not change. ``moved`` lists segments of which
    something was taken from one consumer and given to another. ``rejected`` explains an event
    that was refused (a drained report for a segment the consumer does not hold, a stale layout);
    nothing else changed then except the expiry of grace periods that had run out.
    """

    changes: tuple[AssignmentChange, ...] = ()
    persist: PersistEffect | None = None
    push: tuple[PushEffect, ...] = ()
    moved: tuple[int, ...] = ()
    expired: tuple[str, ...] = ()
    rejected: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerSession:
    """A registered consumer; ``grace_deadline`` is set while it is disconnected."""

    name: str
    connected: bool
    grace_deadline: float | None = None


def _group_units(units: Iterable[Unit]) -> list[dict[str, Any]]:
    """``[{"segmentId": s, "buckets": [b, ...]}, ...]`` by segment id."""
    grouped: dict[int, list[int]] = {}
    for segment_id, bucket in sorted(units):
        grouped.setdefault(segment_id, []).append(bucket)
    return [{"segmentId": s, "buckets": b} for s, b in grouped.items()]


def _as_segment_id(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"subscription status: {where}: {value!r} is not a segment id")
    return value
