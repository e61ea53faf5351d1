"""Stream and checkpoint subscriptions: :class:`SubscriptionCoordinator` (segments, and
PIP-486 key-shared bucket sharing, hand-offs, per-bucket readiness, persisted helpers)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..layout import SegmentLayout
from .base import Coordinator
from .model import (
    DEFAULT_GRACE_PERIOD,
    AssignedSegment,
    AssignmentStrategy,
    ConsumerAssignment,
    CoordinatorResult,
    Unit,
    _as_segment_id,
    _group_units,
    parent_buckets,
    round_robin,
)


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
    sharers than buckets, or takes the place of a primary that reads other segments too (its
    segment's buckets already all have a reader): sealed segments first (a sealed backlog
    drains wide, PIP-486 use case 1), then the one with the most buckets per sharer. A shared
    segment's ``N`` buckets are split among its sharers (primary and helpers) to within one,
    moving as few as possible; each bucket (``(segment, bucket)`` unit) has exactly one owner.
    So with consumers <= consumable segments nothing changes (whole segments, ``buckets`` is
    ``None``), and with more every consumer up to ``sum(N)`` has work. A segment whose bucket
    count is not known counts as one bucket (never shared).

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
        self._releasing: dict[str, tuple[Unit, ...]] = {}
        """``_withheld`` by previous owner, sorted (each consumer's view lists its own)."""
        self._views: dict[str, tuple[object, ConsumerAssignment]] = {}
        """Consumer -> (what its view was built from, the view): each event compares every
        consumer's view before and after, most of them unchanged."""
        self._view_context: object = None
        """What every view is built from (layout, consumability, readiness, bucket counts):
        the cached views are dropped when it changes."""
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
            self._index_withheld()

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
        units = self._held.get(name, {})
        releasing = self._releasing.get(name, ())
        key = (tuple(held), units, releasing)
        cached = self._views.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        segments = self._layout.segments
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
        view = ConsumerAssignment(name, self._layout.epoch, tuple(entries), releasing)
        self._views[name] = (key, view)
        return view

    def _learn_buckets(self, buckets: Mapping[int, int]) -> None:
        self._views = {}
        super()._learn_buckets(buckets)

    def _index_withheld(self) -> None:
        releasing: dict[str, list[Unit]] = {}
        for unit, name in sorted(self._withheld.items()):
            releasing.setdefault(name, []).append(unit)
        self._releasing = {n: tuple(units) for n, units in releasing.items()}

    def _reconcile(self, *, was_consumable: frozenset[int]) -> None:
        super()._reconcile(was_consumable=was_consumable)
        self._drained_units = {s: b for s, b in self._drained_units.items() if s in self._blocked}
        self.reassignments_by_segment = {
            s: n for s, n in self.reassignments_by_segment.items() if s in self._blocked
        }
        self._ready = self._compute_ready()
        self._share()
        context = (
            self._layout.epoch,
            self._layout,
            self._consumable,
            self._blocked,
            self._ready,
            dict(self._buckets),
        )
        if context != self._view_context:
            self._views = {}
            self._view_context = context
        else:
            self._views = {n: v for n, v in self._views.items() if n in self._sessions}

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
        helped: dict[str, Counter[int]] = {}
        for (s, _), n in shares.items():
            helped.setdefault(n, Counter())[s] += 1
        helping = {n: max(c, key=lambda s: (c[s], -s)) for n, c in helped.items()}
        shares = {u: n for u, n in shares.items() if helping[n] == u[0]}
        # A segment all of whose buckets are with helpers was taken over from its primary.
        shared = Counter(s for s, _ in shares)
        taken = {s for s in primary if shared[s] == counts[s]}
        readers: dict[int, set[str]] = {s: set() if s in taken else {primary[s]} for s in primary}
        for (s, _), n in shares.items():
            readers[s].add(n)

        segments = self._layout.segments
        reading = {n for names in readers.values() for n in names}
        for n in sorted(live - reading):
            load = Counter(primary[s] for s in primary if s not in taken)
            # share a segment with fewer readers than buckets, or take the place of a primary
            # that reads others too (a pinned sealed segment, an N = 1 segment, a segment
            # whose every bucket already has a reader)
            candidates = [
                s
                for s in primary
                if primary[s] in live
                and (
                    len(readers[s]) < counts[s]
                    or (primary[s] in readers[s] and load[primary[s]] > 1)
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
                readers[best].discard(primary[best])
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
        self._index_withheld()
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
