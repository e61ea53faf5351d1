"""Consumer assignment for stream, checkpoint and queue subscriptions (DESIGN §3, PIP-468,
PIP-486).

One coordinator per subscription is a pure state machine: events go in (``register``,
``disconnect``, ``unregister``, ``tick``, ``layout_changed``, ``drained``), each with the current
time, and every event returns a :class:`CoordinatorResult` describing the assignment changes and
the effects the caller must carry out (write ``status.subscriptions``, push assignments to
connected consumers). Nothing here reads a clock or does I/O.

Two kinds share everything but the unit they hand out:

* :class:`SubscriptionCoordinator` (Stream subscriptions, stream and checkpoint consumers) hands
  out whole **segments**: one consumer per segment; with more consumers than consumable
  segments it spreads their entry buckets over the idle ones (PIP-486 key-shared, see the
  class).
* :class:`QueueCoordinator` (Queue subscriptions, queue consumers) hands out **units** - one
  entry bucket of one segment, ``(segment, bucket)`` - so several workers share a segment while
  every key (whose entries all fall in one bucket of its segment) has exactly one worker. The
  brokers dispatch a bucket's entries only to the consumer naming it (PIP-486), in position
  order, so a key is processed in order by one worker at a time.

Vocabulary used throughout:

* A segment is **tracked** by the subscription while it still has to be consumed: every active
  segment, and every sealed segment not yet reported drained. Segments pruned from the DAG are
  treated as drained.
* A tracked segment is **consumable** when none of its ancestors is still tracked, i.e. every
  parent (and, transitively, every grandparent) is drained or pruned. Initial segments are
  consumable at once; split, merge and rebucket children are gated alike. A segment drains as a
  whole (the broker ends it once every entry is acknowledged), so a queue subscription's units
  are gated by their segment.
* Gating is done by *flagging*, not by withholding: a child that is not consumable yet is still
  assigned (normally near its parent's consumers) with ``consumable=False`` and ``blocked_by``
  set to its undrained ancestors. The client must not read it before either the coordinator
  pushes it as consumable, or the client itself has drained (and reported) every segment in
  ``blocked_by`` - which it can only have done when it holds a share of all of them. Holding
  the lineage lets a consumer go from a parent to its children without waiting for a round trip.
* Stream only: a sealed, undrained segment is **pinned** to its consumer until that consumer
  reports it drained (or leaves for good): moving it would hand the same backlog to two readers
  in turn. Queue units of sealed segments do move (PIP-486: a sealed backlog fans out over the
  workers); the client hands a bucket over only after the application settled what it took of
  it, and the broker refuses a bucket to a second consumer while the first still holds it.

Sessions: a disconnected consumer keeps its registration and its units for the grace period.
Under ``sticky`` (and for queues) its assignment is frozen meanwhile - nothing is taken from it
and nothing new is given to it unless no consumer is connected - so a consumer returning within
the grace period finds exactly what it left with (less what was drained or pruned meanwhile).
One exception (stream, key-shared): when a helper gives up buckets of a segment whose primary
is in its grace period and no connected consumer is idle to take them, they go back to that
primary (its own segment; nobody reads them until it returns or its grace period ends).
Under ``round-robin`` a consumer in its grace period keeps its slot in the name order, as in
PIP-468.

Persistence (``to_status``) records which segments each consumer holds a share of. A queue
subscription restored from it (a new leader) gives each segment's holders contiguous slices of
its buckets in name order (:func:`bucket_slices`); the live assignment may differ (units move
one by one), so a failover can move a few buckets - safely, through the same hand-off.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from .buckets import bucket_of, bucket_range
from .layout import HashRange, SegmentLayout, descriptor

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "AssignedSegment",
    "AssignmentChange",
    "AssignmentStrategy",
    "ConsumerAssignment",
    "ConsumerSession",
    "Coordinator",
    "CoordinatorResult",
    "PersistEffect",
    "PushEffect",
    "QueueCoordinator",
    "SubscriptionCoordinator",
    "Unit",
    "bucket_slices",
    "parent_buckets",
    "round_robin",
]

DEFAULT_GRACE_PERIOD = 60.0

Unit = tuple[int, int]
"""A queue subscription's unit of assignment: ``(segment id, entry bucket index)``."""

K = TypeVar("K", bound=Hashable)


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


# -- the coordinators ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Snapshot:
    sessions: frozenset[str]
    epoch: int
    owner: dict[Any, str]
    holders: dict[int, frozenset[str]]
    drained: frozenset[int]
    consumable: frozenset[int]
    views: dict[str, ConsumerAssignment]
    persisted: object = None
    """What else :meth:`Coordinator.to_status` records (a change is written)."""


Counts = dict[str, int]


