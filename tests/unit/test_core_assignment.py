"""Consumer assignment (DESIGN §3): round-robin, sticky, drain gating, sessions, persistence."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from operator import methodcaller
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scalable_topics.core.assignment import (
    AssignmentStrategy,
    Coordinator,
    CoordinatorResult,
    SubscriptionCoordinator,
    round_robin,
)
from scalable_topics.core.layout import SegmentInfo, SegmentLayout, SegmentState

# -- helpers ---------------------------------------------------------------------------------


def rebucket(layout: SegmentLayout, segment_id: int) -> SegmentLayout:
    """A rebucket rollover (DESIGN §3): seal ``segment_id``, successor with the same range."""
    parent = layout.get(segment_id)
    epoch = layout.epoch + 1
    child_id = layout.next_segment_id
    segments = dict(layout.segments)
    segments[segment_id] = replace(
        parent, state=SegmentState.SEALED, child_ids=(child_id,), sealed_at_epoch=epoch
    )
    segments[child_id] = SegmentInfo(
        child_id, parent.hash_range, parent_ids=(segment_id,), created_at_epoch=epoch
    )
    return SegmentLayout(epoch, child_id + 1, segments, layout.properties)


def owners(coordinator: SubscriptionCoordinator) -> dict[int, str]:
    result: dict[int, str] = {}
    for name, assignment in coordinator.assignments().items():
        for segment_id in assignment.segment_ids:
            assert segment_id not in result, f"segment {segment_id} assigned twice"
            result[segment_id] = name
    return result


def held(coordinator: SubscriptionCoordinator, name: str) -> set[int]:
    return set(coordinator.assignment(name).segment_ids)


def consumable_counts(coordinator: SubscriptionCoordinator) -> dict[str, int]:
    return {
        name: len(coordinator.assignment(name).consumable_ids) for name in coordinator.connected()
    }


def moves_between(before: dict[int, str], after: dict[int, str]) -> int:
    return sum(1 for s, owner in after.items() if s in before and before[s] != owner)


def expected_tracked(coordinator: SubscriptionCoordinator) -> set[int]:
    drained = coordinator.drained_segments
    return {i for i, s in coordinator.layout.segments.items() if s.active or i not in drained}


def expected_blockers(coordinator: SubscriptionCoordinator, segment_id: int) -> set[int]:
    """Ancestors still to be drained, computed from the layout alone (independent of the
    coordinator's own bookkeeping): every ancestor in the DAG counts unless drained."""
    tracked = expected_tracked(coordinator)
    return {a for a in coordinator.layout.ancestors(segment_id) if a in tracked}


def check_balanced(coordinator: SubscriptionCoordinator) -> None:
    """Sticky balance among connected consumers, counting consumable segments: no consumer
    holding a movable (active, consumable) segment is two or more above another one. Without
    pinned (sealed, undrained) segments on connected consumers this is max - min <= 1."""
    counts = consumable_counts(coordinator)
    if not counts:
        return
    lowest = min(counts.values())
    pinned_anywhere = False
    for name, count in counts.items():
        assignment = coordinator.assignment(name)
        movable = [s for s in assignment.segments if s.consumable and not s.sealed]
        pinned_anywhere |= any(s.sealed for s in assignment.segments)
        if movable:
            assert count <= lowest + 1, f"unbalanced: {counts}"
    if not pinned_anywhere:
        assert max(counts.values()) - lowest <= 1, f"unbalanced: {counts}"


def check_invariants(coordinator: SubscriptionCoordinator) -> None:
    layout = coordinator.layout
    tracked = expected_tracked(coordinator)
    assert coordinator.tracked() == tracked
    assigned = owners(coordinator)
    if coordinator.sessions():
        assert set(assigned) == tracked, "every tracked segment has exactly one consumer"
        assert coordinator.unassigned() == ()
    else:
        assert assigned == {}
        assert set(coordinator.unassigned()) == tracked
    assert set(assigned.values()) <= set(coordinator.sessions())
    for name, assignment in coordinator.assignments().items():
        assert assignment.layout_epoch == layout.epoch
        position = {s.segment_id: k for k, s in enumerate(assignment.segments)}
        for segment in assignment.segments:
            blockers = expected_blockers(coordinator, segment.segment_id)
            assert segment.consumable == (not blockers), (name, segment)
            assert set(segment.blocked_by) == blockers
            assert segment.sealed == (not layout.segments[segment.segment_id].active)
            for ancestor in layout.ancestors(segment.segment_id):
                if ancestor in position:
                    assert position[ancestor] < position[segment.segment_id], "DAG order"
    if coordinator.strategy is AssignmentStrategy.STICKY:
        check_balanced(coordinator)
    status = coordinator.to_status()
    assert json.loads(json.dumps(status)) == status
    restored = SubscriptionCoordinator.from_status(
        status, layout, now=0.0, strategy=coordinator.strategy
    )
    assert restored.to_status() == status
    assert all(not s.connected for s in restored.sessions().values())


def check_frozen(
    coordinator: SubscriptionCoordinator, before: dict[str, set[int]], grace_before: set[str]
) -> None:
    """A consumer in its grace period (before and after an event) is frozen: it loses only
    drained or pruned segments, and gains segments only when no consumer is connected - or,
    when no connected consumer is idle, buckets of its own segment that a helper gave up (the
    seed: a vanished consumer holds its buckets during its grace period, and only then)."""
    sessions = coordinator.sessions()
    connected = coordinator.connected()
    idle = [
        n for n in connected if not any(s.consumable for s in coordinator.assignment(n).segments)
    ]
    for name in grace_before:
        if name in sessions and not sessions[name].connected:
            now_held = held(coordinator, name)
            assert not (before[name] - now_held) & coordinator.tracked(), name
            gained = now_held - before[name]
            if connected and gained:
                assert not idle, (name, gained, idle)
                assert all(coordinator.owner_of(s) == name for s in gained), (name, gained)


def check_result(
    result: CoordinatorResult,
    before: dict[str, set[int]],
    coordinator: SubscriptionCoordinator,
    status_before: dict[str, object],
) -> None:
    """The result's changes and effects agree with the state before and after the event."""
    after = {n: set(a.segment_ids) for n, a in coordinator.assignments().items()}
    for change in result.changes:
        old = before.get(change.consumer, set())
        new = after.get(change.consumer, set())
        assert set(change.added) == new - old
        assert set(change.removed) == old - new
        assert change.assignment.segment_ids == (
            coordinator.assignment(change.consumer).segment_ids if change.consumer in after else ()
        )
    for name in set(before) | set(after):
        if before.get(name, set()) != after.get(name, set()):
            assert name in {c.consumer for c in result.changes}, name
    connected = set(coordinator.connected())
    for push in result.push:
        assert push.consumer in connected
        assert push.assignment == coordinator.assignment(push.consumer)
    changed_live = {c.consumer for c in result.changes} & connected
    assert changed_live <= {p.consumer for p in result.push}
    status_after = coordinator.to_status()

    def registrations(status: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in status.items() if k != "layoutEpoch"}

    if registrations(status_before) != registrations(status_after):
        assert result.persist is not None
    if result.persist is not None:
        assert result.persist.status == status_after


# -- round_robin -----------------------------------------------------------------------------


def test_round_robin_follows_range_order_and_consumer_names() -> None:
    layout = SegmentLayout.initial(4).split(1)  # active by start: 0, 4, 5, 2, 3
    assert [s.segment_id for s in layout.active()] == [0, 4, 5, 2, 3]
    assert round_robin(layout, ["b", "a"]) == {"a": [0, 5, 3], "b": [4, 2]}
    assert round_robin(layout, ["a", "b", "c", "a"]) == {"a": [0, 2], "b": [4, 3], "c": [5]}
    assert round_robin(layout, ["x"] * 2 + ["y", "z", "w", "v", "u"])["z"] == []
    assert round_robin(layout, []) == {}


def test_unknown_strategy_and_bad_grace_period_are_rejected() -> None:
    layout = SegmentLayout.initial(2)
    with pytest.raises(ValueError, match="unknown assignment strategy"):
        SubscriptionCoordinator(layout, strategy="random")
    with pytest.raises(ValueError, match="grace period"):
        SubscriptionCoordinator(layout, grace_period=-1)
    with pytest.raises(ValueError, match="ACTIVE"):
        SubscriptionCoordinator(layout, drained=[0])


# -- sticky: joins, leaves, splits, merges ---------------------------------------------------


def test_sticky_join_moves_only_what_balance_needs() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(12))
    for name in ("a", "b", "c"):
        coordinator.register(name, 0.0)
    assert sorted(consumable_counts(coordinator).values()) == [4, 4, 4]
    before = owners(coordinator)
    result = coordinator.register("d", 1.0)
    assert len(result.moved) == 3 == moves_between(before, owners(coordinator))
    assert sorted(consumable_counts(coordinator).values()) == [3, 3, 3, 3]
    assert set(result.moved) == held(coordinator, "d")
    assert {p.consumer for p in result.push} == {"a", "b", "c", "d"}
    assert result.persist is not None
    check_invariants(coordinator)


