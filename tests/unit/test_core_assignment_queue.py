"""Queue subscriptions (core.assignment.QueueCoordinator, PIP-486): entry buckets of segments
handed to queue consumers - disjoint, complete, balanced, sticky, gated by DAG drain - under
any sequence of sessions, splits, merges, rebucket rollovers, prunes and drains."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Mapping
from operator import methodcaller
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from scalable_topics.core.assignment import (
    CoordinatorResult,
    QueueCoordinator,
    Unit,
    bucket_slices,
)
from scalable_topics.core.buckets import initial_layout_buckets, layout_buckets
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import assignment_message
from tests.unit.test_core_assignment import NAMES, Event, EventRules, RandomRun

# -- helpers ---------------------------------------------------------------------------------


def owners(coordinator: QueueCoordinator) -> dict[Unit, str]:
    """Unit → consumer, from the consumers' assignments (each unit at most once)."""
    result: dict[Unit, str] = {}
    for name, assignment in coordinator.assignments().items():
        for unit in assignment.units:
            assert unit not in result, f"unit {unit} owned by {result[unit]} and {name}"
            result[unit] = name
    return result


def all_units(coordinator: QueueCoordinator) -> set[Unit]:
    counts = coordinator.buckets
    return {(s, b) for s in coordinator.tracked() if s in counts for b in range(counts[s])}


def consumable_units(coordinator: QueueCoordinator) -> dict[str, int]:
    return {
        name: sum(
            len(s.buckets or ()) for s in coordinator.assignment(name).segments if s.consumable
        )
        for name in coordinator.connected()
    }


def moves_between(before: Mapping[Unit, str], after: Mapping[Unit, str]) -> int:
    return sum(1 for u, owner in after.items() if u in before and before[u] != owner)


def check_invariants(coordinator: QueueCoordinator) -> None:
    layout = coordinator.layout
    drained = coordinator.drained_segments
    tracked = {i for i, s in layout.segments.items() if s.active or i not in drained}
    assert coordinator.tracked() == tracked
    owned = owners(coordinator)
    counts = coordinator.buckets
    if coordinator.sessions():
        assert set(owned) == all_units(coordinator), "every unit of a tracked segment is owned"
        assert set(coordinator.unassigned()) == {s for s in tracked if s not in counts}
    else:
        assert owned == {}
        assert set(coordinator.unassigned()) == tracked
    assert set(owned.values()) <= set(coordinator.sessions())
    for name, assignment in coordinator.assignments().items():
        assert assignment.layout_epoch == layout.epoch
        position = {s.segment_id: k for k, s in enumerate(assignment.segments)}
        for segment in assignment.segments:
            blockers = {a for a in layout.ancestors(segment.segment_id) if a in tracked}
            assert segment.consumable == (not blockers), (name, segment)
            assert set(segment.blocked_by) == blockers
            assert segment.buckets, "a segment is listed only with the buckets owned of it"
            assert list(segment.buckets) == sorted(set(segment.buckets))
            assert all(0 <= b < counts[segment.segment_id] for b in segment.buckets)
            for ancestor in layout.ancestors(segment.segment_id):
                if ancestor in position:
                    assert position[ancestor] < position[segment.segment_id], "DAG order"
    units = consumable_units(coordinator)
    if units:
        assert max(units.values()) - min(units.values()) <= 1, f"unbalanced: {units}"
    status = coordinator.to_status()
    assert status["type"] == "Queue"
    assert json.loads(json.dumps(status)) == status
    restored = QueueCoordinator.from_status(status, layout, now=0.0, buckets=counts)
    assert restored.to_status() == status
    assert all(not s.connected for s in restored.sessions().values())
    for segment_id in restored.tracked():
        holders = restored.holders(segment_id)
        if holders and segment_id in counts:
            slices = bucket_slices(holders, counts[segment_id])
            for holder in holders:
                got = {b for s, b in restored.owned(holder) if s == segment_id}
                assert got == set(slices[holder]), "restored holders get name-ordered slices"


def layout_with_buckets(segments: int, budget: int) -> tuple[SegmentLayout, dict[int, int]]:
    layout = SegmentLayout.initial(segments)
    return layout, initial_layout_buckets(layout, budget)


# -- examples --------------------------------------------------------------------------------