class Coordinator(Generic[K]):
    """What stream and queue coordinators share: sessions and grace periods, drain gating, the
    sticky balancing of items (``K``: a segment id, or a queue unit), results and persistence.

    Subclasses set their own attributes, then call ``super().__init__``.
    """

    _sealed_movable: ClassVar[bool] = False
    """Whether balancing may move items of sealed (consumable) segments."""
    _spread_pending: ClassVar[bool] = False
    """Not-yet-consumable items: ``True`` places each on a consumer with the fewest active
    items (near its parents when that is one of them); ``False`` prefers the parents' consumer
    up to a cap of the active items' fair share."""

    def __init__(
        self,
        layout: SegmentLayout,
        *,
        grace_period: float,
        drained: Iterable[int],
        buckets: Mapping[int, int] | None = None,
    ) -> None:
        if not math.isfinite(grace_period) or grace_period < 0:
            raise ValueError(f"grace period must be a finite number >= 0, got {grace_period!r}")
        self._grace_period = float(grace_period)
        self._buckets: dict[int, int] = {}
        self._learn_buckets(buckets or {})
        self._layout = layout
        self._drained: set[int] = set()
        for segment_id in drained:
            segment = layout.segments.get(segment_id)
            if segment is not None and segment.active:
                raise ValueError(f"segment {descriptor(segment)} is ACTIVE and cannot be drained")
            if segment is not None:
                self._drained.add(segment_id)
        # name -> grace deadline; None while connected
        self._sessions: dict[str, float | None] = {}
        self._owner: dict[K, str] = {}
        self._blocked: dict[int, tuple[int, ...]] = {}
        self._consumable: frozenset[int] = frozenset()
        self._reconcile(was_consumable=frozenset())

    # -- what subclasses define ---------------------------------------------------------------

    def _items(self, segment_id: int) -> list[K]:
        """The items of a tracked segment, in order (none while they cannot be assigned)."""
        raise NotImplementedError

    def _segment_of(self, item: K) -> int:
        raise NotImplementedError

    def _order(self, item: K) -> tuple[int, ...]:
        """Sort key of an item inside its segment's DAG position."""
        raise NotImplementedError

    def _view_buckets(self, items: Sequence[K]) -> tuple[int, ...] | None:
        raise NotImplementedError

    def _affinity(self, item: K) -> set[str]:
        """Consumers that should preferably get ``item`` (before eligibility and balance)."""
        raise NotImplementedError

    def _move_cost(self, item: K, rank: int, recipient_segments: set[int]) -> tuple[int, ...]:
        """Which of a donor's items balancing moves first (the smallest)."""
        raise NotImplementedError

    def _assign(self, was_consumable: frozenset[int]) -> None:
        self._assign_sticky(was_consumable)

    def _learn_buckets(self, buckets: Mapping[int, int]) -> None:
        """Bucket counts of segments (from the DAG)."""
        for segment_id, count in buckets.items():
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 65536:
                raise ValueError(f"bucket count of segment {segment_id} is invalid: {count!r}")
            self._buckets[segment_id] = count

    @property
    def buckets(self) -> dict[int, int]:
        """The known bucket count of each segment (also of segments the DAG announced before
        the layout that has them arrived)."""
        return dict(self._buckets)

    def buckets_changed(self, buckets: Mapping[int, int], now: float) -> CoordinatorResult:
        """Bucket counts learnt (or corrected) from the DAG."""

        def learn() -> None:
            self._learn_buckets(buckets)

        return self._event(now, learn)

    # -- queries ------------------------------------------------------------------------------

    @property
    def layout(self) -> SegmentLayout:
        return self._layout

    @property
    def grace_period(self) -> float:
        return self._grace_period

    @property
    def drained_segments(self) -> frozenset[int]:
        return frozenset(self._drained)

    def sessions(self) -> dict[str, ConsumerSession]:
        return {
            name: ConsumerSession(name, deadline is None, deadline)
            for name, deadline in sorted(self._sessions.items())
        }

    def connected(self) -> list[str]:
        return sorted(n for n, d in self._sessions.items() if d is None)

    def next_deadline(self) -> float | None:
        """When the next grace period runs out (schedule a :meth:`tick` then), if any."""
        deadlines = [d for d in self._sessions.values() if d is not None]
        return min(deadlines) if deadlines else None

    def tracked(self) -> frozenset[int]:
        """Segments the subscription still has to consume (active, or sealed and undrained)."""
        return frozenset(self._blocked)

    def is_consumable(self, segment_id: int) -> bool:
        return segment_id in self._consumable

    def holders(self, segment_id: int) -> tuple[str, ...]:
        """The consumers holding (a share of) ``segment_id``, by name."""
        return tuple(
            sorted({n for i, n in self._owner.items() if self._segment_of(i) == segment_id})
        )

    def unassigned(self) -> tuple[int, ...]:
        """Tracked segments of which something has no consumer (only while no consumer is
        registered, or while a queue segment's bucket count is unknown)."""
        return tuple(
            self._topo(
                s
                for s in self._blocked
                if not self._items(s) or any(i not in self._owner for i in self._items(s))
            )
        )

    def assignment(self, name: str) -> ConsumerAssignment:
        if name not in self._sessions:
            raise KeyError(f"consumer {name!r} is not registered")
        return self._view(name, self._by_owner().get(name, {}))

    def assignments(self) -> dict[str, ConsumerAssignment]:
        by_owner = self._by_owner()
        return {name: self._view(name, by_owner.get(name, {})) for name in sorted(self._sessions)}

    # -- events -------------------------------------------------------------------------------

    def register(self, name: str, now: float) -> CoordinatorResult:
        """A consumer connected (new, or back within its grace period)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"consumer name must be a non-empty string, got {name!r}")

        def connect() -> None:
            self._sessions[name] = None

        return self._event(now, connect, force_push=name)

    def disconnect(self, name: str, now: float) -> CoordinatorResult:
        """The consumer's session dropped: hold its items for the grace period."""

        def drop() -> None:
            if name in self._sessions and self._sessions[name] is None:
                if self._grace_period > 0:
                    self._sessions[name] = now + self._grace_period
                else:
                    del self._sessions[name]

        return self._event(now, drop)

    def unregister(self, name: str, now: float) -> CoordinatorResult:
        """The consumer closed for good: its items are redistributed at once."""

        def leave() -> None:
            self._sessions.pop(name, None)

        return self._event(now, leave)

    def tick(self, now: float) -> CoordinatorResult:
        """Expire the sessions whose grace period has run out (``now >= deadline``)."""
        return self._event(now)

    def layout_changed(
        self, layout: SegmentLayout, now: float, buckets: Mapping[int, int] | None = None
    ) -> CoordinatorResult:
        """A split, merge, rebucket or prune produced ``layout``; an older epoch is ignored.
        ``buckets`` adds bucket counts of segments (a queue subscription needs the counts of
        the segments it assigns; a stream subscription ignores them)."""

        def apply() -> str | None:
            if buckets is not None:
                self._learn_buckets(buckets)
            if layout.epoch < self._layout.epoch:
                return (
                    f"layout epoch {layout.epoch} is older than the current epoch "
                    f"{self._layout.epoch}"
                )
            self._layout = layout
            return None

        return self._event(now, apply)

    def drained(self, name: str | None, segment_id: int, now: float) -> CoordinatorResult:
        """``name`` reports that this subscription has consumed all of sealed ``segment_id``.

        A consumer may report only a consumable segment it holds (a share of). ``name=None`` is
        the controller's own observation (e.g. the broker reports no backlog on the sealed
        segment for this subscription) and is accepted for any sealed segment. Reports for
        pruned or already drained segments are accepted and change nothing.
        """

        def apply() -> str | None:
            rejected = self._check_drained(name, segment_id)
            if rejected is None and segment_id in self._layout.segments:
                self._drained.add(segment_id)
            return rejected

        return self._event(now, apply)

    # -- persistence --------------------------------------------------------------------------

    def to_status(self) -> dict[str, Any]:
        """The registrations for ``status.subscriptions`` (no liveness timers: a new leader
        starts a fresh grace period for everyone)::

            {"layoutEpoch": 7,
             "consumers": [{"name": "worker-a", "segments": [3, 4]}, ...],
             "drainedSegments": [0, 1]}

        ``segments`` are those the consumer holds (a share of). Lists are sorted;
        ``layoutEpoch`` is the layout the assignment was computed against.
        """
        by_owner = self._by_owner()
        return {
            "layoutEpoch": self._layout.epoch,
            "consumers": [
                {"name": name, "segments": sorted(by_owner.get(name, {}))}
                for name in sorted(self._sessions)
            ],
            "drainedSegments": sorted(self._drained),
        }

    @staticmethod
    def _parse_status(data: Mapping[str, Any]) -> tuple[list[int], list[tuple[str, list[int]]]]:
        """``drainedSegments`` and ``(name, segments)`` of every consumer of a status entry."""
        if not isinstance(data, Mapping):
            raise ValueError(f"subscription status must be a mapping, got {type(data).__name__}")
        consumers = data.get("consumers") or []
        drained = data.get("drainedSegments") or []
        if not isinstance(consumers, list) or not isinstance(drained, list):
            raise ValueError("subscription status: 'consumers' and 'drainedSegments' must be lists")
        parsed: list[tuple[str, list[int]]] = []
        names: set[str] = set()
        for entry in consumers:
            if not isinstance(entry, Mapping):
                raise ValueError(f"subscription status: consumer entry {entry!r} is not a mapping")
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"subscription status: consumer name {name!r} is not valid")
            if name in names:
                raise ValueError(f"subscription status: consumer {name!r} is listed twice")
            names.add(name)
            segments = entry.get("segments") or []
            if not isinstance(segments, list):
                raise ValueError(f"subscription status: segments of {name!r} must be a list")
            parsed.append((name, [_as_segment_id(s, f"segments of {name!r}") for s in segments]))
        return [_as_segment_id(i, "drainedSegments") for i in drained], parsed

    def _restore(self, names: Iterable[str], owner: dict[K, str], now: float) -> None:
        """Every consumer starts disconnected with a fresh grace period from ``now`` and keeps
        its items; items no longer tracked are dropped; new ones are assigned as after any
        layout change."""
        self._sessions = dict.fromkeys(names, now + self._grace_period)
        self._owner = owner
        self._reconcile(was_consumable=frozenset())

    # -- internals ----------------------------------------------------------------------------

    def _event(
        self,
        now: float,
        change: Callable[[], str | None] | None = None,
        *,
        force_push: str | None = None,
    ) -> CoordinatorResult:
        """Expire what ran out at ``now``, apply ``change`` (it returns a rejection, if any) and
        reconcile; the result compares the state before and after."""
        before = self._snapshot()
        expired = self._expire(now)
        rejected = change() if change is not None else None
        return self._finish(before, expired, force_push=force_push, rejected=rejected)

    def _check_drained(self, name: str | None, segment_id: int) -> str | None:
        segment = self._layout.segments.get(segment_id)
        if segment is None or segment_id in self._drained:
            return None
        if segment.active:
            return f"segment {descriptor(segment)} is ACTIVE; only sealed segments drain"
        if name is None:
            return None
        if name not in self.holders(segment_id):
            return f"segment {descriptor(segment)} is not assigned to consumer {name!r}"
        if segment_id not in self._consumable:
            blockers = ", ".join(str(i) for i in self._blocked.get(segment_id, ()))
            return (
                f"segment {descriptor(segment)} is not consumable yet: waiting for segments "
                f"{blockers} to be drained"
            )
        return None

    def _expire(self, now: float) -> tuple[str, ...]:
        expired = sorted(
            name
            for name, deadline in self._sessions.items()
            if deadline is not None and now >= deadline
        )
        for name in expired:
            del self._sessions[name]
        # released now, so that a consumer re-registering in the same event starts afresh,
        # exactly as if a tick had run at its deadline
        self._owner = {i: n for i, n in self._owner.items() if n in self._sessions}
        return tuple(expired)

    def _topo(self, ids: Iterable[int]) -> list[int]:
        segments = self._layout.segments
        return sorted(ids, key=lambda i: (segments[i].created_at_epoch, i))

    def _item_key(self, item: K) -> tuple[int, ...]:
        segment_id = self._segment_of(item)
        return (self._layout.segments[segment_id].created_at_epoch, *self._order(item))

    def _all_items(self) -> list[K]:
        """Every item of every tracked segment, parents' before children's."""
        return [item for s in self._topo(self._blocked) for item in self._items(s)]

    def _by_owner(self) -> dict[str, dict[int, list[K]]]:
        """Consumer → its segments in DAG order → its items of each."""
        by_owner: dict[str, dict[int, list[K]]] = {}
        for item in sorted(self._owner, key=self._item_key):
            segments = by_owner.setdefault(self._owner[item], {})
            segments.setdefault(self._segment_of(item), []).append(item)
        return by_owner

    def _holder_sets(self) -> dict[int, frozenset[str]]:
        found: dict[int, set[str]] = {}
        for item, name in self._owner.items():
            found.setdefault(self._segment_of(item), set()).add(name)
        return {s: frozenset(names) for s, names in found.items()}

    def _view(self, name: str, held: Mapping[int, Sequence[K]]) -> ConsumerAssignment:
        segments = self._layout.segments
        return ConsumerAssignment(
            consumer=name,
            layout_epoch=self._layout.epoch,
            segments=tuple(
                AssignedSegment(
                    segment_id=i,
                    hash_range=segments[i].hash_range,
                    sealed=not segments[i].active,
                    consumable=i in self._consumable,
                    blocked_by=self._blocked[i],
                    buckets=self._view_buckets(items),
                )
                for i, items in held.items()
            ),
        )

    def _snapshot(self) -> _Snapshot:
        by_owner = self._by_owner()
        return _Snapshot(
            sessions=frozenset(self._sessions),
            epoch=self._layout.epoch,
            owner=dict(self._owner),
            holders=self._holder_sets(),
            drained=frozenset(self._drained),
            consumable=self._consumable,
            views={n: self._view(n, by_owner.get(n, {})) for n in self._sessions},
            persisted=self._persisted_extra(),
        )

    def _persisted_extra(self) -> object:
        return None

    def _finish(
        self,
        before: _Snapshot,
        expired: tuple[str, ...],
        *,
        force_push: str | None = None,
        rejected: str | None = None,
    ) -> CoordinatorResult:
        self._reconcile(was_consumable=before.consumable)
        after = self._snapshot()

        changes: list[AssignmentChange] = []
        push: list[PushEffect] = []
        for name in sorted(before.sessions | after.sessions):
            departed = name not in after.sessions
            old = before.views.get(name)
            new = after.views.get(name) or ConsumerAssignment(name, self._layout.epoch)
            changed = (
                departed
                or (old is None and bool(new.segments))
                or (old is not None and old.segments != new.segments)
            )
            if changed:
                old_ids = set(old.segment_ids) if old else set()
                new_ids = set(new.segment_ids)
                changes.append(
                    AssignmentChange(
                        consumer=name,
                        assignment=new,
                        added=tuple(self._topo(new_ids - old_ids)),
                        removed=tuple(sorted(old_ids - new_ids)),
                    )
                )
            if not departed and self._sessions[name] is None and (changed or name == force_push):
                push.append(PushEffect(name, new))

        persist = None
        if (
            before.sessions != after.sessions
            or before.epoch != self._layout.epoch
            or before.holders != after.holders
            or before.drained != after.drained
            or before.persisted != after.persisted
        ):
            persist = PersistEffect(self.to_status())
        moved = {
            self._segment_of(item)
            for item, owner in after.owner.items()
            if item in before.owner and before.owner[item] != owner
        }
        return CoordinatorResult(
            changes=tuple(changes),
            persist=persist,
            push=tuple(push),
            moved=tuple(sorted(moved)),
            expired=expired,
            rejected=rejected,
        )

    def _reconcile(self, *, was_consumable: frozenset[int]) -> None:
        """Bring the assignment in line with the layout, drained set and sessions.

        ``was_consumable`` are the segments that were consumable when the event began: a
        segment that only became consumable now has not been read by anyone yet (or only just),
        so balancing prefers to move it over one a consumer has been reading.
        """
        segments = self._layout.segments
        # Keep counts of the layout's segments and of segments it does not have yet (the DAG
        # may announce them first).
        self._buckets = {
            s: n
            for s, n in self._buckets.items()
            if s in segments or s >= self._layout.next_segment_id
        }
        self._drained &= {i for i, s in segments.items() if not s.active}
        blocked: dict[int, tuple[int, ...]] = {}
        undrained_ancestors: dict[int, frozenset[int]] = {}
        for segment_id in self._topo(segments):
            ancestors: set[int] = set()
            for parent in segments[segment_id].parent_ids:
                if parent not in segments:
                    continue
                if parent not in self._drained:
                    ancestors.add(parent)
                ancestors |= undrained_ancestors[parent]
            undrained_ancestors[segment_id] = frozenset(ancestors)
            if segments[segment_id].active or segment_id not in self._drained:
                blocked[segment_id] = tuple(self._topo(ancestors))
        self._blocked = blocked
        self._consumable = frozenset(i for i, b in blocked.items() if not b)
        valid = {item for s in blocked for item in self._items(s)}
        self._owner = {
            i: name for i, name in self._owner.items() if i in valid and name in self._sessions
        }
        if not self._sessions:
            self._owner = {}
        else:
            self._assign(was_consumable)

    # -- sticky balancing of items --------------------------------------------------------------

    def _counted(self, item: K) -> tuple[bool, bool]:
        """(consumable, active) of the item's segment."""
        segment_id = self._segment_of(item)
        return segment_id in self._consumable, self._layout.segments[segment_id].active

    def _assign_sticky(self, was_consumable: frozenset[int]) -> None:
        live = self.connected()
        eligible = live or sorted(self._sessions)
        consumable_count = dict.fromkeys(self._sessions, 0)
        active_count = dict.fromkeys(self._sessions, 0)
        for item, name in self._owner.items():
            consumable, active = self._counted(item)
            consumable_count[name] += consumable
            active_count[name] += active

        unowned = [i for i in self._all_items() if i not in self._owner]
        for item in unowned:
            if not self._counted(item)[0]:
                continue
            least = min(consumable_count[n] for n in eligible)
            preferred = self._preferred(item, eligible, consumable_count, active_count)
            if preferred is None or consumable_count[preferred] != least:
                preferred = min(eligible, key=lambda n: (consumable_count[n], active_count[n], n))
            self._give(item, preferred, consumable_count, active_count)

        if live:
            self._balance(live, consumable_count, active_count, frozenset(unowned), was_consumable)

        # Not-yet-consumable items do not count for balance now; place them so that the active
        # items come out balanced once their parents drain, near their parents.
        pending = [i for i in unowned if not self._counted(i)[0]]
        total_active = sum(active_count[n] for n in eligible) + sum(
            1 for i in pending if self._counted(i)[1]
        )
        cap = math.ceil(total_active / len(eligible))
        for item in pending:
            active = self._counted(item)[1]
            preferred = self._preferred(item, eligible, consumable_count, active_count)
            if self._spread_pending:
                fewest = min(active_count[n] for n in eligible)
                crowded = preferred is not None and active_count[preferred] != fewest
            else:
                crowded = preferred is not None and active_count[preferred] >= cap
            if preferred is None or (active and crowded):
                preferred = min(eligible, key=lambda n: (active_count[n], consumable_count[n], n))
            self._give(item, preferred, consumable_count, active_count)

    def _give(self, item: K, name: str, consumable_count: Counts, active_count: Counts) -> None:
        self._owner[item] = name
        consumable, active = self._counted(item)
        consumable_count[name] += consumable
        active_count[name] += active

    def _preferred(
        self, item: K, eligible: list[str], consumable_count: Counts, active_count: Counts
    ) -> str | None:
        """The consumer of the item's :meth:`_affinity` with the fewest items, if it may take
        items now."""
        candidates = self._affinity(item) & set(eligible)
        if not candidates:
            return None
        return min(candidates, key=lambda n: (consumable_count[n], active_count[n], n))

    def _balance(
        self,
        live: list[str],
        consumable_count: Counts,
        active_count: Counts,
        placed_now: frozenset[K],
        was_consumable: frozenset[int],
    ) -> None:
        """Move consumable items from the fullest to the emptiest connected consumer until no
        movable item sits on a consumer two or more above another one.

        Pinned items (stream: sealed segments) and consumers in their grace period take no
        part. Each move lowers the sum of squared counts: the loop ends.
        """
        movable: dict[str, list[K]] = {n: [] for n in live}
        for item, name in self._owner.items():
            consumable, active = self._counted(item)
            if name in movable and consumable and (active or self._sealed_movable):
                movable[name].append(item)

        def rank(item: K) -> int:
            segment_id = self._segment_of(item)
            return 0 if item in placed_now else 1 if segment_id not in was_consumable else 2

        while True:
            donors = [n for n in live if movable[n]]
            if not donors:
                return
            donor = max(donors, key=lambda n: (consumable_count[n], active_count[n], n))
            recipient = min(live, key=lambda n: (consumable_count[n], active_count[n], n))
            if consumable_count[donor] <= consumable_count[recipient] + 1:
                return
            recipient_segments = {self._segment_of(i) for i in movable[recipient]}
            item = min(
                movable[donor], key=lambda i: self._move_cost(i, rank(i), recipient_segments)
            )
            movable[donor].remove(item)
            movable[recipient].append(item)
            self._owner[item] = recipient
            consumable_count[donor] -= 1
            consumable_count[recipient] += 1
            if self._counted(item)[1]:
                active_count[donor] -= 1
                active_count[recipient] += 1