def test_sticky_leave_moves_only_the_leavers_segments() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(9))
    for name in ("a", "b", "c"):
        coordinator.register(name, 0.0)
    before = owners(coordinator)
    leaver = held(coordinator, "b")
    result = coordinator.unregister("b", 1.0)
    assert set(result.moved) == leaver
    assert all(owners(coordinator)[s] == before[s] for s in before if s not in leaver)
    assert sorted(consumable_counts(coordinator).values()) == [4, 5]
    assert [c.consumer for c in result.changes] == ["a", "b", "c"]
    assert result.changes[1].assignment.segments == ()
    assert set(result.changes[1].removed) == leaver
    assert {p.consumer for p in result.push} == {"a", "c"}
    check_invariants(coordinator)


def test_split_children_go_to_the_parents_consumer_and_wait_for_its_drain() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(4))
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    parent = min(held(coordinator, "a"))
    layout = coordinator.layout.split(parent)
    low, high = layout.children(parent)
    result = coordinator.layout_changed(layout, 1.0)
    assert result.moved == ()
    assignment = coordinator.assignment("a")
    assert assignment.segment_ids[0] == parent  # DAG order: the parent first
    flags = {s.segment_id: (s.consumable, s.blocked_by) for s in assignment.segments}
    assert flags[parent] == (True, ())
    assert flags[low] == (False, (parent,)) == flags[high]
    assert [p.consumer for p in result.push] == ["a"]
    check_invariants(coordinator)

    result = coordinator.drained("a", parent, 2.0)
    assert result.rejected is None and result.moved == ()
    assert held(coordinator, "a") >= {low, high}
    assert coordinator.is_consumable(low) and coordinator.is_consumable(high)
    assert [(c.consumer, c.removed) for c in result.changes] == [("a", (parent,))]
    assert result.persist is not None and parent in result.persist.status["drainedSegments"]
    check_invariants(coordinator)