def test_three_workers_share_four_buckets_and_a_split_keeps_them_balanced() -> None:
    layout, counts = layout_with_buckets(1, 4)
    coordinator = QueueCoordinator(layout, buckets=counts)
    for name in ("a", "b", "c"):
        coordinator.register(name, 0.0)
    assert {n: coordinator.owned(n) for n in "abc"} == {
        "a": ((0, 0), (0, 1)),
        "b": ((0, 2),),
        "c": ((0, 3),),
    }
    split = layout.split(0)
    result = coordinator.layout_changed(split, 1.0, buckets=layout_buckets(split, counts))
    assert result.moved == ()
    for name in "abc":
        parent, *children = coordinator.assignment(name).segments
        assert parent.segment_id == 0 and parent.consumable
        assert children and all(not s.consumable and s.blocked_by == (0,) for s in children)
    # the children's four units were spread for the time the parent is drained
    after = {n: tuple(u for u in coordinator.owned(n) if u[0] != 0) for n in "abc"}
    assert sorted(len(v) for v in after.values()) == [1, 1, 2]
    result = coordinator.drained("b", 0, 2.0)
    assert result.rejected is None and result.moved == ()
    assert {n: coordinator.owned(n) for n in "abc"} == after
    check_invariants(coordinator)


def test_a_join_hands_over_only_what_balance_needs_and_a_leave_only_the_leavers() -> None:
    layout, counts = layout_with_buckets(2, 8)  # two segments of four buckets
    coordinator = QueueCoordinator(layout, buckets=counts)
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    before = owners(coordinator)
    result = coordinator.register("c", 1.0)
    after = owners(coordinator)
    assert moves_between(before, after) == 2 == len(coordinator.owned("c"))
    assert all(after[u] == "c" for u in after if before[u] != after[u])
    assert set(result.moved) == {s for s, _ in coordinator.owned("c")}
    # each donor gives its top bucket: every worker's buckets of a segment stay contiguous
    assert coordinator.owned("c") == ((0, 3), (1, 3))
    before = owners(coordinator)
    coordinator.unregister("a", 2.0)
    after = owners(coordinator)
    assert {u for u in after if before[u] != after[u]} == {u for u, n in before.items() if n == "a"}
    check_invariants(coordinator)


def test_a_sealed_backlog_fans_out_to_new_workers() -> None:
    """PIP-486 use case 1: one worker holds a sealed segment's four buckets; the workers that
    join take shares of the sealed backlog (stream segments would stay pinned)."""
    layout, counts = layout_with_buckets(1, 4)
    coordinator = QueueCoordinator(layout, buckets=counts)
    coordinator.register("a", 0.0)
    split = layout.split(0)
    coordinator.layout_changed(split, 1.0, buckets=layout_buckets(split, counts))
    for name in ("b", "c", "d"):
        coordinator.register(name, 2.0)
    assert sorted(coordinator.holders(0)) == ["a", "b", "c", "d"]
    assert all(len([u for u in coordinator.owned(n) if u[0] == 0]) == 1 for n in "abcd")
    check_invariants(coordinator)


def test_returning_worker_gets_exactly_its_units_and_expiry_redistributes() -> None:
    layout, counts = layout_with_buckets(2, 8)
    coordinator = QueueCoordinator(layout, buckets=counts, grace_period=10.0)
    for name in "abc":
        coordinator.register(name, 0.0)
    held = coordinator.owned("b")
    coordinator.disconnect("b", 1.0)
    assert coordinator.owned("b") == held, "held for the grace period"
    coordinator.register("d", 2.0)
    assert coordinator.owned("b") == held, "frozen: nothing taken from a worker in grace"
    coordinator.unregister("d", 3.0)
    result = coordinator.register("b", 5.0)
    assert coordinator.owned("b") == held and result.moved == ()
    coordinator.disconnect("b", 6.0)
    result = coordinator.tick(16.0)
    assert result.expired == ("b",)
    assert set(owners(coordinator)) == all_units(coordinator)
    assert {n for n in owners(coordinator).values()} == {"a", "c"}
    check_invariants(coordinator)


def test_a_segment_with_an_unknown_bucket_count_waits() -> None:
    layout, counts = layout_with_buckets(1, 4)
    coordinator = QueueCoordinator(layout, buckets=counts)
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    split = layout.split(0)
    coordinator.layout_changed(split, 1.0)  # the DAG does not know the children's counts yet
    assert coordinator.unassigned() == (1, 2)
    assert all(s == 0 for n in "ab" for s, _ in coordinator.owned(n))
    coordinator.drained("a", 0, 2.0)
    assert coordinator.unassigned() == (1, 2) and not any(coordinator.owned(n) for n in "ab")
    result = coordinator.buckets_changed(layout_buckets(split, counts), 3.0)
    assert {p.consumer for p in result.push} == {"a", "b"}
    assert coordinator.unassigned() == ()
    assert sorted(len(coordinator.owned(n)) for n in "ab") == [2, 2]
    check_invariants(coordinator)