class SubscriptionCoordinator(Coordinator[int]):
    """Segment-to-consumer assignment of one stream or checkpoint subscription, with
    key-shared bucket sharing (PIP-486) when there are more consumers than consumable segments.

    ``drained`` seeds the set of sealed segments this subscription has already drained (for a
    subscription created on a topic that has sealed segments, the caller decides which of them
    the subscription still has to read).

    **Two levels.** Every tracked segment has one *primary* consumer, assigned exactly as
    before (sticky or round-robin, sealed segments pinned, children near their parents). On top
    of that, every connected consumer with no consumable segment of its own (an *idle* one) is
    made a *helper* of one consumable segment whose primary is connected and that has fewer
    sharers than buckets: sealed segments first (a sealed backlog drains wide, PIP-486 use case
    1), then the one with the most buckets per sharer. A shared segment's ``N`` buckets are
    split among its sharers (primary and helpers) to within one, moving as few as possible;
    each bucket (``(segment, bucket)`` unit) has exactly one owner. So with consumers <=
    consumable segments nothing changes (whole segments, ``buckets`` is ``None``), and with
    more every consumer up to ``sum(N)`` has work. A segment whose bucket count is not known
    counts as one bucket (never shared).

    **Hand-off.** A unit whose owner changes while its previous owner is still registered is
    *withheld*: it is in nobody's assignment (the previous owner sees it in ``releasing``) until
    the previous owner reports it released (:meth:`released`: it has acknowledged every entry
    of the bucket it handed to its application and detached), or leaves (unregisters, or its
    grace period runs out). A whole segment moving from one unshared owner to another is not
    withheld: the broker lets the next owner attach once the previous one detached, as before.

    **Failover.** :meth:`to_status` also records each helper's ``shares`` (the buckets it
    reads of another consumer's segments) and :meth:`from_status` restores them, so a new
    leader rebuilds the same unit owners whatever order the consumers come back in: nothing
    moves, nothing is withheld (a moving bucket would pause its keys for a hand-off). What the
    leader could not persist before it died (a share changed after its last status write) is
    recomputed like any change, through the same hand-off.
    """

    def __init__(
        self,
        layout: SegmentLayout,
        *,
        strategy: AssignmentStrategy | str = AssignmentStrategy.STICKY,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        drained: Iterable[int] = (),
        buckets: Mapping[int, int] | None = None,
    ) -> None:
        try:
            self._strategy = AssignmentStrategy(strategy)
        except ValueError:
            choices = ", ".join(s.value for s in AssignmentStrategy)
            raise ValueError(
                f"unknown assignment strategy {strategy!r}: use one of {choices}"
            ) from None
        self._shares: dict[Unit, str] = {}
        """Units of consumable segments owned by another consumer than the primary."""
        self._withheld: dict[Unit, str] = {}
        """Unit -> the previous owner that has not released it yet."""
        self._effective: dict[Unit, str] = {}
        """Owner of every unit of every consumable segment with a primary (withheld or not)."""
        self._held: dict[str, dict[int, tuple[int, ...]]] = {}
        """Consumer -> consumable segment -> the buckets it reads now (not withheld)."""
        self.reassignments = 0
        """Units that changed owner since this coordinator was made (a counter)."""
        self.reassignments_by_segment: dict[int, int] = {}
        """The same, by segment (segments no longer tracked are dropped)."""
        self._drained_units: dict[int, set[int]] = {}
        """Sealed segment -> buckets reported consumed (consumers reading it by bucket)."""
        self._ready: dict[int, tuple[int, ...]] = {}
        """Segment not consumable yet -> its buckets that may be read already."""
        self._pending_shares: dict[Unit, str] = {}
        """Restored shares of segments whose bucket count was not known yet (the DAG had not
        announced it): applied once it is."""
        super().__init__(layout, grace_period=grace_period, drained=drained, buckets=buckets)

    @property
    def strategy(self) -> AssignmentStrategy:
        return self._strategy

    def owner_of(self, segment_id: int) -> str | None:
        """The segment's primary consumer."""
        return self._owner.get(segment_id)

    def bucket_count(self, segment_id: int) -> int:
        """The segment's bucket count (1 while unknown)."""
        return self._buckets.get(segment_id, 1)

    def unit_owners(self) -> dict[Unit, str]:
        """Owner of every unit of every consumable, assigned segment (withheld units too)."""
        return dict(self._effective)

    def withheld(self) -> dict[Unit, str]:
        """Units withheld for a hand-off -> the previous owner that has to release them."""
        return dict(self._withheld)

    def sharers(self, segment_id: int) -> tuple[str, ...]:
        """Consumers owning buckets of a consumable segment (one when it is not shared)."""
        return tuple(sorted({n for (s, _), n in self._effective.items() if s == segment_id}))

    def ready_buckets(self, segment_id: int) -> tuple[int, ...]:
        """Buckets of a segment not consumable yet that may be read already: for each
        undrained parent, every parent bucket holding keys of theirs (:func:`parent_buckets`) was
        reported consumed. Only while every undrained ancestor is a consumable parent (a
        grandparent still to drain holds everything back) and every bucket count is known."""
        return self._ready.get(segment_id, ())

    def drain_wide(self) -> tuple[int, ...]:
        """Sealed segments being drained by more than one consumer."""
        segments = self._layout.segments
        return tuple(
            s
            for s in sorted({s for s, _ in self._effective})
            if not segments[s].active and len(self.sharers(s)) > 1
        )

    def holders(self, segment_id: int) -> tuple[str, ...]:
        """The primary and the helpers of ``segment_id``, by name."""
        names = {n for (s, _), n in self._effective.items() if s == segment_id}
        primary = self._owner.get(segment_id)
        if primary is not None:
            names.add(primary)
        return tuple(sorted(names))

    def drained(
        self,
        name: str | None,
        segment_id: int,
        now: float,
        buckets: Iterable[int] | None = None,
    ) -> CoordinatorResult:
        """As :meth:`Coordinator.drained`; with ``buckets``, ``name`` consumed only those
        buckets of the sealed segment (a consumer reading it by bucket, which cannot see the
        other readers' progress): the segment is drained once every bucket was reported. The
        primary of a segment not consumable yet may report its :meth:`ready_buckets`."""
        if buckets is None or name is None:
            return super().drained(name, segment_id, now)
        reported = set(buckets)

        def apply() -> str | None:
            ready = set(self._ready.get(segment_id, ()))
            segment = self._layout.segments.get(segment_id)
            early = (
                segment is not None
                and not segment.active
                and name == self._owner.get(segment_id)
                and bool(reported)
                and reported <= ready
            )
            rejected = None if early else self._check_drained(name, segment_id)
            if rejected is not None or segment_id not in self._blocked:
                return rejected
            mine = ready if early else set()
            mine |= {b for (s, b), n in self._effective.items() if s == segment_id and n == name}
            if not reported <= mine:
                return (
                    f"buckets {sorted(reported - mine)} of segment {segment_id} are not "
                    f"assigned to consumer {name!r}"
                )
            done = self._drained_units.setdefault(segment_id, set())
            done |= reported
            if len(done) >= self.bucket_count(segment_id):
                self._drained.add(segment_id)
            return None

        return self._event(now, apply)

    def _persisted_extra(self) -> object:
        return dict(self._shares)

    def to_status(self) -> dict[str, Any]:
        """:meth:`Coordinator.to_status` plus, for a consumer reading buckets of segments
        whose primary is another consumer (a helper), ``shares``: ``[{"segmentId": 3,
        "buckets": [2, 3]}]`` (omitted when it has none)."""
        status = super().to_status()
        by_helper: dict[str, list[Unit]] = {}
        for unit, name in sorted(self._shares.items()):
            by_helper.setdefault(name, []).append(unit)
        for entry in status["consumers"]:
            units = by_helper.get(entry["name"])
            if units:
                entry["shares"] = _group_units(units)
        return status

    def released(
        self, name: str, segment_id: int, buckets: Iterable[int], now: float
    ) -> CoordinatorResult:
        """``name`` has let go of ``buckets`` of ``segment_id`` (every entry of them it handed
        to its application is acknowledged, and it detached): hand them to their new owner.
        Buckets not withheld from ``name`` are ignored (a repeated report)."""
        units = [(segment_id, b) for b in buckets]

        def apply() -> None:
            for unit in units:
                if self._withheld.get(unit) == name:
                    del self._withheld[unit]

        return self._event(now, apply)

    @classmethod
    def from_status(
        cls,
        data: Mapping[str, Any],
        layout: SegmentLayout,
        now: float,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        strategy: AssignmentStrategy | str = AssignmentStrategy.STICKY,
        buckets: Mapping[int, int] | None = None,
    ) -> SubscriptionCoordinator:
        """Restore :meth:`to_status` output under ``layout`` (a new leader taking over).

        Every consumer starts disconnected with a fresh grace period from ``now`` and keeps its
        segments. Segments no longer tracked are dropped; segments the status does not mention
        (the layout moved on after the write) are assigned as after any layout change. Call
        :meth:`to_status` afterwards and write it back if it differs from ``data``.
        """
        drained, consumers = cls._parse_status(data)
        coordinator = cls(
            layout, strategy=strategy, grace_period=grace_period, drained=drained, buckets=buckets
        )
        shares = _parse_shares(data)
        # bucket 0 exists whatever the count; others wait until the DAG announces the count
        coordinator._shares = {
            u: n for u, n in shares.items() if u[0] in coordinator._buckets or u[1] == 0
        }
        coordinator._pending_shares = {
            u: n for u, n in shares.items() if u not in coordinator._shares
        }
        owner: dict[int, str] = {}
        for name, segments in consumers:
            for segment_id in segments:
                if segment_id in owner:
                    raise ValueError(
                        f"subscription status: segment {segment_id} is assigned to both "
                        f"{owner[segment_id]!r} and {name!r}"
                    )
                owner[segment_id] = name
        coordinator._restore((name for name, _ in consumers), owner, now)
        return coordinator

    def _items(self, segment_id: int) -> list[int]:
        return [segment_id]

    def _segment_of(self, item: int) -> int:
        return item

    def _order(self, item: int) -> tuple[int, ...]:
        return (item,)

    def _view_buckets(self, items: Sequence[int]) -> tuple[int, ...] | None:
        return None

    def _view(self, name: str, held: Mapping[int, Sequence[int]]) -> ConsumerAssignment:
        """The primary's segments not consumable yet are whole; a consumable segment appears
        with the buckets ``name`` reads (``None``: all of them)."""
        segments = self._layout.segments
        units = self._held.get(name, {})
        ids = {i for i in held if i not in self._consumable} | set(units)
        entries = []
        for i in self._topo(ids):
            owned = units.get(i)
            whole = owned is None or len(owned) == self.bucket_count(i)
            entries.append(
                AssignedSegment(
                    segment_id=i,
                    hash_range=segments[i].hash_range,
                    sealed=not segments[i].active,
                    consumable=i in self._consumable,
                    blocked_by=self._blocked[i],
                    buckets=None if whole else owned,
                    ready_buckets=self._ready.get(i, ()) if i in held else (),
                )
            )
        releasing = tuple(sorted(u for u, n in self._withheld.items() if n == name))
        return ConsumerAssignment(name, self._layout.epoch, tuple(entries), releasing)

    def _reconcile(self, *, was_consumable: frozenset[int]) -> None:
        super()._reconcile(was_consumable=was_consumable)
        self._drained_units = {s: b for s, b in self._drained_units.items() if s in self._blocked}
        self.reassignments_by_segment = {
            s: n for s, n in self.reassignments_by_segment.items() if s in self._blocked
        }
        self._ready = self._compute_ready()
        self._share()

    def _compute_ready(self) -> dict[int, tuple[int, ...]]:
        segments = self._layout.segments
        ready: dict[int, tuple[int, ...]] = {}
        for s, blockers in self._blocked.items():
            n = self._buckets.get(s)
            if not blockers or n is None:
                continue
            parents = segments[s].parent_ids
            if any(
                p not in parents or p not in self._consumable or p not in self._buckets
                for p in blockers
            ):
                continue
            found = tuple(
                j
                for j in range(n)
                if all(
                    set(parent_buckets(j, n, self._buckets[p])) <= self._drained_units.get(p, set())
                    for p in blockers
                )
            )
            if found:
                ready[s] = found
        return ready

    def _share(self) -> None:
        """Place helpers, split shared segments' buckets, and track hand-offs (see the class
        docstring)."""
        live = set(self.connected())
        sessions = self._sessions
        primary = {s: n for s, n in self._owner.items() if s in self._consumable}
        counts = {s: self.bucket_count(s) for s in primary}
        for unit, n in list(self._pending_shares.items()):
            if unit[0] in self._buckets or unit[0] not in self._blocked:
                del self._pending_shares[unit]
                if unit[0] in self._buckets and unit not in self._shares:
                    self._shares[unit] = n

        # Shares still valid: of a consumable segment, owned by a registered consumer that is
        # not the primary and has no consumable segment of its own. A helper in its grace
        # period keeps its shares even when it got a consumable segment of its own meanwhile (a
        # child whose parents were drained or pruned): it is frozen, and taking them would
        # withhold them until it returns or its grace period ends anyway.
        shares: dict[Unit, str] = {}
        for (s, b), n in self._shares.items():
            valid = s in primary and b < counts[s] and n in sessions and n != primary[s]
            if valid and (n not in live or n not in primary.values()):
                shares[(s, b)] = n
        self._rehome_orphans(shares, primary, counts, live)
        # A helper reads one segment: keep the one where it has the most buckets.
        helping: dict[str, int] = {}
        for n in set(shares.values()):
            mine = [s for (s, _), m in shares.items() if m == n]
            helping[n] = max(set(mine), key=lambda s: (mine.count(s), -s))
        shares = {u: n for u, n in shares.items() if helping[n] == u[0]}
        # A segment all of whose buckets are with helpers was taken over from its primary.
        taken = {s for s in primary if sum(1 for u in shares if u[0] == s) == counts[s]}
        readers: dict[int, set[str]] = {s: set() if s in taken else {primary[s]} for s in primary}
        for (s, _), n in shares.items():
            readers[s].add(n)

        segments = self._layout.segments
        reading = {n for names in readers.values() for n in names}
        for n in sorted(live - reading):
            load = Counter(primary[s] for s in primary if s not in taken)
            # share a segment with fewer readers than buckets, or take over a whole one from a
            # primary that reads others too (a pinned sealed segment, an N = 1 segment)
            candidates = [
                s
                for s in primary
                if primary[s] in live
                and (
                    len(readers[s]) < counts[s]
                    or (readers[s] == {primary[s]} and load[primary[s]] > 1)
                )
            ]
            if not candidates:
                break
            best = max(
                candidates,
                key=lambda s: (not segments[s].active, counts[s] / len(readers[s]), -s),
            )
            if len(readers[best]) >= counts[best]:
                taken.add(best)
                readers[best] = set()
            readers[best].add(n)

        effective: dict[Unit, str] = {}
        for s, owner in primary.items():
            units = {(s, b): shares.get((s, b), owner) for b in range(counts[s])}
            if readers[s] != {owner} and owner in live:
                self._split(units, sorted(readers[s] & live), owner if s in taken else None)
            effective.update(units)

        # Hand-offs: a unit whose owner changed while its previous owner is registered.
        previous = self._effective
        was_whole = _whole_owners(previous)
        now_whole = _whole_owners(effective)
        withheld = {
            u: n
            for u, n in self._withheld.items()
            if u in effective and n in sessions and effective[u] != n
        }
        for unit, owner in effective.items():
            before = previous.get(unit)
            if before is None or before == owner:
                continue
            self.reassignments += 1
            s = unit[0]
            self.reassignments_by_segment[s] = self.reassignments_by_segment.get(s, 0) + 1
            if was_whole.get(s) == before and now_whole.get(s) == owner:
                continue
            if before in sessions and unit not in withheld:
                withheld[unit] = before
        self._withheld = withheld
        self._effective = effective
        self._shares = {u: n for u, n in effective.items() if n != primary[u[0]]}
        held: dict[str, dict[int, list[int]]] = {}
        for (s, b), n in sorted(effective.items()):
            if (s, b) not in withheld:
                held.setdefault(n, {}).setdefault(s, []).append(b)
        self._held = {n: {s: tuple(b) for s, b in by.items()} for n, by in held.items()}

    def _rehome_orphans(
        self,
        shares: dict[Unit, str],
        primary: Mapping[int, str],
        counts: Mapping[int, int],
        live: set[str],
    ) -> None:
        """Shares that stopped being valid (the helper left, or got a consumable segment of its
        own) go back to the segment's primary - unless the primary is in its grace period: a
        frozen consumer is given nothing while a consumer is connected, so they go to an idle
        connected consumer (no consumable segment of its own, no share of another segment; the
        one with the fewest shares). Only when there is none does the frozen primary take its
        own segment's buckets back (nobody reads them until it returns or its grace period
        ends)."""
        for unit in sorted(self._shares):
            s, b = unit
            if unit in shares or s not in primary or primary[s] in live or b >= counts[s]:
                continue
            helped = {n: {u[0] for u, m in shares.items() if m == n} for n in live}
            idle = [n for n in live if n not in primary.values() and helped[n] <= {s}]
            if idle:
                shares[unit] = min(idle, key=lambda n: (len(helped[n]), n))

    @staticmethod
    def _split(units: dict[Unit, str], names: list[str], giver: str | None) -> None:
        """Give each of ``names`` (connected readers) ``len // k`` or one more of the units
        they hold between them (and all of ``giver``'s: a primary whose segment is taken over),
        moving as few as possible: the consumers holding the most keep the extra ones; a donor
        gives its highest buckets."""
        if not names:
            return
        pool = sorted(u for u, n in units.items() if n in names or n == giver)
        if not pool:
            return
        owned: dict[str, list[Unit]] = {n: [] for n in names}
        spare: list[Unit] = []
        for unit in pool:
            if units[unit] in owned:
                owned[units[unit]].append(unit)
            else:
                spare.append(unit)
        base, extra = divmod(len(pool), len(names))
        order = sorted(names, key=lambda n: (-len(owned[n]), n))
        target = {n: base + (1 if i < extra else 0) for i, n in enumerate(order)}
        for n in order:
            while len(owned[n]) > target[n]:
                spare.append(owned[n].pop())
        spare.sort()
        for n in sorted(names):
            while len(owned[n]) < target[n]:
                unit = spare.pop()
                owned[n].append(unit)
                units[unit] = n

    def _affinity(self, item: int) -> set[str]:
        """The consumers of the segment's parents (a merge child's: every parent's)."""
        return {self._owner[p] for p in self._layout.segments[item].parent_ids if p in self._owner}

    def _move_cost(self, item: int, rank: int, recipient_segments: set[int]) -> tuple[int, ...]:
        return rank, -item

    def _assign(self, was_consumable: frozenset[int]) -> None:
        if self._strategy is AssignmentStrategy.ROUND_ROBIN:
            self._assign_round_robin()
        else:
            self._assign_sticky(was_consumable)

    def _assign_round_robin(self) -> None:
        members = sorted(self._sessions)
        owner: dict[int, str] = {}
        for name, ids in round_robin(self._layout, members).items():
            for segment_id in ids:
                owner[segment_id] = name
        sealed = sorted(
            (s for s in self._blocked if not self._layout.segments[s].active),
            key=lambda s: (self._layout.segments[s].hash_range.start, s),
        )
        for k, segment_id in enumerate(sealed):
            owner[segment_id] = self._owner.get(segment_id, members[k % len(members)])
        self._owner = owner


