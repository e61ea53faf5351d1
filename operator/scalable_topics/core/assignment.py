"""Consumer assignment for stream and checkpoint subscriptions (DESIGN §3, PIP-468).

One :class:`SubscriptionCoordinator` per subscription is a pure state machine: events go in
(``register``, ``disconnect``, ``unregister``, ``tick``, ``layout_changed``, ``drained``), each
with the current time, and every event returns a :class:`CoordinatorResult` describing the
assignment changes and the effects the caller must carry out (write ``status.subscriptions``,
push assignments to connected consumers). Nothing here reads a clock or does I/O.

Vocabulary used throughout:

* A segment is **tracked** by the subscription while it still has to be consumed: every active
  segment, and every sealed segment not yet reported drained. Segments pruned from the DAG are
  treated as drained.
* A tracked segment is **consumable** when none of its ancestors is still tracked, i.e. every
  parent (and, transitively, every grandparent) is drained or pruned. Initial segments are
  consumable at once; split, merge and rebucket children are gated alike.
* Gating is done by *flagging*, not by withholding: a child that is not consumable yet is still
  assigned (normally to its parent's consumer) with ``consumable=False`` and ``blocked_by`` set to
  its undrained ancestors. The client must not read it before either the coordinator pushes it
  as consumable, or the client itself has drained (and reported) every segment in
  ``blocked_by`` - which it can only have done when it holds all of them. Holding the whole
  lineage lets a consumer go from a parent to its children without waiting for a round trip.
* A sealed, undrained segment is **pinned** to its consumer until that consumer reports it drained
  (or leaves for good): moving it would hand the same backlog to two readers in turn.

Sessions: a disconnected consumer keeps its registration and its segments for the grace period.
Under ``sticky`` its assignment is frozen meanwhile - nothing is taken from it and nothing new is
given to it unless no consumer is connected - so a consumer returning within the grace period
finds exactly the segments it left with (less those drained or pruned meanwhile). Under
``round-robin`` a consumer in its grace period keeps its slot in the name order, as in PIP-468.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .layout import HashRange, SegmentLayout, descriptor

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "AssignedSegment",
    "AssignmentChange",
    "AssignmentStrategy",
    "ConsumerAssignment",
    "ConsumerSession",
    "CoordinatorResult",
    "PersistEffect",
    "PushEffect",
    "SubscriptionCoordinator",
    "round_robin",
]

DEFAULT_GRACE_PERIOD = 60.0


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


# -- what goes out ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignedSegment:
    """One segment of a consumer's assignment, with what the client needs to respect DAG order.

    ``blocked_by`` lists the segment's ancestors that are not drained yet for the subscription,
    parents before children; it is empty exactly when ``consumable`` is true.
    """

    segment_id: int
    hash_range: HashRange
    sealed: bool
    consumable: bool
    blocked_by: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "segmentId": self.segment_id,
            "descriptor": f"{self.hash_range.hex()}-{self.segment_id}",
            "hashRange": self.hash_range.to_dict(),
            "state": "SEALED" if self.sealed else "ACTIVE",
            "consumable": self.consumable,
            "blockedBy": list(self.blocked_by),
        }


@dataclass(frozen=True, slots=True)
class ConsumerAssignment:
    """The full assignment of one consumer; ``segments`` is in DAG order (parents first)."""

    consumer: str
    layout_epoch: int
    segments: tuple[AssignedSegment, ...] = ()

    @property
    def segment_ids(self) -> tuple[int, ...]:
        return tuple(s.segment_id for s in self.segments)

    @property
    def consumable_ids(self) -> tuple[int, ...]:
        return tuple(s.segment_id for s in self.segments if s.consumable)

    def to_dict(self) -> dict[str, Any]:
        """The body of the assignment message pushed to the consumer (camelCase JSON)."""
        return {
            "consumer": self.consumer,
            "layoutEpoch": self.layout_epoch,
            "segments": [s.to_dict() for s in self.segments],
        }


@dataclass(frozen=True, slots=True)
class AssignmentChange:
    """A consumer whose assignment changed: its new assignment (empty when it left) and the
    segment ids added and removed. A change of flags alone has empty ``added``/``removed``."""

    consumer: str
    assignment: ConsumerAssignment
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PersistEffect:
    """The registrations (or the layout epoch they refer to) changed: write ``status``, a
    snapshot of :meth:`SubscriptionCoordinator.to_status`, to the subscription's entry in
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
    consumer even when its assignment did not change. ``moved`` lists segments taken from one
    consumer and given to another. ``rejected`` explains an event that was refused (a drained
    report for a segment the consumer does not hold, a stale layout); nothing else changed then
    except the expiry of grace periods that had run out.
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