def test_split_child_goes_elsewhere_when_balance_does_not_allow() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(3))
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    heavy = max(("a", "b"), key=lambda n: len(held(coordinator, n)))
    light = "b" if heavy == "a" else "a"
    parent = min(held(coordinator, heavy))
    layout = coordinator.layout.split(parent)
    coordinator.layout_changed(layout, 1.0)
    low, high = layout.children(parent)
    assert low in held(coordinator, heavy)
    assert high in held(coordinator, light)
    result = coordinator.drained(heavy, parent, 2.0)
    assert result.moved == ()  # already placed where balance wants it
    assert sorted(consumable_counts(coordinator).values()) == [2, 2]
    check_invariants(coordinator)


def test_merge_child_goes_to_the_parent_consumer_with_fewer_segments() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(5))
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    by_start = [s.segment_id for s in coordinator.layout.active()]
    owner = owners(coordinator)
    # find an adjacent pair held by different consumers
    left, right = next((x, y) for x, y in itertools.pairwise(by_start) if owner[x] != owner[y])
    fewer = min((owner[left], owner[right]), key=lambda n: (len(held(coordinator, n)), n))
    layout = coordinator.layout.merge(left, right)
    (child,) = layout.children(left)
    coordinator.layout_changed(layout, 1.0)
    assert coordinator.owner_of(child) == fewer
    blocked = {s.segment_id: s.blocked_by for s in coordinator.assignment(fewer).segments}
    assert blocked[child] == (left, right)
    coordinator.drained(owner[left], left, 2.0)
    assert not coordinator.is_consumable(child)  # one parent is not enough
    assert coordinator.drained(fewer, child, 2.5).rejected is not None  # child is active
    coordinator.drained(owner[right], right, 3.0)
    assert coordinator.is_consumable(child)
    check_invariants(coordinator)


def test_rebucket_successor_is_gated_like_a_split_child() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(2))
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    layout = rebucket(coordinator.layout, 0)
    successor = layout.next_segment_id - 1
    coordinator.layout_changed(layout, 1.0)
    assert coordinator.owner_of(successor) == coordinator.owner_of(0)
    assert not coordinator.is_consumable(successor)
    check_invariants(coordinator)
    coordinator.drained(coordinator.owner_of(0), 0, 2.0)
    assert coordinator.is_consumable(successor)
    check_invariants(coordinator)


def test_chained_splits_stay_gated_until_every_ancestor_is_drained() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(1))
    coordinator.register("a", 0.0)
    layout = coordinator.layout.split(0)  # children 1, 2
    layout = layout.split(1)  # children 3, 4 - before 0 is drained
    coordinator.layout_changed(layout, 1.0)
    flags = {s.segment_id: s.blocked_by for s in coordinator.assignment("a").segments}
    assert flags == {0: (), 1: (0,), 2: (0,), 3: (0, 1), 4: (0, 1)}
    # the controller may observe that the middle segment is empty; 3 still waits for 0
    assert coordinator.drained(None, 1, 2.0).rejected is None
    flags = {s.segment_id: s.blocked_by for s in coordinator.assignment("a").segments}
    assert flags == {0: (), 2: (0,), 3: (0,), 4: (0,)}
    assert coordinator.drained("a", 1, 3.0).rejected is None  # already drained: a no-op
    coordinator.drained("a", 0, 4.0)
    assert set(coordinator.assignment("a").consumable_ids) == {2, 3, 4}
    check_invariants(coordinator)


