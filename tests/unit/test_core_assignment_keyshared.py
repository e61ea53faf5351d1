"""Key-shared stream/checkpoint assignment (PIP-486, issue 14): buckets of consumable segments
spread over consumers beyond the segment count, hand-offs withheld until released."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from operator import methodcaller
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from scalable_topics.core.assignment import (
    CoordinatorResult,
    SubscriptionCoordinator,
    Unit,
)
from scalable_topics.core.buckets import initial_layout_buckets, layout_buckets
from scalable_topics.core.layout import SegmentLayout

from .test_core_assignment import NAMES, EventRules

# -- helpers ---------------------------------------------------------------------------------


def view_units(coordinator: SubscriptionCoordinator) -> dict[Unit, str]:
    """Units the consumers' assignments let them read (consumable segments), checked to be
    given to one consumer at most."""
    found: dict[Unit, str] = {}
    for name, assignment in coordinator.assignments().items():
        for segment in assignment.segments:
            if not segment.consumable:
                assert segment.buckets is None
                continue
            n = coordinator.bucket_count(segment.segment_id)
            buckets = range(n) if segment.buckets is None else segment.buckets
            assert buckets, f"{name} lists {segment.segment_id} with no bucket"
            for b in buckets:
                unit = (segment.segment_id, b)
                assert unit not in found, f"{unit} given to {found[unit]} and {name}"
                found[unit] = name
    return found


def release_all(coordinator: SubscriptionCoordinator, now: float) -> None:
    for (segment_id, bucket), name in sorted(coordinator.withheld().items()):
        coordinator.released(name, segment_id, [bucket], now)


def check_keyshared(coordinator: SubscriptionCoordinator) -> None:
    readable = [s for s in coordinator.tracked() if coordinator.is_consumable(s)]
    units = {(s, b) for s in readable for b in range(coordinator.bucket_count(s))}
    owners = coordinator.unit_owners()
    visible = view_units(coordinator)
    withheld = coordinator.withheld()
    sessions = coordinator.sessions()
    if sessions:
        # every bucket of every readable segment has exactly one owner ...
        assert set(owners) == units
        # ... and is read by it, unless withheld for a hand-off from a registered consumer
        assert set(visible) | set(withheld) == units
        assert not set(visible) & set(withheld)
        assert all(visible[u] == owners[u] for u in visible)
        assert all(n in sessions and owners[u] != n for u, n in withheld.items())
    else:
        assert owners == {} and visible == {}
    # a unit is read only once every ancestor of its segment is drained (or pruned)
    for segment_id, _ in visible:
        assert not coordinator.layout.ancestors(segment_id) & coordinator.tracked()
    connected = coordinator.connected()
    if connected and len(connected) == len(sessions) and not withheld:
        active_readable = [s for s in readable if coordinator.layout.segments[s].active]
        # no consumer idle while there are at least as many readable buckets as consumers
        if len(units) >= len(connected):
            idle = [n for n in connected if n not in set(visible.values())]
            assert not idle, f"idle {idle} with {len(units)} buckets"
        # with consumers <= readable active segments: whole segments, as before PIP-486
        if len(connected) <= len(active_readable):
            for assignment in coordinator.assignments().values():
                assert all(s.buckets is None for s in assignment.segments), assignment
        # a shared segment's buckets are split to within one among its sharers
        for s in readable:
            per = Counter(n for (seg, _), n in owners.items() if seg == s)
            assert max(per.values()) - min(per.values()) <= 1, (s, per)


class KeySharedMachine(EventRules):
    """Random events on a stream subscription with bucket counts from the DAG (the topic's
    budget split over its segments, halved by splits, summed by merges, set by rollovers)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        layout = SegmentLayout.initial(2)
        self.buckets = initial_layout_buckets(layout, budget=8)
        self.coordinator: SubscriptionCoordinator = SubscriptionCoordinator(
            layout, grace_period=60.0, buckets=self.buckets
        )

    def apply(self, event: Callable[[Any], CoordinatorResult]) -> CoordinatorResult:
        before = self.coordinator.assignments()
        result = event(self.coordinator)
        after = self.coordinator.assignments()
        pushed = {p.consumer for p in result.push}
        for name in self.coordinator.connected():
            if name in before and before[name].segments != after[name].segments:
                assert name in pushed, f"{name}'s assignment changed without a push"
        return result

    def relayout(self, new: SegmentLayout, data: st.DataObject) -> None:
        rebucketed = {
            s.segment_id: data.draw(st.integers(1, 8), label="N")
            for s in new.segments.values()
            if s.segment_id not in self.buckets
            and len(s.parent_ids) == 1
            and new.segments[s.parent_ids[0]].hash_range == s.hash_range
        }
        self.buckets = layout_buckets(new, self.buckets, rebucketed=rebucketed)
        self.apply(methodcaller("layout_changed", new, self.now, self.buckets))

    @precondition(lambda self: bool(self.coordinator.withheld()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        withheld = sorted(self.coordinator.withheld().items())
        (segment_id, bucket), name = data.draw(st.sampled_from(withheld))
        self.apply(methodcaller("released", name, segment_id, [bucket], self.now))
        assert (segment_id, bucket) not in self.coordinator.withheld()

    @rule(name=st.sampled_from(NAMES), segment_id=st.integers(0, 6), bucket=st.integers(0, 8))
    def stray_release(self, name: str, segment_id: int, bucket: int) -> None:
        """A report of a bucket not withheld from ``name`` changes nothing."""
        if self.coordinator.withheld().get((segment_id, bucket)) == name:
            return
        before = self.coordinator.assignments()
        result = self.apply(methodcaller("released", name, segment_id, [bucket], self.now))
        assert result.changes == () and self.coordinator.assignments() == before

    @precondition(lambda self: any(not s.active for s in self.coordinator.layout.segments.values()))
    @rule(data=st.data())
    def drained(self, data: st.DataObject) -> None:
        coordinator = self.coordinator
        sealed = sorted(
            i
            for i in coordinator.tracked()
            if not coordinator.layout.segments[i].active and coordinator.is_consumable(i)
        )
        if not sealed:
            return
        segment_id = data.draw(st.sampled_from(sealed))
        holders = coordinator.holders(segment_id)
        name = data.draw(st.sampled_from(holders)) if holders else None
        result = self.apply(methodcaller("drained", name, segment_id, self.now))
        assert result.rejected is None, result.rejected

    @invariant()
    def keyshared_invariants(self) -> None:
        check_keyshared(self.coordinator)

    @invariant()
    def stable_under_unchanged_input(self) -> None:
        result = self.coordinator.tick(self.now)
        assert result.changes == () and result.push == () and result.persist is None

    @invariant()
    def settles_once_released(self) -> None:
        """Releasing every withheld unit leaves no consumer idle (checked on a copy)."""
        copy = SubscriptionCoordinator.from_status(
            self.coordinator.to_status(),
            self.coordinator.layout,
            self.now,
            grace_period=60.0,
            buckets=self.coordinator.buckets,
        )
        for name in self.coordinator.connected():
            copy.register(name, self.now)
        release_all(copy, self.now)
        check_keyshared(copy)


TestKeySharedCoordinator = KeySharedMachine.TestCase
TestKeySharedCoordinator.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- examples --------------------------------------------------------------------------------


def two_segments(n: int = 2) -> SubscriptionCoordinator:
    layout = SegmentLayout.initial(2)
    return SubscriptionCoordinator(layout, grace_period=30.0, buckets={0: n, 1: n})


def test_consumers_up_to_the_segment_count_get_whole_segments() -> None:
    c = two_segments()
    c.register("a", 0.0)
    c.register("b", 0.0)
    assert [s.buckets for s in c.assignment("a").segments] == [None]
    assert [s.buckets for s in c.assignment("b").segments] == [None]
    assert c.sharers(0) == ("a",) or c.sharers(0) == ("b",)


def test_more_consumers_than_segments_share_buckets_up_to_sum_n() -> None:
    c = two_segments()
    for name in "abcdef":
        c.register(name, 0.0)
        release_all(c, 0.0)
    busy = {n for n, a in c.assignments().items() if a.segments}
    assert busy == {"a", "b", "c", "d"}, "sum(N) = 4 consumers have work, the rest wait"
    units = view_units(c)
    assert Counter(units.values()) == Counter({"a": 1, "b": 1, "c": 1, "d": 1})
    # going back down: the leaver's bucket returns (withheld until it released: it left)
    c.unregister("c", 1.0)
    c.unregister("d", 1.0)
    c.unregister("e", 1.0)
    c.unregister("f", 1.0)
    release_all(c, 1.0)
    assert all(s.buckets is None for a in c.assignments().values() for s in a.segments)


def test_a_moving_bucket_is_withheld_until_its_previous_owner_releases_it() -> None:
    c = SubscriptionCoordinator(SegmentLayout.initial(1), grace_period=30.0, buckets={0: 4})
    c.register("a", 0.0)
    result = c.register("b", 1.0)
    assert c.assignment("a").segments[0].buckets == (0, 1)
    assert c.assignment("b").segments == (), "bucket 2 and 3 still with a"
    assert c.assignment("a").releasing == ((0, 2), (0, 3))
    assert c.withheld() == {(0, 2): "a", (0, 3): "a"}
    assert c.assignment("a").to_dict()["releasing"] == [{"segmentId": 0, "buckets": [2, 3]}]
    assert {p.consumer for p in result.push} == {"a", "b"}
    # b cannot release what is a's; a releases one bucket, then the other
    c.released("b", 0, [2, 3], 2.0)
    assert c.assignment("b").segments == ()
    result = c.released("a", 0, [2], 2.0)
    assert c.assignment("b").segments[0].buckets == (2,)
    assert [p.consumer for p in result.push] == ["b"]
    c.released("a", 0, [3], 2.0)
    assert c.assignment("b").segments[0].buckets == (2, 3)
    assert c.withheld() == {} and c.reassignments == 2


def test_a_vanished_previous_owner_loses_its_buckets_after_the_grace_period() -> None:
    c = SubscriptionCoordinator(SegmentLayout.initial(1), grace_period=30.0, buckets={0: 2})
    c.register("a", 0.0)
    c.register("b", 0.0)
    release_all(c, 0.0)
    owner_of_0 = c.unit_owners()[(0, 0)]
    gone, stays = ("a", "b") if owner_of_0 == "a" else ("b", "a")
    c.disconnect(gone, 1.0)
    # held for the grace period: nothing moves
    assert c.unit_owners()[(0, 0)] == gone
    c.tick(30.9)
    assert c.unit_owners()[(0, 0)] == gone
    result = c.tick(31.0)
    assert result.expired == (gone,)
    assert c.assignment(stays).segments[0].buckets is None, "no hand-off wait for the gone"
    assert c.withheld() == {}


def test_a_sealed_backlog_drains_wide_then_reverts_to_one_consumer_per_segment() -> None:
    layout = SegmentLayout.initial(1)
    buckets = {0: 4}
    c = SubscriptionCoordinator(layout, grace_period=30.0, buckets=buckets)
    c.register("a", 0.0)
    split = layout.split(0)
    buckets = layout_buckets(split, buckets)
    c.layout_changed(split, 1.0, buckets)
    for name in "bcd":
        c.register(name, 1.0)
    release_all(c, 1.0)
    assert c.drain_wide() == (0,)
    assert len(c.sharers(0)) == 4, "the sealed parent's 4 buckets go to 4 consumers"
    c.drained(c.holders(0)[0], 0, 2.0)
    release_all(c, 2.0)
    assert c.drain_wide() == ()
    assert sorted(len(c.sharers(s)) for s in (1, 2)) == [2, 2], "children N=2 each"


def test_a_shared_sealed_segment_drains_once_every_bucket_was_reported() -> None:
    layout = SegmentLayout.initial(1)
    c = SubscriptionCoordinator(layout, grace_period=30.0, buckets={0: 2})
    c.register("a", 0.0)
    split = layout.split(0)
    c.layout_changed(split, 1.0, layout_buckets(split, {0: 2}))
    c.register("b", 1.0)
    release_all(c, 1.0)
    owners = c.unit_owners()
    assert {owners[(0, 0)], owners[(0, 1)]} == {"a", "b"}
    first = owners[(0, 0)]
    assert c.drained(first, 0, 2.0, buckets=[1]).rejected, "not its bucket"
    assert c.drained(first, 0, 2.0, buckets=[0]).rejected is None
    assert 0 not in c.drained_segments and not c.is_consumable(1)
    c.drained(owners[(0, 1)], 0, 3.0, buckets=[1])
    assert 0 in c.drained_segments and c.is_consumable(1) and c.is_consumable(2)