# -- the coordinator -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Snapshot:
    sessions: frozenset[str]
    epoch: int
    owner: dict[int, str]
    drained: frozenset[int]
    consumable: frozenset[int]
    views: dict[str, ConsumerAssignment]


class SubscriptionCoordinator:
    """Segment-to-consumer assignment of one stream or checkpoint subscription.

    ``drained`` seeds the set of sealed segments this subscription has already drained (for a
    subscription created on a topic that has sealed segments, the caller decides which of them
    the subscription still has to read).
    """

    def __init__(
        self,
        layout: SegmentLayout,
        *,
        strategy: AssignmentStrategy | str = AssignmentStrategy.STICKY,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        drained: Iterable[int] = (),
    ) -> None:
        try:
            self._strategy = AssignmentStrategy(strategy)
        except ValueError:
            choices = ", ".join(s.value for s in AssignmentStrategy)
            raise ValueError(
                f"unknown assignment strategy {strategy!r}: use one of {choices}"
            ) from None
        if not math.isfinite(grace_period) or grace_period < 0:
            raise ValueError(f"grace period must be a finite number >= 0, got {grace_period!r}")
        self._grace_period = float(grace_period)
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
        self._owner: dict[int, str] = {}
        self._blocked: dict[int, tuple[int, ...]] = {}
        self._consumable: frozenset[int] = frozenset()
        self._reconcile(was_consumable=frozenset())

    # -- queries ------------------------------------------------------------------------------

    @property
    def layout(self) -> SegmentLayout:
        return self._layout

    @property
    def strategy(self) -> AssignmentStrategy:
        return self._strategy

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

    def owner_of(self, segment_id: int) -> str | None:
        return self._owner.get(segment_id)

    def unassigned(self) -> tuple[int, ...]:
        """Tracked segments without a consumer (only while no consumer is registered)."""
        return tuple(self._topo(s for s in self._blocked if s not in self._owner))

    def assignment(self, name: str) -> ConsumerAssignment:
        if name not in self._sessions:
            raise KeyError(f"consumer {name!r} is not registered")
        return self._view(name, self._segments_by_owner().get(name, []))

    def assignments(self) -> dict[str, ConsumerAssignment]:
        by_owner = self._segments_by_owner()
        return {name: self._view(name, by_owner.get(name, [])) for name in sorted(self._sessions)}

    # -- events -------------------------------------------------------------------------------

    def register(self, name: str, now: float) -> CoordinatorResult:
        """A consumer connected (new, or back within its grace period)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"consumer name must be a non-empty string, got {name!r}")
        before = self._snapshot()
        expired = self._expire(now)
        self._sessions[name] = None
        return self._finish(before, expired, force_push=name)

    def disconnect(self, name: str, now: float) -> CoordinatorResult:
        """The consumer's session dropped: hold its segments for the grace period."""
        before = self._snapshot()
        expired = self._expire(now)
        if name in self._sessions and self._sessions[name] is None:
            if self._grace_period > 0:
                self._sessions[name] = now + self._grace_period
            else:
                del self._sessions[name]
        return self._finish(before, expired)

    def unregister(self, name: str, now: float) -> CoordinatorResult:
        """The consumer closed for good: its segments are redistributed at once."""
        before = self._snapshot()
        expired = self._expire(now)
        self._sessions.pop(name, None)
        return self._finish(before, expired)

    def tick(self, now: float) -> CoordinatorResult:
        """Expire the sessions whose grace period has run out (``now >= deadline``)."""
        before = self._snapshot()
        expired = self._expire(now)
        return self._finish(before, expired)

    def layout_changed(self, layout: SegmentLayout, now: float) -> CoordinatorResult:
        """A split, merge, rebucket or prune produced ``layout``; an older epoch is ignored."""
        before = self._snapshot()
        expired = self._expire(now)
        rejected = None
        if layout.epoch < self._layout.epoch:
            rejected = (
                f"layout epoch {layout.epoch} is older than the current epoch {self._layout.epoch}"
            )
        else:
            self._layout = layout
        return self._finish(before, expired, rejected=rejected)

    def drained(self, name: str | None, segment_id: int, now: float) -> CoordinatorResult:
        """``name`` reports that this subscription has consumed all of sealed ``segment_id``.

        A consumer may report only a consumable segment it holds. ``name=None`` is the
        controller's own observation (e.g. the broker reports no backlog on the sealed segment
        for this subscription) and is accepted for any sealed segment. Reports for pruned or
        already drained segments are accepted and change nothing.
        """
        before = self._snapshot()
        expired = self._expire(now)
        rejected = self._check_drained(name, segment_id)
        if rejected is None and segment_id in self._layout.segments:
            self._drained.add(segment_id)
        return self._finish(before, expired, rejected=rejected)

    # -- persistence --------------------------------------------------------------------------

    def to_status(self) -> dict[str, Any]:
        """The registrations for ``status.subscriptions`` (no liveness timers: a new leader
        starts a fresh grace period for everyone)::

            {"layoutEpoch": 7,
             "consumers": [{"name": "worker-a", "segments": [3, 4]}, ...],
             "drainedSegments": [0, 1]}

        Lists are sorted; ``layoutEpoch`` is the layout the assignment was computed against.
        """
        by_owner = self._segments_by_owner()
        return {
            "layoutEpoch": self._layout.epoch,
            "consumers": [
                {"name": name, "segments": sorted(by_owner.get(name, []))}
                for name in sorted(self._sessions)
            ],
            "drainedSegments": sorted(self._drained),
        }

    @classmethod
    def from_status(
        cls,
        data: Mapping[str, Any],
        layout: SegmentLayout,
        now: float,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        strategy: AssignmentStrategy | str = AssignmentStrategy.STICKY,
    ) -> SubscriptionCoordinator:
        """Restore :meth:`to_status` output under ``layout`` (a new leader taking over).

        Every consumer starts disconnected with a fresh grace period from ``now`` and keeps its
        segments. Segments no longer tracked are dropped; segments the status does not mention
        (the layout moved on after the write) are assigned as after any layout change. Call
        :meth:`to_status` afterwards and write it back if it differs from ``data``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"subscription status must be a mapping, got {type(data).__name__}")
        consumers = data.get("consumers") or []
        drained = data.get("drainedSegments") or []
        if not isinstance(consumers, list) or not isinstance(drained, list):
            raise ValueError("subscription status: 'consumers' and 'drainedSegments' must be lists")
        coordinator = cls(
            layout,
            strategy=strategy,
            grace_period=grace_period,
            drained=[_as_segment_id(i, "drainedSegments") for i in drained],
        )
        owner: dict[int, str] = {}
        sessions: dict[str, float | None] = {}
        for entry in consumers:
            if not isinstance(entry, Mapping):
                raise ValueError(f"subscription status: consumer entry {entry!r} is not a mapping")
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"subscription status: consumer name {name!r} is not valid")
            if name in sessions:
                raise ValueError(f"subscription status: consumer {name!r} is listed twice")
            sessions[name] = now + coordinator._grace_period
            segments = entry.get("segments") or []
            if not isinstance(segments, list):
                raise ValueError(f"subscription status: segments of {name!r} must be a list")
            for raw in segments:
                segment_id = _as_segment_id(raw, f"segments of {name!r}")
                if segment_id in owner:
                    raise ValueError(
                        f"subscription status: segment {segment_id} is assigned to both "
                        f"{owner[segment_id]!r} and {name!r}"
                    )
                owner[segment_id] = name
        coordinator._sessions = sessions
        coordinator._owner = owner
        coordinator._reconcile(was_consumable=frozenset())
        return coordinator

    # -- internals ----------------------------------------------------------------------------

    def _check_drained(self, name: str | None, segment_id: int) -> str | None:
        segment = self._layout.segments.get(segment_id)
        if segment is None or segment_id in self._drained:
            return None
        if segment.active:
            return f"segment {descriptor(segment)} is ACTIVE; only sealed segments drain"
        if name is None:
            return None
        if self._owner.get(segment_id) != name:
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
        self._owner = {s: n for s, n in self._owner.items() if n in self._sessions}
        return tuple(expired)

    def _topo(self, ids: Iterable[int]) -> list[int]:
        segments = self._layout.segments
        return sorted(ids, key=lambda i: (segments[i].created_at_epoch, i))

    def _segments_by_owner(self) -> dict[str, list[int]]:
        by_owner: dict[str, list[int]] = {}
        for segment_id in self._topo(self._owner):
            by_owner.setdefault(self._owner[segment_id], []).append(segment_id)
        return by_owner

    def _view(self, name: str, segment_ids: Iterable[int]) -> ConsumerAssignment:
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
                )
                for i in segment_ids
            ),
        )

    def _snapshot(self) -> _Snapshot:
        by_owner = self._segments_by_owner()
        return _Snapshot(
            sessions=frozenset(self._sessions),
            epoch=self._layout.epoch,
            owner=dict(self._owner),
            drained=frozenset(self._drained),
            consumable=self._consumable,
            views={n: self._view(n, by_owner.get(n, [])) for n in self._sessions},
        )

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
            or before.owner != after.owner
            or before.drained != after.drained
        ):
            persist = PersistEffect(self.to_status())
        moved = tuple(
            sorted(
                s
                for s, owner in after.owner.items()
                if s in before.owner and before.owner[s] != owner
            )
        )
        return CoordinatorResult(
            changes=tuple(changes),
            persist=persist,
            push=tuple(push),
            moved=moved,
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
        self._owner = {
            s: name for s, name in self._owner.items() if s in blocked and name in self._sessions
        }
        if not self._sessions:
            self._owner = {}
        elif self._strategy is AssignmentStrategy.ROUND_ROBIN:
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

    def _assign_sticky(self, was_consumable: frozenset[int]) -> None:
        segments = self._layout.segments
        live = sorted(n for n, d in self._sessions.items() if d is None)
        eligible = live or sorted(self._sessions)
        consumable_count = dict.fromkeys(self._sessions, 0)
        active_count = dict.fromkeys(self._sessions, 0)
        for segment_id, name in self._owner.items():
            if segment_id in self._consumable:
                consumable_count[name] += 1
            if segments[segment_id].active:
                active_count[name] += 1

        unowned = self._topo(s for s in self._blocked if s not in self._owner)
        for segment_id in unowned:
            if segment_id not in self._consumable:
                continue
            least = min(consumable_count[n] for n in eligible)
            preferred = self._preferred(segment_id, eligible, consumable_count, active_count)
            if preferred is None or consumable_count[preferred] != least:
                preferred = min(eligible, key=lambda n: (consumable_count[n], active_count[n], n))
            self._give(segment_id, preferred, consumable_count, active_count)

        if live:
            self._balance(live, consumable_count, active_count, frozenset(unowned), was_consumable)

        # Not-yet-consumable segments do not count for balance now; place them so that the
        # active segments come out balanced once their parents drain, near their parents.
        pending = [s for s in unowned if s not in self._consumable]
        total_active = sum(active_count[n] for n in eligible) + sum(
            1 for s in pending if segments[s].active
        )
        cap = math.ceil(total_active / len(eligible))
        for segment_id in pending:
            preferred = self._preferred(segment_id, eligible, consumable_count, active_count)
            if preferred is None or (
                segments[segment_id].active and active_count[preferred] >= cap
            ):
                preferred = min(eligible, key=lambda n: (active_count[n], consumable_count[n], n))
            self._give(segment_id, preferred, consumable_count, active_count)

    def _give(
        self,
        segment_id: int,
        name: str,
        consumable_count: dict[str, int],
        active_count: dict[str, int],
    ) -> None:
        self._owner[segment_id] = name
        if segment_id in self._consumable:
            consumable_count[name] += 1
        if self._layout.segments[segment_id].active:
            active_count[name] += 1

    def _preferred(
        self,
        segment_id: int,
        eligible: list[str],
        consumable_count: dict[str, int],
        active_count: dict[str, int],
    ) -> str | None:
        """The consumer of the segment's parent (of a merge child: the parent's consumer with
        the fewest segments), if it may take segments now."""
        candidates = {
            self._owner[p]
            for p in self._layout.segments[segment_id].parent_ids
            if p in self._owner and self._owner[p] in eligible
        }
        if not candidates:
            return None
        return min(candidates, key=lambda n: (consumable_count[n], active_count[n], n))

    def _balance(
        self,
        live: list[str],
        consumable_count: dict[str, int],
        active_count: dict[str, int],
        placed_now: frozenset[int],
        was_consumable: frozenset[int],
    ) -> None:
        """Move consumable active segments from the fullest to the emptiest connected consumer
        until no movable segment sits on a consumer two or more above another one.

        Sealed segments are pinned and consumers in their grace period are frozen, so they
        take no part. Each move lowers the sum of squared counts: the loop ends.
        """
        segments = self._layout.segments
        movable: dict[str, list[int]] = {n: [] for n in live}
        for segment_id, name in self._owner.items():
            if name in movable and segment_id in self._consumable and segments[segment_id].active:
                movable[name].append(segment_id)

        def cost(segment_id: int) -> tuple[int, int]:
            rank = 0 if segment_id in placed_now else 1 if segment_id not in was_consumable else 2
            return rank, -segment_id

        while True:
            donors = [n for n in live if movable[n]]
            if not donors:
                return
            donor = max(donors, key=lambda n: (consumable_count[n], active_count[n], n))
            recipient = min(live, key=lambda n: (consumable_count[n], active_count[n], n))
            if consumable_count[donor] <= consumable_count[recipient] + 1:
                return
            segment_id = min(movable[donor], key=cost)
            movable[donor].remove(segment_id)
            movable[recipient].append(segment_id)
            self._owner[segment_id] = recipient
            for counts in (consumable_count, active_count):
                counts[donor] -= 1
                counts[recipient] += 1


def _as_segment_id(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"subscription status: {where}: {value!r} is not a segment id")
    return value