def test_pruned_segments_count_as_drained() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(2))
    coordinator.register("a", 0.0)
    layout = coordinator.layout.split(0)
    coordinator.layout_changed(layout, 1.0)
    assert not coordinator.is_consumable(2)
    result = coordinator.layout_changed(layout.prune(0), 2.0)  # out of retention, undrained
    assert coordinator.is_consumable(2) and coordinator.is_consumable(3)
    assert 0 not in held(coordinator, "a")
    assert result.persist is not None
    # a late report for the pruned segment is harmless
    assert coordinator.drained("a", 0, 3.0).rejected is None
    check_invariants(coordinator)


def test_drained_reports_are_validated() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(2))
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    layout = coordinator.layout.split(0).split(2)  # 2 is sealed while 0 is not drained
    coordinator.layout_changed(layout, 1.0)
    holder = coordinator.owner_of(0)
    assert holder is not None
    other = "b" if holder == "a" else "a"
    status = coordinator.to_status()
    for name, segment_id, reason in (
        (holder, 1, "ACTIVE"),
        (other, 0, "not assigned"),
        (coordinator.owner_of(2), 2, "not consumable"),
        ("nobody", 0, "not assigned"),
    ):
        result = coordinator.drained(name, segment_id, 2.0)
        assert result.rejected is not None and reason in result.rejected
        assert result.persist is None and result.changes == ()
    assert coordinator.to_status() == status
    first = coordinator.drained(holder, 0, 3.0)
    again = coordinator.drained(holder, 0, 3.0)
    assert first.persist is not None
    assert again.rejected is None and again.persist is None and again.changes == ()


def test_stale_layout_is_ignored() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(2))
    coordinator.register("a", 0.0)
    old = coordinator.layout
    coordinator.layout_changed(old.split(0), 1.0)
    result = coordinator.layout_changed(old, 2.0)
    assert result.rejected is not None and "older" in result.rejected
    assert coordinator.layout.epoch == 1


# -- sessions --------------------------------------------------------------------------------


def test_returning_consumer_gets_exactly_its_old_segments() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(9), grace_period=60.0)
    for name in ("a", "b", "c"):
        coordinator.register(name, 0.0)
    old = held(coordinator, "b")
    result = coordinator.disconnect("b", 0.0)
    assert result.changes == () and result.persist is None and result.push == ()
    assert coordinator.next_deadline() == 60.0
    coordinator.register("d", 10.0)  # rebalances among connected consumers only
    assert held(coordinator, "b") == old
    layout = coordinator.layout.split(min(held(coordinator, "a")))
    coordinator.layout_changed(layout, 20.0)
    assert held(coordinator, "b") == old
    assert coordinator.tick(59.9).expired == ()
    result = coordinator.register("b", 59.9)
    assert held(coordinator, "b") == old
    assert result.moved == ()
    assert [p.consumer for p in result.push] == ["b"]
    assert coordinator.next_deadline() is None
    check_invariants(coordinator)


def test_segments_are_redistributed_after_the_grace_period() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(9), grace_period=60.0)
    for name in ("a", "b", "c"):
        coordinator.register(name, 0.0)
    old = held(coordinator, "b")
    coordinator.disconnect("b", 5.0)
    result = coordinator.tick(65.0)
    assert result.expired == ("b",)
    assert set(result.moved) == old
    assert "b" not in coordinator.sessions()
    assert sorted(consumable_counts(coordinator).values()) == [4, 5]
    assert result.persist is not None
    assert [c["name"] for c in result.persist.status["consumers"]] == ["a", "c"]
    # coming back after the grace period is a new registration
    coordinator.register("b", 70.0)
    assert len(held(coordinator, "b")) == 3
    check_invariants(coordinator)


def test_expiry_happens_on_any_event_not_only_tick() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(4), grace_period=30.0)
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    coordinator.disconnect("a", 0.0)
    result = coordinator.register("c", 31.0)
    assert result.expired == ("a",)
    assert sorted(consumable_counts(coordinator).values()) == [2, 2]


def test_zero_grace_period_releases_at_once() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(4), grace_period=0.0)
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    result = coordinator.disconnect("a", 1.0)
    assert held(coordinator, "b") == {0, 1, 2, 3}
    assert len(result.moved) == 2


def test_with_nobody_connected_new_segments_go_to_consumers_in_grace() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(2))
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    coordinator.disconnect("a", 1.0)
    coordinator.disconnect("b", 1.0)
    parent = min(held(coordinator, "a"))
    layout = coordinator.layout.split(parent)
    result = coordinator.layout_changed(layout, 2.0)
    assert held(coordinator, "a") == {parent, *layout.children(parent)}
    assert result.push == ()  # nobody to push to
    assert result.persist is not None
    check_invariants(coordinator)


