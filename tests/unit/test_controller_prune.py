"""The retention decision the leader prunes by (``core.retention``): which sealed segments may
leave the DAG, and what a broker's segment stats say about drains."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import ResourceValidationError, parse_topic_spec
from scalable_topics.core.retention import (
    RetentionRule,
    SegmentDrains,
    drains_from_stats,
    next_expiry,
    prunable,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def chain() -> SegmentLayout:
    """0 split into 1, 2; then 1 split into 3, 4 (0 and 1 sealed, 2, 3, 4 active)."""
    return SegmentLayout.initial(1).split(0).split(1)


# -- examples ----------------------------------------------------------------------------------


def test_nothing_is_pruned_without_retention() -> None:
    layout = chain()
    everything = set(layout.segments)
    times = {0: 0.0, 1: 0.0}
    assert prunable(layout, times, everything, None, now=1e9) == []
    assert prunable(layout, times, everything, RetentionRule(), now=1e9) == []


def test_a_drained_root_goes_when_its_time_has_passed() -> None:
    layout = SegmentLayout.initial(1).split(0)
    rule = RetentionRule(time=10.0)
    assert prunable(layout, {0: 100.0}, {0}, rule, now=109.9) == []
    assert prunable(layout, {0: 100.0}, {0}, rule, now=110.0) == [0]
    assert prunable(layout, {0: 100.0}, set(), rule, now=1e9) == [], "undrained"
    assert prunable(layout, {}, {0}, rule, now=1e9) == [], "seal time unknown"
    assert prunable(layout, {0: 100.0}, {0}, RetentionRule(time=0), now=100.0) == [0]


def test_the_dag_is_trimmed_from_its_oldest_end() -> None:
    layout = chain()
    rule = RetentionRule(time=1.0)
    times = {0: 10.0, 1: 20.0}
    assert prunable(layout, times, {0, 1}, rule, now=100.0) == [0, 1]
    # 1 is drained and old enough, but its parent 0 is still needed: 1 stays too.
    assert prunable(layout, times, {1}, rule, now=100.0) == []
    # 0 is old enough, 1 is not yet.
    assert prunable(layout, times, {0, 1}, rule, now=20.5) == [0]
    pruned = layout.prune(0).prune(1)
    pruned.validate()
    assert sorted(pruned.segments) == [2, 3, 4]
    assert all(not s.parent_ids for s in pruned.segments.values())
    assert pruned.epoch == layout.epoch + 2
    assert pruned.next_segment_id == layout.next_segment_id


def test_active_segments_are_never_pruned() -> None:
    layout = SegmentLayout.initial(2)
    assert prunable(layout, {0: 0.0, 1: 0.0}, {0, 1}, RetentionRule(time=0), now=1e9) == []


def test_a_merge_parent_goes_alone_and_its_child_keeps_the_other() -> None:
    layout = SegmentLayout.initial(2).merge(0, 1)
    assert prunable(layout, {0: 5.0, 1: 5.0}, {0}, RetentionRule(time=1), now=10.0) == [0]
    after = layout.prune(0)
    after.validate()
    assert after.segments[2].parent_ids == (1,)


def test_size_limit_prunes_oldest_first_until_under_it() -> None:
    # Two sealed roots: 0 (older) and 1; 2, 3, 4, 5 active.
    layout = SegmentLayout.initial(2).split(0).split(1)
    times = {0: 10.0, 1: 20.0}
    sizes = {0: 100, 1: 50}
    rule = RetentionRule(size=120)
    assert prunable(layout, times, {0, 1}, rule, now=30.0, sizes=sizes) == [0]
    assert prunable(layout, times, {0, 1}, RetentionRule(size=40), 30.0, sizes) == [0, 1]
    assert prunable(layout, times, {0, 1}, RetentionRule(size=150), 30.0, sizes) == []
    # Either limit prunes: 1 is under the size limit but past its time.
    both = RetentionRule(time=5.0, size=120)
    assert prunable(layout, times, {0, 1}, both, now=26.0, sizes=sizes) == [0, 1]
    # An undrained segment counts for nothing and is never pruned.
    assert prunable(layout, times, {1}, RetentionRule(size=10), 30.0, sizes) == [1]


def test_next_expiry_is_the_earliest_future_deadline() -> None:
    layout = chain()
    rule = RetentionRule(time=10.0)
    assert next_expiry(layout, {0: 10.0, 1: 20.0}, rule, now=5.0) == 20.0
    assert next_expiry(layout, {0: 10.0, 1: 20.0}, rule, now=25.0) == 30.0
    assert next_expiry(layout, {0: 10.0, 1: 20.0}, rule, now=30.0) is None
    assert next_expiry(layout, {0: 10.0}, RetentionRule(size=1), now=0.0) is None
    assert next_expiry(layout, {0: 10.0}, None, now=0.0) is None


def test_retention_rule_is_checked_and_read_from_the_spec() -> None:
    with pytest.raises(ValueError, match="time"):
        RetentionRule(time=-1.0)
    with pytest.raises(ValueError, match="size"):
        RetentionRule(size=math.inf)  # type: ignore[arg-type]
    spec = parse_topic_spec({"retention": {"time": "1m30s", "size": "1Ki"}})
    assert spec.retention is not None
    assert spec.retention.rule() == RetentionRule(time=90.0, size=1024)
    assert parse_topic_spec({"retention": {}}).retention.rule().enabled is False  # type: ignore[union-attr]
    with pytest.raises(ResourceValidationError):
        parse_topic_spec({"retention": {"time": "-1s"}})


# -- broker stats -------------------------------------------------------------------------------


def stats(**fields: Any) -> dict[str, Any]:
    """A segment's admin stats in the broker's shape (segment_broker.admin ``_stats``)."""
    body: dict[str, Any] = {
        "segmentId": 0,
        "sealed": True,
        "lastPosition": 9,
        "seal": {"lastPosition": 10, "successors": [], "sealedAt": 1700000000.5},
        "subscriptions": {
            "billing": {"type": "Exclusive", "ackFloor": 11, "backlog": 0, "drained": True},
            "audit": {"type": "Queue", "ackFloor": 4, "backlog": 6, "drained": False},
        },
        "log": {"files": 1, "bytes": 4096},
    }
    body.update(fields)
    return body


def test_drains_from_stats_reads_the_brokers_flags() -> None:
    drains = drains_from_stats(stats())
    assert drains == SegmentDrains(
        sealed=True,
        drained=frozenset({"billing"}),
        undrained=frozenset({"audit"}),
        size=4096,
        sealed_at=1700000000.5,
    )
    assert not drains.fully_drained
    done = stats(
        subscriptions={"billing": {"ackFloor": 11, "backlog": 0, "drained": True}},
    )
    assert drains_from_stats(done).fully_drained


def test_an_active_segment_is_never_drained() -> None:
    active = stats(
        sealed=False,
        seal=None,
        subscriptions={"billing": {"ackFloor": 11, "backlog": 0, "drained": True}},
    )
    drains = drains_from_stats(active)
    assert not drains.sealed and not drains.fully_drained
    assert drains.undrained == {"billing"} and drains.sealed_at is None


def test_without_the_flag_the_cursor_must_be_past_the_seal() -> None:
    subs = {
        "past": {"ackFloor": 11, "backlog": 0},
        "at-end": {"ackFloor": 10, "backlog": 0},
        "behind": {"ackFloor": 3, "backlog": 7},
        "garbage": {"ackFloor": "11"},
    }
    drains = drains_from_stats(stats(subscriptions=subs))
    assert drains.drained == {"past"}
    assert drains.undrained == {"at-end", "behind", "garbage"}


def test_a_sealed_segment_without_subscriptions_is_drained() -> None:
    drains = drains_from_stats(stats(subscriptions={}))
    assert drains.fully_drained and drains.drained == frozenset()


# -- properties ---------------------------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> SegmentLayout:
    layout = SegmentLayout.initial(draw(st.integers(1, 4), label="initial"))
    for _ in range(draw(st.integers(1, 14), label="steps")):
        active = layout.active()
        splittable = [s for s in active if s.hash_range.size > 1]
        can_merge = len(active) >= 2
        if can_merge and (not splittable or draw(st.booleans(), label="merge?")):
            k = draw(st.integers(0, len(active) - 2), label="pair")
            layout = layout.merge(active[k].segment_id, active[k + 1].segment_id)
        else:
            layout = layout.split(draw(st.sampled_from(splittable), label="split").segment_id)
    return layout


@SETTINGS
@given(st.data())
def test_pruning_keeps_a_valid_dag_and_every_undrained_segment(data: st.DataObject) -> None:
    layout = data.draw(dags(), label="layout")
    ids = sorted(layout.segments)
    mostly = st.sampled_from([True, True, True, False])
    # Most segments drained, and some active ones claimed drained too: the decision must not
    # trust that.
    drained = {i for i in ids if data.draw(mostly, label=f"drained {i}")}
    # Seal times follow the epoch (a parent is sealed before its children), with jitter.
    sealed_at = {
        i: s.sealed_at_epoch * 10.0 + data.draw(st.floats(0, 15), label=f"t{i}")
        for i, s in layout.segments.items()
        if not s.active and data.draw(mostly, label=f"known {i}")
    }
    sizes = {i: data.draw(st.integers(0, 1000), label=f"size {i}") for i in ids}
    kind = data.draw(st.sampled_from(["none", "empty", "time", "time", "size", "both"]))
    retention = None if kind == "none" else RetentionRule()
    if kind in ("time", "both"):
        retention = RetentionRule(time=data.draw(st.floats(0, 200), label="time"))
    if kind in ("size", "both"):
        size = data.draw(st.integers(0, 3000), label="size")
        retention = RetentionRule(time=retention.time if retention else None, size=size)
    now = data.draw(st.floats(0, 600), label="now")

    pruned = prunable(layout, sealed_at, drained, retention, now, sizes)

    assert len(pruned) == len(set(pruned))
    result = layout
    for sid in pruned:
        segment = result.segments[sid]
        assert not segment.active
        assert sid in drained and sid in sealed_at
        assert not any(p in result.segments for p in segment.parent_ids), "a parent stays"
        assert all(c in result.segments for c in segment.child_ids)
        result = result.prune(sid)
        result.validate()
    assert [(s.segment_id, s.hash_range) for s in result.active()] == [
        (s.segment_id, s.hash_range) for s in layout.active()
    ]
    assert result.epoch == layout.epoch + len(pruned)
    assert set(layout.segments) - set(result.segments) == set(pruned)
    for sid, segment in layout.segments.items():
        if sid not in drained or segment.active:
            assert sid in result.segments, f"undrained or active {sid} was lost"
    if retention is None or not retention.enabled:
        assert pruned == []
    elif retention.size is None:
        assert retention.time is not None
        assert all(now >= sealed_at[s] + retention.time for s in pruned)
    # Maximal and idempotent: what stays is not prunable by the same facts.
    assert prunable(result, sealed_at, drained, retention, now, sizes) == []
    # The layout survives its metadata round trip (what the CAS writes and the next leader reads).
    assert SegmentLayout.from_metadata(result.to_metadata()) == result