class QueueCoordinator(Coordinator[Unit]):
    """Assignment of the entry buckets of a Queue subscription's segments to its queue
    consumers (PIP-486): every ``(segment, bucket)`` unit of a tracked segment has exactly one
    consumer, balanced to within one consumable unit per connected consumer, moving as few
    units as possible. Units of sealed segments move too (a sealed backlog fans out); a new
    segment's units go next to the other units of the segment, else near its parents' units.

    ``buckets`` are the segments' bucket counts (from the DAG); a segment whose count is not
    known yet is tracked (its children stay gated) but not assigned until it is
    (:meth:`buckets_changed`, or ``layout_changed(..., buckets=)``).
    """

    _sealed_movable = True
    _spread_pending = True

    def __init__(
        self,
        layout: SegmentLayout,
        *,
        buckets: Mapping[int, int],
        grace_period: float = DEFAULT_GRACE_PERIOD,
        drained: Iterable[int] = (),
    ) -> None:
        super().__init__(layout, grace_period=grace_period, drained=drained, buckets=buckets)

    def owned(self, name: str) -> tuple[Unit, ...]:
        """The units ``name`` owns, in DAG order."""
        return self.assignment(name).units

    def to_status(self) -> dict[str, Any]:
        """As :meth:`Coordinator.to_status`, plus ``"type": "Queue"``."""
        return {**super().to_status(), "type": "Queue"}

    @classmethod
    def from_status(
        cls,
        data: Mapping[str, Any],
        layout: SegmentLayout,
        now: float,
        *,
        buckets: Mapping[int, int],
        grace_period: float = DEFAULT_GRACE_PERIOD,
    ) -> QueueCoordinator:
        """Restore :meth:`to_status` output: each segment's holders get contiguous slices of
        its buckets in name order (:func:`bucket_slices`), every consumer a fresh grace period
        from ``now``."""
        drained, consumers = cls._parse_status(data)
        coordinator = cls(layout, buckets=buckets, grace_period=grace_period, drained=drained)
        holders: dict[int, list[str]] = {}
        for name, segments in consumers:
            for segment_id in segments:
                holders.setdefault(segment_id, []).append(name)
        owner: dict[Unit, str] = {}
        for segment_id, names in holders.items():
            count = coordinator._buckets.get(segment_id)
            if count is None:
                continue
            for name, owned in bucket_slices(names, count).items():
                for bucket in owned:
                    owner[(segment_id, bucket)] = name
        coordinator._restore((name for name, _ in consumers), owner, now)
        return coordinator

    def _items(self, segment_id: int) -> list[Unit]:
        return [(segment_id, b) for b in range(self._buckets.get(segment_id, 0))]

    def _segment_of(self, item: Unit) -> int:
        return item[0]

    def _order(self, item: Unit) -> tuple[int, ...]:
        return item

    def _view_buckets(self, items: Sequence[Unit]) -> tuple[int, ...] | None:
        return tuple(b for _, b in items)

    def _affinity(self, item: Unit) -> set[str]:
        """The other holders of the unit's segment (fewer connections); for a segment nobody
        holds yet, the holders of its parents' units."""
        segment_id = item[0]
        same = {n for (s, _), n in self._owner.items() if s == segment_id}
        if same:
            return same
        parents = set(self._layout.segments[segment_id].parent_ids)
        return {n for (s, _), n in self._owner.items() if s in parents}

    def _move_cost(self, item: Unit, rank: int, recipient_segments: set[int]) -> tuple[int, ...]:
        """Units not read yet first, then a segment the recipient already reads (no new
        connection), then the newest segment's highest bucket (slices stay contiguous)."""
        segment_id, bucket = item
        return rank, 0 if segment_id in recipient_segments else 1, -segment_id, -bucket


