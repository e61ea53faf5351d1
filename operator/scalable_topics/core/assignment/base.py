"""The base :class:`Coordinator`: sessions and grace periods, drain gating, sticky balancing,
results and persistence, shared by the stream and queue coordinators."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ..layout import SegmentLayout, descriptor
from .model import (
    AssignedSegment,
    AssignmentChange,
    ConsumerAssignment,
    ConsumerSession,
    CoordinatorResult,
    PersistEffect,
    PushEffect,
    _as_segment_id,
)

K = TypeVar("K", bound=Hashable)


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
        self._last: _Snapshot | None = None
        """The snapshot the last event ended with: the state has not changed since (an event
        clears it before it changes anything), so the next event starts from it instead of
        rebuilding every consumer's view."""
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
        before = self._last or self._snapshot()
        self._last = None
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
        self._last = after

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
        self._last = None
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