def test_without_consumers_segments_wait_unassigned() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(3))
    assert coordinator.unassigned() == (0, 1, 2)
    result = coordinator.register("a", 0.0)
    assert held(coordinator, "a") == {0, 1, 2}
    assert [p.consumer for p in result.push] == ["a"]
    assert coordinator.register("a", 1.0).push[0].assignment == coordinator.assignment("a")


def test_round_robin_keeps_slots_for_consumers_in_grace() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(6), strategy="round-robin")
    for name in ("a", "b", "c"):
        coordinator.register(name, 0.0)
    assert held(coordinator, "b") == {1, 4}
    coordinator.disconnect("b", 1.0)
    assert coordinator.register("b", 2.0).moved == ()
    assert held(coordinator, "b") == {1, 4}
    result = coordinator.unregister("b", 3.0)
    assert held(coordinator, "a") == {0, 2, 4} and held(coordinator, "c") == {1, 3, 5}
    assert len(result.moved) == 4  # round-robin reshuffles far more than the leaver's share


# -- persistence -----------------------------------------------------------------------------


def _merged_then_split(grace_period: float = 60.0) -> SubscriptionCoordinator:
    """The layout of the Hypothesis counterexample CI failed on (issue 14): 3 segments merged
    into one (4, parents 3 and 2, 3's parents 0 and 1), consumers a and b, then 4 split into
    5 and 6. ``b`` takes sealed segment 0 over from ``a`` (a helper) and is given child 6."""
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(3), grace_period=grace_period)
    layout = coordinator.layout.merge(0, 1)
    coordinator.layout_changed(layout, 0.0)
    layout = layout.merge(3, 2)
    coordinator.layout_changed(layout, 0.0)
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    coordinator.layout_changed(layout.split(4), 0.0)
    assert held(coordinator, "b") == {0, 6} and coordinator.owner_of(0) == "a"
    return coordinator


def test_helper_in_grace_keeps_its_share_when_its_own_child_becomes_consumable() -> None:
    coordinator = _merged_then_split()
    coordinator.disconnect("b", 1.0)
    before = {n: held(coordinator, n) for n in ("a", "b")}
    coordinator.layout_changed(coordinator.layout.prune(4), 2.0)
    assert coordinator.is_consumable(6)
    assert held(coordinator, "b") == {0, 6}  # frozen: nothing tracked is taken from it
    check_frozen(coordinator, before, {"b"})
    check_invariants(coordinator)
    coordinator.register("b", 3.0)  # back: a consumer with a segment of its own helps no more
    assert 0 not in held(coordinator, "b") and 6 in held(coordinator, "b")
    assert coordinator.withheld() == {}  # a whole segment going back to its primary
    assert 0 in held(coordinator, "a")


def test_primary_in_grace_gets_its_segment_back_only_when_nobody_connected_is_idle() -> None:
    coordinator = _merged_then_split()
    coordinator.disconnect("a", 1.0)
    before = {n: held(coordinator, n) for n in ("a", "b")}
    coordinator.layout_changed(coordinator.layout.prune(4), 2.0)
    # b reads its own child 6 now; nobody connected is idle, so segment 0 returns to a
    assert held(coordinator, "b") == {6} and 0 in held(coordinator, "a")
    check_frozen(coordinator, before, {"a"})
    check_invariants(coordinator)


def test_share_of_a_primary_in_grace_goes_to_an_idle_consumer_when_its_helper_leaves() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(2), grace_period=60.0)
    coordinator.layout_changed(coordinator.layout.merge(0, 1), 0.0)
    for name in ("a", "b", "c"):
        coordinator.register(name, 0.0)
    assert coordinator.owner_of(0) == "a" and held(coordinator, "b") == {0}
    assert held(coordinator, "c") == set()
    coordinator.disconnect("a", 1.0)
    before = {n: held(coordinator, n) for n in ("a", "b", "c")}
    coordinator.unregister("b", 2.0)
    assert held(coordinator, "c") == {0}  # not back to the frozen a while c sits idle
    assert held(coordinator, "a") == before["a"]
    check_frozen(coordinator, before, {"a"})
    check_invariants(coordinator)