def _parse_shares(data: Mapping[str, Any]) -> dict[Unit, str]:
    """The helpers' ``shares`` of a stream subscription's status entry (see
    :meth:`SubscriptionCoordinator.to_status`)."""
    shares: dict[Unit, str] = {}
    for entry in data.get("consumers") or []:
        name = entry["name"]
        listed = entry.get("shares") or []
        if not isinstance(listed, list):
            raise ValueError(f"subscription status: shares of {name!r} must be a list")
        for share in listed:
            if not isinstance(share, Mapping) or not isinstance(share.get("buckets"), list):
                raise ValueError(f"subscription status: share {share!r} of {name!r} is not valid")
            segment_id = _as_segment_id(share.get("segmentId"), f"shares of {name!r}")
            for bucket in share["buckets"]:
                if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
                    raise ValueError(
                        f"subscription status: bucket {bucket!r} in the shares of {name!r} is "
                        "not a bucket index"
                    )
                unit = (segment_id, bucket)
                if unit in shares:
                    raise ValueError(
                        f"subscription status: bucket {bucket} of segment {segment_id} is "
                        f"shared by both {shares[unit]!r} and {name!r}"
                    )
                shares[unit] = name
    return shares


def _whole_owners(units: Mapping[Unit, str]) -> dict[int, str]:
    """Segments all of whose units have one owner -> that owner."""
    owners: dict[int, set[str]] = {}
    for (s, _), n in units.items():
        owners.setdefault(s, set()).add(n)
    return {s: next(iter(n)) for s, n in owners.items() if len(n) == 1}


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