def test_drain_reports_come_from_any_holder_of_a_consumable_segment() -> None:
    layout, counts = layout_with_buckets(1, 4)
    coordinator = QueueCoordinator(layout, buckets=counts)
    for name in "ab":
        coordinator.register(name, 0.0)
    coordinator.register("c", 0.0)
    split = layout.split(0).split(1)  # a grandchild chain: 1 is sealed and gated by 0
    coordinator.layout_changed(split, 1.0, buckets=layout_buckets(split, counts))
    assert "is ACTIVE" in (coordinator.drained("a", 2, 2.0).rejected or "")
    outsider = next(n for n in "abc" if n not in coordinator.holders(1))
    holder = coordinator.holders(1)[0]
    assert "not consumable" in (coordinator.drained(holder, 1, 2.0).rejected or "")
    assert coordinator.drained(None, 0, 2.0).rejected is None  # the controller's own view
    assert "not assigned" in (coordinator.drained(outsider, 1, 3.0).rejected or "")
    assert coordinator.drained(holder, 1, 3.0).rejected is None
    assert coordinator.drained_segments == {0, 1}
    check_invariants(coordinator)


def test_status_is_holders_per_segment_and_restores_name_ordered_slices() -> None:
    layout, counts = layout_with_buckets(1, 4)
    coordinator = QueueCoordinator(layout, buckets=counts)
    for name in ("c", "a", "b"):
        coordinator.register(name, 0.0)
    status = coordinator.to_status()
    assert status == {
        "layoutEpoch": 0,
        "consumers": [{"name": n, "segments": [0]} for n in "abc"],
        "drainedSegments": [],
        "type": "Queue",
    }
    restored = QueueCoordinator.from_status(status, layout, 100.0, buckets=counts, grace_period=5)
    assert {n: restored.owned(n) for n in "abc"} == {
        "a": ((0, 0),),
        "b": ((0, 1),),
        "c": ((0, 2), (0, 3)),
    }
    assert {n: s.grace_deadline for n, s in restored.sessions().items()} == dict.fromkeys(
        "abc", 105.0
    )
    with pytest.raises(ValueError, match="listed twice"):
        QueueCoordinator.from_status(
            {"consumers": [{"name": "a"}, {"name": "a"}]}, layout, 0.0, buckets=counts
        )
    with pytest.raises(ValueError, match="bucket count"):
        QueueCoordinator(layout, buckets={0: 0})


def test_bucket_slices_are_contiguous_and_cover_every_bucket() -> None:
    assert bucket_slices(["b", "a"], 5) == {"a": (0, 1), "b": (2, 3, 4)}
    assert bucket_slices(["a", "b", "c"], 2) == {"a": (0,), "b": (1,), "c": ()}
    for holders in range(1, 7):
        for buckets in range(1, 9):
            names = [f"n{i}" for i in range(holders)]
            slices = bucket_slices(names, buckets)
            flat = [b for n in sorted(names) for b in slices[n]]
            assert flat == list(range(buckets))
            sizes = [len(v) for v in slices.values() if v]
            assert max(sizes) - min(sizes) <= 1


def test_queue_assignment_message_names_the_buckets() -> None:
    layout, counts = layout_with_buckets(2, 4)
    coordinator = QueueCoordinator(layout, buckets=counts)
    coordinator.register("a", 0.0)
    coordinator.register("b", 0.0)
    message = assignment_message("ns", "t", "q", coordinator.assignment("b"), {})
    assert [(s.segment_id, s.buckets) for s in message.segments] == [
        (s, tuple(b for t, b in coordinator.owned("b") if t == s))
        for s in sorted({s for s, _ in coordinator.owned("b")})
    ]


# -- property-based: any sequence of events keeps the invariants ------------------------------