def test_status_round_trip_and_new_leader_grace() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(4))
    for name in ("a", "b"):
        coordinator.register(name, 0.0)
    layout = coordinator.layout.split(0)
    coordinator.layout_changed(layout, 1.0)
    layout = layout.split(2)
    coordinator.layout_changed(layout, 2.0)
    coordinator.drained(coordinator.owner_of(0), 0, 3.0)
    status = coordinator.to_status()
    assert set(status) == {"layoutEpoch", "consumers", "drainedSegments"}
    assert status["drainedSegments"] == [0]
    assert json.loads(json.dumps(status)) == status

    restored = SubscriptionCoordinator.from_status(status, layout, now=100.0, grace_period=30.0)
    assert restored.to_status() == status
    assert restored.assignments() == coordinator.assignments()
    assert {n: s.grace_deadline for n, s in restored.sessions().items()} == {
        "a": 130.0,
        "b": 130.0,
    }
    result = restored.register("a", 110.0)
    assert result.moved == () and result.persist is None
    assert restored.assignment("a") == coordinator.assignment("a")
    result = restored.tick(130.0)
    assert result.expired == ("b",)
    assert set(restored.assignment("a").segment_ids) == restored.tracked()


def test_from_status_catches_up_with_a_newer_layout() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(2))
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    status = coordinator.to_status()
    holder = coordinator.owner_of(0)
    newer = coordinator.layout.split(0)  # the status was written before the split
    restored = SubscriptionCoordinator.from_status(status, newer, now=0.0)
    assert restored.owner_of(2) == holder and restored.owner_of(3) == holder
    assert not restored.is_consumable(2)
    check_invariants(restored)
    pruned = SubscriptionCoordinator.from_status(status, newer.prune(0), now=0.0)
    assert pruned.is_consumable(2) and pruned.is_consumable(3)
    assert set(owners(pruned)) == {1, 2, 3}
    check_invariants(pruned)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ({"consumers": {"a": [0]}}, "must be lists"),
        ({"consumers": [{"name": ""}]}, "name"),
        ({"consumers": [{"name": "a"}, {"name": "a"}]}, "listed twice"),
        ({"consumers": [{"name": "a", "segments": [0]}, {"name": "b", "segments": [0]}]}, "both"),
        ({"consumers": [{"name": "a", "segments": ["x"]}]}, "not a segment id"),
        ({"consumers": [], "drainedSegments": [0]}, "ACTIVE"),
    ],
)
def test_from_status_rejects_malformed_data(status: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SubscriptionCoordinator.from_status(status, SegmentLayout.initial(2), now=0.0)


def test_assignment_message_carries_flags_and_order() -> None:
    coordinator = SubscriptionCoordinator(SegmentLayout.initial(1))
    coordinator.register("a", 0.0)
    coordinator.layout_changed(coordinator.layout.split(0), 1.0)
    message = coordinator.assignment("a").to_dict()
    assert message["layoutEpoch"] == 1
    assert [
        (s["segmentId"], s["state"], s["consumable"], s["blockedBy"]) for s in message["segments"]
    ] == [(0, "SEALED", True, []), (1, "ACTIVE", False, [0]), (2, "ACTIVE", False, [0])]
    assert message["segments"][1]["descriptor"] == "0000-7fff-1"
    assert message["segments"][1]["hashRange"] == {"start": 0, "end": 0x7FFF}


# -- property-based: any sequence of events keeps the invariants ------------------------------

NAMES = ("a", "b", "c", "d", "e")


class EventRules(RuleBasedStateMachine):
    """The events every coordinator takes, at random: consumers coming and going, time
    passing, splits, rebucket rollovers, merges and prunes. Subclasses check each event in
    :meth:`apply`; :meth:`relayout` hands a new layout over."""

    coordinator: Coordinator[Any]
    now: float = 0.0

    def apply(self, event: Callable[[Any], CoordinatorResult]) -> CoordinatorResult:
        raise NotImplementedError

    def relayout(self, new: SegmentLayout, data: st.DataObject) -> None:
        self.apply(methodcaller("layout_changed", new, self.now))

    @rule(name=st.sampled_from(NAMES))
    def register(self, name: str) -> None:
        self.apply(methodcaller("register", name, self.now))

    @rule(name=st.sampled_from(NAMES))
    def disconnect(self, name: str) -> None:
        self.apply(methodcaller("disconnect", name, self.now))

    @rule(name=st.sampled_from(NAMES))
    def unregister(self, name: str) -> None:
        self.apply(methodcaller("unregister", name, self.now))

    @rule(seconds=st.floats(min_value=0.0, max_value=90.0))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.apply(methodcaller("tick", self.now))

    @precondition(lambda self: len(self.coordinator.layout.active()) < 12)
    @rule(data=st.data())
    def split(self, data: st.DataObject) -> None:
        layout = self.coordinator.layout
        splittable = [s for s in layout.active() if s.hash_range.size > 1]
        segment = data.draw(st.sampled_from(splittable))
        self.relayout(layout.split(segment.segment_id), data)

    @rule(data=st.data())
    def rebucket(self, data: st.DataObject) -> None:
        layout = self.coordinator.layout
        segment = data.draw(st.sampled_from(layout.active()))
        self.relayout(rebucket(layout, segment.segment_id), data)

    @precondition(lambda self: len(self.coordinator.layout.active()) >= 2)
    @rule(data=st.data())
    def merge(self, data: st.DataObject) -> None:
        layout = self.coordinator.layout
        active = layout.active()
        k = data.draw(st.integers(0, len(active) - 2))
        self.relayout(layout.merge(active[k].segment_id, active[k + 1].segment_id), data)

    @precondition(lambda self: any(not s.active for s in self.coordinator.layout.segments.values()))
    @rule(data=st.data())
    def prune(self, data: st.DataObject) -> None:
        layout = self.coordinator.layout
        sealed = sorted(i for i, s in layout.segments.items() if not s.active)
        self.relayout(layout.prune(data.draw(st.sampled_from(sealed))), data)


class CoordinatorMachine(EventRules):
    strategy: AssignmentStrategy = AssignmentStrategy.STICKY

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.coordinator: SubscriptionCoordinator = SubscriptionCoordinator(
            SegmentLayout.initial(3), strategy=self.strategy, grace_period=60.0
        )

    def apply(self, event: Callable[[Any], CoordinatorResult]) -> CoordinatorResult:
        coordinator = self.coordinator
        before = {n: set(a.segment_ids) for n, a in coordinator.assignments().items()}
        grace_before = {n for n, s in coordinator.sessions().items() if not s.connected}
        status_before = coordinator.to_status()
        result = event(coordinator)
        check_result(result, before, coordinator, status_before)
        if result.rejected is not None:
            assert result.changes == () or result.expired
        if self.strategy is AssignmentStrategy.STICKY:
            check_frozen(coordinator, before, grace_before)
        return result

    @precondition(lambda self: any(not s.active for s in self.coordinator.layout.segments.values()))
    @rule(data=st.data(), by_owner=st.booleans())
    def drained(self, data: st.DataObject, by_owner: bool) -> None:
        coordinator = self.coordinator
        sealed = sorted(i for i, s in coordinator.layout.segments.items() if not s.active)
        segment_id = data.draw(st.sampled_from(sealed))
        holder = coordinator.owner_of(segment_id)
        name = holder if by_owner else data.draw(st.sampled_from(NAMES))
        acceptable = (
            name is None
            or segment_id not in coordinator.tracked()
            or (name in coordinator.holders(segment_id) and coordinator.is_consumable(segment_id))
        )
        result = self.apply(methodcaller("drained", name, segment_id, self.now))
        assert (result.rejected is None) == acceptable, result.rejected

    @rule(data=st.data())
    def observed_empty(self, data: st.DataObject) -> None:
        sealed = sorted(i for i, s in self.coordinator.layout.segments.items() if not s.active)
        if sealed:
            segment_id = data.draw(st.sampled_from(sealed))
            self.apply(methodcaller("drained", None, segment_id, self.now))

    @invariant()
    def invariants_hold(self) -> None:
        check_invariants(self.coordinator)


class RoundRobinMachine(CoordinatorMachine):
    strategy = AssignmentStrategy.ROUND_ROBIN


_machine_settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStickyCoordinator = CoordinatorMachine.TestCase
TestStickyCoordinator.settings = _machine_settings
TestRoundRobinCoordinator = RoundRobinMachine.TestCase
TestRoundRobinCoordinator.settings = _machine_settings


# -- sticky versus round-robin over a long random sequence -----------------------------------


Event = Callable[[Any], CoordinatorResult]


@dataclass
class RandomRun:
    """A random sequence of joins, leaves, disconnects (returning in time or expiring),
    splits and merges. :meth:`step` hands each event to ``apply(kind, name, event)`` (``name``:
    the consumer concerned, "" for a layout change); ``relayout(layout, now)`` makes the event
    of a new layout."""

    rng: random.Random
    layout: SegmentLayout
    apply: Callable[[str, str, Event], None]
    relayout: Callable[[SegmentLayout, float], Event] = lambda layout, now: methodcaller(
        "layout_changed", layout, now
    )
    now: float = 0.0
    members: list[str] = field(default_factory=list)
    serial: int = 0

    def step(self) -> None:
        rng = self.rng
        self.now += rng.uniform(1.0, 15.0)
        roll = rng.random()
        active = self.layout.active()
        members = self.members
        if roll < 0.14 or not members:
            self.serial += 1
            name = f"consumer-{self.serial:03d}"
            members.append(name)
            self.apply("join", name, methodcaller("register", name, self.now))
        elif roll < 0.22 and len(members) > 1:
            name = members.pop(rng.randrange(len(members)))
            self.apply("leave", name, methodcaller("unregister", name, self.now))
        elif roll < 0.30 and len(members) > 1:
            name = rng.choice(members)
            self.apply("disconnect", name, methodcaller("disconnect", name, self.now))
            if rng.random() < 0.5:
                self.now += rng.uniform(1.0, 50.0)
                self.apply("reconnect", name, methodcaller("register", name, self.now))
            else:
                members.remove(name)
                self.now += 61.0
                self.apply("expiry", name, methodcaller("tick", self.now))
        elif roll < 0.65 and len(active) < 40:
            splittable = [seg for seg in active if seg.hash_range.size > 1]
            self.change("split", self.layout.split(rng.choice(splittable).segment_id))
        elif len(active) > 2:
            k = rng.randrange(len(active) - 1)
            self.change("merge", self.layout.merge(active[k].segment_id, active[k + 1].segment_id))

    def change(self, kind: str, layout: SegmentLayout) -> None:
        self.layout = layout
        self.apply(kind, "", self.relayout(layout, self.now))

    def prune(self, drained: Iterable[int]) -> None:
        """Prune ``drained`` sealed segments (one layout change)."""
        layout = self.layout
        for segment_id in sorted(drained):
            layout = layout.prune(segment_id)
        if layout is not self.layout:
            self.change("prune", layout)


def run_random_sequence(seed: int, steps: int) -> tuple[dict[str, Counter[str]], Counter[str]]:
    """The same joins, leaves, disconnects, splits and merges applied to a sticky and a
    round-robin coordinator; consumers drain sealed segments as soon as they may. Counts, per
    strategy and kind of event, the segments taken from one consumer and given to another
    (measured by diffing the assignments, not from the coordinator's own report).

    Also returns the moves any balanced assignment must make for sticky's state: a leaver's
    segments, and on a join ``floor(T / (C + 1))`` for ``T`` segments over ``C`` consumers."""
    layout = SegmentLayout.initial(4)
    coordinators = {
        strategy: SubscriptionCoordinator(layout, strategy=strategy, grace_period=60.0)
        for strategy in AssignmentStrategy
    }
    moves: dict[str, Counter[str]] = {s: Counter() for s in coordinators}
    forced: Counter[str] = Counter()
    sticky = coordinators[AssignmentStrategy.STICKY]

    def apply(kind: str, name: str, event: Event) -> None:
        if kind == "join":
            counts = consumable_counts(sticky)
            forced[kind] += sum(counts.values()) // (len(counts) + 1)
        elif kind in ("leave", "expiry"):
            forced[kind] += len(held(sticky, name))
        for strategy, coordinator in coordinators.items():
            before = owners(coordinator)
            event(coordinator)
            moves[strategy][kind] += moves_between(before, owners(coordinator))

    run = RandomRun(random.Random(seed), layout, apply)

    def drain_everything() -> None:
        for strategy, coordinator in coordinators.items():
            while True:
                ready = sorted(
                    i
                    for i in coordinator.tracked()
                    if not coordinator.layout.segments[i].active
                    and coordinator.is_consumable(i)
                    and coordinator.owner_of(i) in coordinator.connected()
                )
                if not ready:
                    break
                for segment_id in ready:
                    before = owners(coordinator)
                    result = coordinator.drained(
                        coordinator.owner_of(segment_id), segment_id, run.now
                    )
                    assert result.rejected is None, result.rejected
                    moves[strategy]["drain"] += moves_between(before, owners(coordinator))

    for _ in range(steps):
        run.step()
        drain_everything()
        run.prune(set.intersection(*(set(c.drained_segments) for c in coordinators.values())))
        counts = consumable_counts(sticky)
        assert max(counts.values()) - min(counts.values()) <= 1, counts
        for coordinator in coordinators.values():
            assert set(owners(coordinator)) == coordinator.tracked()
    return moves, forced


@pytest.mark.parametrize("seed", [7, 2026])
def test_sticky_moves_fewer_segments_than_round_robin(seed: int) -> None:
    moves, forced = run_random_sequence(seed, steps=300)
    by_event = {s: dict(sorted(moves[s].items())) for s in AssignmentStrategy}
    sticky = sum(moves[AssignmentStrategy.STICKY].values())
    rr = sum(moves[AssignmentStrategy.ROUND_ROBIN].values())
    print(
        f"\nseed {seed}, 300 steps: segment moves sticky={sticky} round-robin={rr}; "
        f"unavoidable for sticky's joins/leaves {sum(forced.values())}\n"
        f"  sticky by event: {by_event[AssignmentStrategy.STICKY]}\n"
        f"  round-robin by event: {by_event[AssignmentStrategy.ROUND_ROBIN]}"
    )
    assert sticky < rr / 3
    sticky_moves = moves[AssignmentStrategy.STICKY]
    # joins and leaves move exactly what balance forces; splits, merges and returns move nothing
    for kind in ("join", "leave", "expiry"):
        assert sticky_moves[kind] == forced[kind], kind
    for kind in ("split", "merge", "reconnect", "disconnect", "prune"):
        assert sticky_moves[kind] == 0, kind
