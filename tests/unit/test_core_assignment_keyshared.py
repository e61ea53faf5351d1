"""Key-shared stream/checkpoint assignment (PIP-486, issue 14): buckets of consumable segments
spread over consumers beyond the segment count, hand-offs withheld until released."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from operator import methodcaller
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from scalable_topics.core.assignment import (
    CoordinatorResult,
    SubscriptionCoordinator,
    Unit,
    parent_buckets,
)
from scalable_topics.core.buckets import bucket_of, initial_layout_buckets, layout_buckets, rebucket
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
        self.reported: dict[int, set[int]] = {}
        """Sealed segment -> buckets reported consumed (accepted reports)."""

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

    @precondition(lambda self: any(not s.active for s in self.coordinator.layout.segments.values()))
    @rule(data=st.data())
    def buckets_drained(self, data: st.DataObject) -> None:
        """A consumer reports buckets it reads of a sealed segment consumed: shared buckets of
        a consumable one, or ready buckets of one not consumable yet (its primary)."""
        coordinator = self.coordinator
        candidates = [
            (name, s.segment_id, s.buckets if s.consumable else s.ready_buckets)
            for name, assignment in coordinator.assignments().items()
            for s in assignment.segments
            if s.sealed and (s.ready_buckets or (s.consumable and s.buckets))
        ]
        if not candidates:
            return
        name, segment_id, buckets = data.draw(st.sampled_from(candidates))
        assert buckets
        chosen = data.draw(st.lists(st.sampled_from(buckets), min_size=1, unique=True))
        result = self.apply(methodcaller("drained", name, segment_id, self.now, chosen))
        assert result.rejected is None, result.rejected
        self.reported.setdefault(segment_id, set()).update(chosen)

    @invariant()
    def keyshared_invariants(self) -> None:
        check_keyshared(self.coordinator)

    @invariant()
    def ready_buckets_follow_the_parents_reports(self) -> None:
        """Computed here from the layout and the accepted reports alone: a bucket of a segment
        not consumable yet is ready iff every tracked ancestor is a consumable parent of known
        bucket count all of whose buckets holding its keys were reported."""
        c = self.coordinator
        tracked = c.tracked()
        for s in tracked:
            segment = c.layout.segments[s]
            blockers = c.layout.ancestors(s) & tracked
            expected: tuple[int, ...] = ()
            n = c.buckets.get(s)
            if (
                blockers
                and n is not None
                and all(
                    p in segment.parent_ids and c.is_consumable(p) and p in c.buckets
                    for p in blockers
                )
            ):
                expected = tuple(
                    j
                    for j in range(n)
                    if all(
                        set(parent_buckets(j, n, c.buckets[p])) <= self.reported.get(p, set())
                        for p in blockers
                    )
                )
            assert c.ready_buckets(s) == expected, (s, expected)
            primary = c.owner_of(s)
            if primary is not None and not c.is_consumable(s):
                [entry] = [e for e in c.assignment(primary).segments if e.segment_id == s]
                assert entry.ready_buckets == expected

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


def test_a_consumer_arriving_when_every_bucket_has_a_reader_takes_a_busy_primarys_place() -> None:
    """Found by the state machine: two sealed segments of two buckets, both with the same
    primary, each shared with one helper. A fourth consumer takes the primary's place in one
    of them instead of staying idle: four consumers, one bucket each."""
    layout = SegmentLayout.initial(2)
    buckets = initial_layout_buckets(layout, budget=8)
    c = SubscriptionCoordinator(layout, grace_period=60.0, buckets=buckets)
    for name in "ca":
        c.register(name, 0.0)
    steps: list[Callable[[SegmentLayout], SegmentLayout]] = [
        lambda x: x.split(0),
        lambda x: x.prune(0),
        lambda x: x.merge(2, 3),
        lambda x: x.merge(4, 1),
    ]
    for step in steps:
        layout = step(layout)
        buckets = layout_buckets(layout, buckets)
        c.layout_changed(layout, 0.0, buckets)
    c.drained(c.holders(1)[0] if c.holders(1) else None, 1, 0.0)
    for name in "bd":
        c.register(name, 0.0)
    release_all(c, 0.0)
    assert sorted(c.unit_owners().values()) == ["a", "b", "c", "d"]
    check_keyshared(c)


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


# -- per-bucket ordering across splits, merges and rollovers ---------------------------------


def test_parent_buckets_are_those_whose_hash_range_overlaps_the_child_bucket() -> None:
    assert [parent_buckets(j, 2, 4) for j in range(2)] == [range(0, 2), range(2, 4)]  # split
    assert [parent_buckets(j, 4, 2) for j in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    assert [parent_buckets(j, 3, 2) for j in range(3)] == [range(0, 1), range(0, 2), range(1, 2)]
    assert parent_buckets(0, 1, 8) == range(8) and parent_buckets(5, 8, 1) == range(1)
    # exhaustively: a hashB's bucket in the parent is among the child bucket's parent buckets
    for n, m in [(2, 4), (4, 2), (3, 5), (7, 3), (1, 4)]:
        for h in range(0, 65536, 97):
            assert bucket_of(h, m) in parent_buckets(bucket_of(h, n), n, m)


def split_shared(parent_n: int = 4) -> SubscriptionCoordinator:
    """One segment of ``parent_n`` buckets shared by a and b, then split (children N/2)."""
    layout = SegmentLayout.initial(1)
    c = SubscriptionCoordinator(layout, grace_period=30.0, buckets={0: parent_n})
    c.register("a", 0.0)
    c.register("b", 0.0)
    release_all(c, 0.0)
    split = layout.split(0)
    c.layout_changed(split, 1.0, layout_buckets(split, {0: parent_n}))
    release_all(c, 1.0)
    return c


def test_a_child_bucket_is_ready_once_the_parent_buckets_covering_its_keys_are_consumed() -> None:
    c = split_shared()
    owners = c.unit_owners()
    low = owners[(0, 0)]
    assert owners[(0, 1)] == low and owners[(0, 2)] != low, owners
    assert c.ready_buckets(1) == c.ready_buckets(2) == ()
    c.drained(low, 0, 2.0, buckets=[0])
    assert c.ready_buckets(1) == (), "child bucket 0 also holds keys of parent bucket 1"
    result = c.drained(low, 0, 2.0, buckets=[1])
    assert result.rejected is None
    assert c.ready_buckets(1) == c.ready_buckets(2) == (0,)
    assert not c.is_consumable(1) and 0 not in c.drained_segments
    # the children's primaries hear it (pushed), on the whole, not yet consumable segment
    for child in (1, 2):
        primary = c.owner_of(child)
        assert primary is not None
        assert primary in {p.consumer for p in result.push}
        [entry] = [s for s in c.assignment(primary).segments if s.segment_id == child]
        assert entry.ready_buckets == (0,) and not entry.consumable and entry.buckets is None
        assert entry.to_dict()["readyBuckets"] == [0]
    # the rest of the parent: the children become consumable; ready_buckets no longer matter
    c.drained(owners[(0, 2)], 0, 3.0, buckets=[2, 3])
    assert c.is_consumable(1) and c.ready_buckets(1) == ()
    assert all(
        s.to_dict()["readyBuckets"] == [] for a in c.assignments().values() for s in a.segments
    )


def test_a_rollover_child_bucket_waits_only_for_its_one_parent_bucket() -> None:
    layout = SegmentLayout.initial(1)
    c = SubscriptionCoordinator(layout, grace_period=30.0, buckets={0: 2})
    c.register("a", 0.0)
    c.register("b", 0.0)
    release_all(c, 0.0)
    rolled = rebucket(layout, [0])
    c.layout_changed(rolled, 1.0, layout_buckets(rolled, {0: 2}, rebucketed={1: 4}))
    first = c.unit_owners()[(0, 1)]
    c.drained(first, 0, 2.0, buckets=[1])
    assert c.ready_buckets(1) == (2, 3)


def test_early_reports_are_checked_and_a_grandparent_holds_everything_back() -> None:
    c = split_shared(8)  # children N = 4, grandchildren N = 2
    owners = c.unit_owners()
    low = owners[(0, 0)]
    assert [owners[(0, b)] for b in range(8)] == [low] * 4 + [owners[(0, 4)]] * 4 != [low] * 8
    c.drained(low, 0, 2.0, buckets=[0, 1, 2, 3])
    assert c.ready_buckets(1) == (0, 1)
    primary = c.owner_of(1)
    other = ({"a", "b"} - {primary}).pop()
    # child 1 splits while not consumable: its children wait for the grandparent 0 as well
    layout = c.layout.split(1)
    c.layout_changed(layout, 3.0, layout_buckets(layout, c.buckets))
    assert c.ready_buckets(1) == (0, 1)
    assert c.ready_buckets(3) == c.ready_buckets(4) == ()
    # a sealed child's ready buckets may be reported early by its primary, and only by it
    assert c.drained(other, 1, 4.0, buckets=[0]).rejected
    assert c.drained(primary, 1, 4.0, buckets=[2]).rejected, "bucket 2 is not ready"
    assert c.drained(primary, 1, 4.0, buckets=[0, 1]).rejected is None
    assert 1 not in c.drained_segments
    c.drained(owners[(0, 4)], 0, 5.0, buckets=[4, 5, 6, 7])
    assert c.is_consumable(1)
    assert c.ready_buckets(3) == c.ready_buckets(4) == (0,), "child 1's buckets 0, 1 reported"


# -- leader failover: helpers' shares are persisted and restored as they were ------------------


def shared_topic() -> SubscriptionCoordinator:
    """3 segments of 4 buckets (one sealed, draining wide) and 7 consumers: helpers on each."""
    layout = SegmentLayout.initial(2)
    buckets = {0: 4, 1: 4}
    c = SubscriptionCoordinator(layout, grace_period=30.0, buckets=buckets)
    for name in "abc":
        c.register(name, 0.0)
    split = layout.split(0)
    buckets = layout_buckets(split, buckets)
    c.layout_changed(split, 1.0, buckets)
    for name in "defg":
        c.register(name, 2.0)
    release_all(c, 2.0)
    assert not c.withheld() and c.drain_wide()
    assert any(c.sharers(s) != (c.owner_of(s),) for s in c.tracked() if c.is_consumable(s))
    return c


@pytest.mark.parametrize("order", ["abcdefg", "gfedcba", "dgaebfc"])
def test_a_new_leader_rebuilds_the_same_bucket_owners_in_any_reconnect_order(order: str) -> None:
    old = shared_topic()
    status = old.to_status()
    assert any("shares" in entry for entry in status["consumers"])
    new = SubscriptionCoordinator.from_status(
        json.loads(json.dumps(status)),
        old.layout,
        now=100.0,
        grace_period=30.0,
        buckets=old.buckets,
    )
    assert new.to_status() == status
    assert new.unit_owners() == old.unit_owners()
    for name in order:
        result = new.register(name, 101.0)
        assert result.moved == () and not new.withheld(), (name, new.withheld())
        assert new.unit_owners() == old.unit_owners()
    assert new.reassignments == 0
    assert new.assignments() == old.assignments()


def test_shares_in_a_status_are_checked() -> None:
    layout = SegmentLayout.initial(1)
    for shares, message in [
        ("x", "must be a list"),
        ([{"segmentId": 0}], "not valid"),
        ([{"segmentId": 0, "buckets": [-1]}], "not a bucket index"),
        ([{"segmentId": "0", "buckets": [1]}], "not a segment id"),
    ]:
        status = {"consumers": [{"name": "a", "segments": [0]}, {"name": "b", "shares": shares}]}
        with pytest.raises(ValueError, match=message):
            SubscriptionCoordinator.from_status(status, layout, now=0.0, buckets={0: 4})
    twice = {
        "consumers": [
            {"name": "a", "segments": [0]},
            {"name": "b", "shares": [{"segmentId": 0, "buckets": [1]}]},
            {"name": "c", "shares": [{"segmentId": 0, "buckets": [1]}]},
        ]
    }
    with pytest.raises(ValueError, match="shared by both 'b' and 'c'"):
        SubscriptionCoordinator.from_status(twice, layout, now=0.0, buckets={0: 4})
    # a share of a segment the new layout no longer has, or beyond its buckets, is dropped
    stale = {
        "consumers": [
            {"name": "a", "segments": [0]},
            {
                "name": "b",
                "shares": [{"segmentId": 0, "buckets": [2, 7]}, {"segmentId": 9, "buckets": [0]}],
            },
        ]
    }
    restored = SubscriptionCoordinator.from_status(stale, layout, now=0.0, buckets={0: 4})
    assert restored.unit_owners() == {(0, 0): "a", (0, 1): "a", (0, 2): "b", (0, 3): "a"}
    assert restored.to_status()["consumers"][1]["shares"] == [{"segmentId": 0, "buckets": [2]}]


def test_shares_restored_before_the_dag_announced_the_bucket_counts_apply_once_it_does() -> None:
    old = shared_topic()
    status = old.to_status()
    new = SubscriptionCoordinator.from_status(status, old.layout, now=100.0, grace_period=30.0)
    for name in "abcdefg":
        new.register(name, 101.0)
    new.buckets_changed(old.buckets, 102.0)
    release_all(new, 102.0)
    assert new.unit_owners() == old.unit_owners()