class QueueMachine(EventRules):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        layout, self.counts = layout_with_buckets(2, 8)
        self.coordinator: QueueCoordinator = QueueCoordinator(
            layout, buckets=self.counts, grace_period=60.0
        )
        self.rebucketed: dict[int, int] = {}

    def relayout(self, new: SegmentLayout, data: st.DataObject) -> None:
        """The new layout with the bucket counts of its segments, known to the coordinator at
        once or only later (``learn_buckets``); a rebucket successor gets a random count."""
        old = self.coordinator.layout.segments
        for segment_id, info in new.segments.items():
            parents = [old[p] for p in info.parent_ids if p in old]
            if (
                segment_id not in old
                and len(parents) == 1
                and parents[0].hash_range == info.hash_range
            ):
                self.rebucketed[segment_id] = data.draw(st.integers(1, 6))
        self.counts = layout_buckets(new, self.counts, rebucketed=self.rebucketed)
        known = data.draw(st.booleans())
        buckets = self.counts if known else {s: n for s, n in self.counts.items() if s in old}
        self.apply(methodcaller("layout_changed", new, self.now, buckets))

    def apply(self, event: Callable[[Any], CoordinatorResult]) -> CoordinatorResult:
        coordinator = self.coordinator
        before = owners(coordinator)
        views = {n: a for n, a in coordinator.assignments().items()}
        frozen = {n for n, s in coordinator.sessions().items() if not s.connected}
        status_before = coordinator.to_status()
        result = event(coordinator)
        after = owners(coordinator)
        changed = {c.consumer for c in result.changes}
        for name in set(views) | set(coordinator.sessions()):
            old = views.get(name)
            new = coordinator.assignments().get(name)
            if old is not None and (new is None or old.segments != new.segments):
                assert name in changed, name
        connected = set(coordinator.connected())
        assert changed & connected <= {p.consumer for p in result.push}
        for push in result.push:
            assert push.consumer in connected
            assert push.assignment == coordinator.assignment(push.consumer)
        if {k: v for k, v in status_before.items() if k != "layoutEpoch"} != {
            k: v for k, v in coordinator.to_status().items() if k != "layoutEpoch"
        }:
            assert result.persist is not None
        if result.persist is not None:
            assert result.persist.status == coordinator.to_status()
        # sticky: a worker in its grace period keeps every unit still tracked and gains none
        # while another worker is connected
        sessions = coordinator.sessions()
        for name in frozen:
            if name in sessions and not sessions[name].connected:
                mine_before = {u for u, n in before.items() if n == name}
                mine_after = {u for u, n in after.items() if n == name}
                assert mine_before & set(after) <= mine_after
                if coordinator.connected():
                    assert mine_after <= mine_before
        moved = {u[0] for u in after if u in before and before[u] != after[u]}
        assert moved == set(result.moved)
        return result

    @rule()
    def learn_buckets(self) -> None:
        self.apply(methodcaller("buckets_changed", dict(self.counts), self.now))

    @precondition(lambda self: any(not s.active for s in self.coordinator.layout.segments.values()))
    @rule(data=st.data(), by_holder=st.booleans())
    def drained(self, data: st.DataObject, by_holder: bool) -> None:
        coordinator = self.coordinator
        sealed = sorted(i for i, s in coordinator.layout.segments.items() if not s.active)
        segment_id = data.draw(st.sampled_from(sealed))
        holders = coordinator.holders(segment_id)
        pool = holders if by_holder and holders else NAMES
        name = data.draw(st.sampled_from(pool))
        acceptable = segment_id not in coordinator.tracked() or (
            name in holders and coordinator.is_consumable(segment_id)
        )
        result = self.apply(methodcaller("drained", name, segment_id, self.now))
        assert (result.rejected is None) == acceptable, result.rejected

    @invariant()
    def invariants_hold(self) -> None:
        check_invariants(self.coordinator)


TestQueueCoordinator = QueueMachine.TestCase
TestQueueCoordinator.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- how much moves over a long random sequence -----------------------------------------------


@pytest.mark.parametrize("seed", [3, 2026])
def test_joins_and_leaves_move_exactly_what_balance_forces(seed: int) -> None:
    """Joins, leaves, expiries, returns, splits, merges and drains at random: a join moves
    units only to the newcomer, as many as it ends with; a leave or an expiry moves only the
    leaver's units; returns, splits, merges and prunes move nothing."""
    layout, counts = layout_with_buckets(2, 8)
    coordinator = QueueCoordinator(layout, buckets=counts, grace_period=60.0)
    moves: Counter[str] = Counter()

    def apply(kind: str, name: str, event: Event) -> None:
        before = owners(coordinator)
        event(coordinator)
        after = owners(coordinator)
        moved = {u for u in after if u in before and before[u] != after[u]}
        moves[kind] += len(moved)
        if kind == "join":
            assert {after[u] for u in moved} <= {name}
            assert len(moved) == len([u for u in coordinator.owned(name) if u in before])
        elif kind in ("leave", "expiry"):
            assert {before[u] for u in moved} <= {name}
        else:
            assert not moved, kind

    def relayout(new: SegmentLayout, now: float) -> Event:
        counts.update(layout_buckets(new, counts))
        return methodcaller("layout_changed", new, now, dict(counts))

    run = RandomRun(random.Random(seed), layout, apply, relayout)
    for _ in range(250):
        run.step()
        # the holders drain every consumable sealed segment
        while ready := [
            s
            for s in sorted(coordinator.tracked())
            if not run.layout.segments[s].active
            and coordinator.is_consumable(s)
            and set(coordinator.holders(s)) & set(coordinator.connected())
        ]:
            for segment_id in ready:
                holder = sorted(set(coordinator.holders(segment_id)) & set(coordinator.connected()))
                assert coordinator.drained(holder[0], segment_id, run.now).rejected is None
        run.prune(coordinator.drained_segments)
        check_invariants(coordinator)
    print(f"\nseed {seed}: unit moves by event {dict(sorted(moves.items()))}")
    assert moves["join"] > 0 and moves["leave"] + moves["expiry"] > 0
