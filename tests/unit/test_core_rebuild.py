"""Rebuilding a lost ``status.layout`` from the Segment records and the brokers' reports
(``core.rebuild``), and the rule for which segments outside the DAG may be deleted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalable_topics.core.buckets import rebucket
from scalable_topics.core.layout import HashRange, SegmentInfo, SegmentLayout
from scalable_topics.core.operation import OperationKind, Phase, Recovery, recovery
from scalable_topics.core.rebuild import (
    BrokerReport,
    LayoutRebuildError,
    SegmentRecord,
    broker_report,
    one_report_each,
    orphans,
    rebuild_layout,
    record_from_segment,
    request_after_rebuild,
    subscription_entries,
    unfinished_creation,
)
from scalable_topics.core.resources import SegmentPhase

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Shape = dict[int, tuple[HashRange, str, tuple[int, ...], tuple[int, ...]]]


def shape(layout: SegmentLayout) -> Shape:
    """The DAG without epochs: ranges, states and links."""
    return {
        sid: (s.hash_range, s.state.value, s.parent_ids, s.child_ids)
        for sid, s in layout.segments.items()
    }


def unordered(layout: SegmentLayout) -> Shape:
    return {
        sid: (r, state, tuple(sorted(parents)), children)
        for sid, (r, state, parents, children) in shape(layout).items()
    }


def epochs(layout: SegmentLayout) -> dict[int, tuple[int, int]]:
    return {sid: (s.created_at_epoch, s.sealed_at_epoch) for sid, s in layout.segments.items()}


def records_of(
    layout: SegmentLayout,
    origin: Mapping[int, tuple[int, ...]],
    *,
    with_epochs: bool = True,
    pending: frozenset[int] = frozenset(),
    active: frozenset[int] = frozenset(),
) -> list[SegmentRecord]:
    """What the Segment resources of ``layout`` say: ``origin`` holds each segment's parents at
    its creation (a Segment's spec is immutable, so a pruned parent stays named), ``pending``
    are recorded Pending and ``active`` recorded Active whatever the DAG says (the leader had
    not marked them yet)."""
    found = []
    for sid, info in layout.segments.items():
        if sid in pending:
            state = SegmentPhase.PENDING
        elif sid in active:
            state = SegmentPhase.ACTIVE
        else:
            state = SegmentPhase.from_layout(info.state)
        found.append(
            SegmentRecord(
                segment_id=sid,
                hash_range=info.hash_range,
                parent_ids=origin.get(sid, ()),
                state=state,
                buckets=1,
                created_at_epoch=info.created_at_epoch if with_epochs else None,
                sealed_at_epoch=(info.sealed_at_epoch or None) if with_epochs else None,
            )
        )
    return found


def reports_of(layout: SegmentLayout, pods: Mapping[int, str] | None = None) -> list[BrokerReport]:
    """What the brokers say of ``layout``: a sealed segment's seal names its children."""
    return [
        BrokerReport(
            segment_id=sid,
            hash_range=info.hash_range,
            buckets=1,
            sealed=not info.active,
            writable=True,
            successors=info.child_ids,
            sealed_at=100.0 if not info.active else None,
            pod=(pods or {}).get(sid, "segment-broker-0"),
            url="http://127.0.0.9:8080",
        )
        for sid, info in layout.segments.items()
    ]


@st.composite
def histories(draw: st.DrawFn) -> tuple[SegmentLayout, dict[int, tuple[int, ...]], list[int]]:
    """A layout reached by random splits, merges, rebuckets and prunes; each segment's parents
    at creation; the children of the last operation."""
    layout = SegmentLayout.initial(draw(st.integers(1, 5), label="initial"))
    origin: dict[int, tuple[int, ...]] = {}
    last: list[int] = []
    for _ in range(draw(st.integers(0, 14), label="steps")):
        active = layout.active()
        sealed = sorted(i for i, s in layout.segments.items() if not s.active and not s.parent_ids)
        ops = ["rebucket"]
        ops += ["split"] if any(s.hash_range.size > 1 for s in active) else []
        ops += ["merge"] if len(active) >= 2 else []
        ops += ["prune"] if sealed else []
        op = draw(st.sampled_from(ops), label="op")
        if op == "split":
            target = draw(
                st.sampled_from([s for s in active if s.hash_range.size > 1]), label="split"
            )
            r = target.hash_range
            at = draw(st.one_of(st.none(), st.integers(r.start, r.end - 1)), label="at")
            new = layout.split(target.segment_id, at)
        elif op == "merge":
            start = draw(st.integers(0, len(active) - 2), label="merge")
            pair = [active[start].segment_id, active[start + 1].segment_id]
            if draw(st.booleans(), label="reversed"):
                pair.reverse()
            new = layout.merge(*pair)
        elif op == "prune":
            new = layout.prune(draw(st.sampled_from(sealed), label="prune"))
        else:
            chosen = draw(
                st.lists(
                    st.sampled_from([s.segment_id for s in active]),
                    min_size=1,
                    max_size=3,
                    unique=True,
                ),
                label="rebucket",
            )
            new = rebucket(layout, chosen)
        created = sorted(set(new.segments) - set(layout.segments))
        for sid in created:
            origin[sid] = new.segments[sid].parent_ids
        if created:
            last = created
        layout = new
    return layout, origin, last


# -- the property ------------------------------------------------------------------------------


@SETTINGS
@given(histories(), st.booleans())
def test_the_records_of_any_layout_rebuild_it(
    history: tuple[SegmentLayout, dict[int, tuple[int, ...]], list[int]], with_epochs: bool
) -> None:
    layout, origin, _ = history
    rebuilt = rebuild_layout(records_of(layout, origin, with_epochs=with_epochs))
    assert rebuilt.operation is None
    assert shape(rebuilt.layout) == shape(layout)
    assert rebuilt.layout.next_segment_id == layout.next_segment_id
    assert rebuilt.layout.epoch > layout.epoch, "a rebuilt epoch must not go back"
    if with_epochs:
        assert epochs(rebuilt.layout) == epochs(layout)
    else:
        for info in rebuilt.layout.segments.values():
            for child in info.child_ids:
                assert rebuilt.layout.segments[child].created_at_epoch > info.created_at_epoch
    assert SegmentLayout.from_metadata(rebuilt.layout.to_metadata()) == rebuilt.layout


@SETTINGS
@given(histories(), st.booleans())
def test_the_brokers_reports_of_any_layout_rebuild_it(
    history: tuple[SegmentLayout, dict[int, tuple[int, ...]], list[int]], with_segments: bool
) -> None:
    """Segments gone: the seals' successors give the links back. Some Segments left: they and
    the brokers together."""
    layout, origin, _ = history
    records = records_of(layout, origin)[::2] if with_segments else []
    rebuilt = rebuild_layout(records, reports_of(layout))
    # A merge child's parents come back in ring order (the seals do not say the request's).
    assert unordered(rebuilt.layout) == unordered(layout)
    assert rebuilt.layout.epoch > layout.epoch or records
    assert set(rebuilt.from_brokers) == set(layout.segments) - {r.segment_id for r in records}


@SETTINGS
@given(histories())
def test_a_last_operation_the_leader_never_marked_resumes_to_the_same_dag(
    history: tuple[SegmentLayout, dict[int, tuple[int, ...]], list[int]],
) -> None:
    """The last operation's children still Pending and its parents still Active in the records
    (the status went before the leader marked them): whether or not it had committed, resuming
    it gives the same DAG."""
    layout, origin, last = history
    pending = frozenset(s for s in last if s in layout.segments and layout.segments[s].active)
    parents = frozenset(p for s in pending for p in origin[s] if p in layout.segments)
    records = records_of(layout, origin, pending=pending, active=parents)
    rebuilt = rebuild_layout(records, operation_id="op-x")
    resumed = rebuilt.layout
    if rebuilt.operation is not None:
        # (A pruned parent proves its operation committed: such children are not resumed.)
        assert {c.segment_id for c in rebuilt.operation.children} <= pending
        assert rebuilt.operation.base_epoch == resumed.epoch
        assert (
            recovery(rebuilt.operation, resumed, any_parent_sealed=False) is Recovery.ROLL_FORWARD
        )
        resumed = rebuilt.operation.apply(resumed)
    assert shape(resumed) == shape(layout)
    assert resumed.next_segment_id == layout.next_segment_id


# -- examples: interrupted operations ----------------------------------------------------------


def record(
    sid: int,
    start: int,
    end: int,
    parents: tuple[int, ...] = (),
    state: SegmentPhase = SegmentPhase.ACTIVE,
    buckets: int = 1,
) -> SegmentRecord:
    return SegmentRecord(sid, HashRange(start, end), parents, state, buckets)


SEALED, PENDING = SegmentPhase.SEALED, SegmentPhase.PENDING


def test_an_interrupted_split_is_resumed_not_dropped() -> None:
    records = [
        record(0, 0, 0x7FFF),
        record(1, 0x8000, 0xFFFF),
        record(2, 0x8000, 0x8FFF, (1,), PENDING, buckets=2),
        record(3, 0x9000, 0xFFFF, (1,), PENDING, buckets=2),
    ]
    rebuilt = rebuild_layout(records, operation_id="rebuilt-1", started_at="2024-01-01T00:00:00Z")
    assert sorted(rebuilt.layout.segments) == [0, 1]
    assert rebuilt.layout.segments[1].active and rebuilt.layout.next_segment_id == 2
    op = rebuilt.operation
    assert op is not None
    assert (op.id, op.kind, op.parents, op.at, op.phase) == (
        "rebuilt-1",
        OperationKind.SPLIT,
        (1,),
        0x8FFF,
        Phase.INTENT,
    )
    assert [(c.segment_id, c.hash_range.hex(), c.buckets) for c in op.children] == [
        (2, "8000-8fff", 2),
        (3, "9000-ffff", 2),
    ]
    assert op.source == "rebuilt" and "status.layout" in op.reason
    assert op.to_status()["startedAt"] == "2024-01-01T00:00:00Z"
    after = op.apply(rebuilt.layout)
    assert not after.segments[1].active and after.segments[1].child_ids == (2, 3)


def test_an_interrupted_merge_and_rebucket() -> None:
    merge = rebuild_layout(
        [
            record(0, 0, 0x7FFF),
            record(1, 0x8000, 0xFFFF),
            record(2, 0, 0xFFFF, (1, 0), PENDING),
        ]
    )
    assert merge.operation is not None
    assert (merge.operation.kind, merge.operation.parents) == (OperationKind.MERGE, (1, 0))
    assert merge.operation.apply(merge.layout).segments[2].parent_ids == (1, 0)

    roll = rebuild_layout(
        [
            record(0, 0, 0x7FFF),
            record(1, 0x8000, 0xFFFF),
            record(2, 0, 0x7FFF, (0,), PENDING, buckets=8),
            record(3, 0x8000, 0xFFFF, (1,), PENDING, buckets=8),
        ]
    )
    assert roll.operation is not None
    assert (roll.operation.kind, roll.operation.parents) == (OperationKind.REBUCKET, (0, 1))
    assert [c.buckets for c in roll.operation.children] == [8, 8]
    assert sorted(roll.operation.apply(roll.layout).active(), key=lambda s: s.segment_id) == [
        roll.operation.apply(roll.layout).segments[2],
        roll.operation.apply(roll.layout).segments[3],
    ]


def test_a_parent_marked_sealed_means_the_operation_committed() -> None:
    rebuilt = rebuild_layout(
        [
            record(0, 0, 0xFFFF, state=SEALED),
            record(1, 0, 0x7FFF, (0,), PENDING),
            record(2, 0x8000, 0xFFFF, (0,), PENDING),
        ]
    )
    assert rebuilt.operation is None
    assert [s.segment_id for s in rebuilt.layout.active()] == [1, 2]
    assert not rebuilt.layout.segments[0].active


def test_an_older_pending_segment_is_committed() -> None:
    """Only the newest segments can be the children of an operation that never committed."""
    rebuilt = rebuild_layout(
        [
            record(0, 0, 0xFFFF),
            record(1, 0, 0x7FFF, (0,), PENDING),
            record(2, 0x8000, 0xFFFF, (0,), PENDING),
            record(3, 0x8000, 0xBFFF, (2,)),
            record(4, 0xC000, 0xFFFF, (2,)),
        ]
    )
    assert rebuilt.operation is None
    assert [s.segment_id for s in rebuilt.layout.active()] == [1, 3, 4]


def test_a_pending_root_is_active() -> None:
    """An initial segment whose status the leader never wrote (crash before the broker had it)."""
    rebuilt = rebuild_layout([record(0, 0, 0x7FFF, state=PENDING), record(1, 0x8000, 0xFFFF)])
    assert rebuilt.operation is None and len(rebuilt.layout.active()) == 2


# -- examples: what cannot be rebuilt ----------------------------------------------------------


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], "no Segment resource and no broker"),
        ([record(0, 0, 0x7FFF)], "gap at 0x8000"),
        ([record(0, 0, 0xFFFF), record(1, 0x8000, 0xFFFF)], "do not partition the ring: overlap"),
        (
            [record(0, 0, 0x7FFF, state=SEALED), record(1, 0x8000, 0xFFFF)],
            "segment 0 (0000-7fff) is sealed (Segment) but no segment names it as a parent",
        ),
        (
            [record(0, 0, 0xFFFF), record(1, 0, 0x7FFF, (0,)), record(2, 0x9000, 0xFFFF, (0,))],
            "segments [1, 2] (0000-7fff, 9000-ffff) do not cover exactly the range of their "
            "parents [0] (0000-ffff)",
        ),
        (
            [record(0, 0, 0xFFFF), record(1, 0, 0xFFFF, (2,)), record(2, 0, 0xFFFF)],
            "segment 1 names parent 2, which is not older",
        ),
        (
            [
                record(0, 0, 0x7FFF),
                record(1, 0x8000, 0xFFFF),
                record(2, 0, 0x7FFF, (0,)),
                record(3, 0, 0xFFFF, (0, 1)),
            ],
            "segment 0 is the parent of [2, 3], which name different parents",
        ),
        (
            [record(0, 0, 0xFFFF), record(1, 0, 0xFFF, (0,), PENDING)],
            "segments [1] (0000-0fff) do not cover exactly the range of their parents [0]",
        ),
    ],
)
def test_inconsistent_records_are_named(records: list[SegmentRecord], expected: str) -> None:
    with pytest.raises(LayoutRebuildError) as info:
        rebuild_layout(records)
    assert expected in str(info.value)


def test_a_segment_and_its_broker_disagreeing_is_an_error() -> None:
    layout = SegmentLayout.initial(2)
    reports = reports_of(layout)
    with pytest.raises(LayoutRebuildError, match=r"segment 1: Segment says range 8000-8fff"):
        rebuild_layout([record(0, 0, 0x7FFF), record(1, 0x8000, 0x8FFF)], reports)


def test_a_segment_on_two_brokers_is_an_error() -> None:
    layout = SegmentLayout.initial(1)
    reports = [*reports_of(layout), *reports_of(layout, {0: "segment-broker-1"})]
    with pytest.raises(LayoutRebuildError, match="segment 0 is on two brokers"):
        rebuild_layout([], reports)
    # A Segment resource says which one: the rebuild uses it, not the brokers' copies.
    assert rebuild_layout([record(0, 0, 0xFFFF)], reports).from_brokers == {}


def test_one_report_each_names_a_segment_on_two_brokers() -> None:
    """The rule the rebuild and the write-back of a missing Segment share."""
    layout = SegmentLayout.initial(2)
    reports = [*reports_of(layout), *reports_of(layout, {0: "segment-broker-1"})]
    problems: list[str] = []
    found = one_report_each(reports, problems)
    assert problems == [
        "segment 0 is on two brokers (segment-broker-0 and segment-broker-1) and no Segment "
        "resource says which one owns it"
    ]
    assert sorted(found) == [0, 1] and found[0].pod == "segment-broker-0"
    problems.clear()
    assert sorted(one_report_each(reports, problems, known={0})) == [0, 1]
    assert problems == []


# -- brokers -------------------------------------------------------------------------------------


def test_a_fenced_child_of_a_sealed_parent_is_committed() -> None:
    """From the brokers alone: the parent's seal names its children, which were not activated
    yet (phase ParentsSealed): forward only, they are active in the DAG."""
    layout = SegmentLayout.initial(1).split(0)
    reports = [
        BrokerReport(0, HashRange(0, 0xFFFF), 4, True, True, (1, 2), 50.0, "b-0", "u0"),
        BrokerReport(1, HashRange(0, 0x7FFF), 2, False, False, (), None, "b-1", "u1"),
        BrokerReport(2, HashRange(0x8000, 0xFFFF), 2, False, False, (), None, "b-2", "u2"),
    ]
    rebuilt = rebuild_layout([], reports)
    assert rebuilt.operation is None
    assert shape(rebuilt.layout) == shape(layout)
    assert rebuilt.buckets == {0: 4, 1: 2, 2: 2}
    assert rebuilt.from_brokers[2].pod == "b-2"


def test_broker_report_reads_the_admin_stats() -> None:
    stats: dict[str, Any] = {
        "namespace": "default",
        "topic": "t",
        "segmentId": 3,
        "range": {"start": 0, "end": 0x7FFF},
        "buckets": 2,
        "sealed": True,
        "writable": True,
        "seal": {
            "lastPosition": 41,
            "successors": [{"segmentId": 5, "range": {"start": 0, "end": 1}, "brokerUrl": "u"}],
            "sealedAt": 1700000000.5,
        },
    }
    report = broker_report(stats, "segment-broker-1", "http://b1:8080")
    assert report == BrokerReport(
        3,
        HashRange(0, 0x7FFF),
        2,
        True,
        True,
        (5,),
        1700000000.5,
        "segment-broker-1",
        "http://b1:8080",
    )
    fenced = broker_report({**stats, "sealed": False, "seal": None, "writable": False}, "p", "u")
    assert (fenced.sealed, fenced.writable, fenced.successors) == (False, False, ())
    with pytest.raises(ValueError, match="broker p: segment 'x'"):
        broker_report({**stats, "segmentId": "x"}, "p", "u")


def test_record_from_segment_reads_spec_and_status() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "t-4"},
        "spec": {
            "topic": "t",
            "segmentId": 4,
            "range": {"start": 0, "end": 0xFF, "hex": "0000-00ff"},
            "parents": [1, 2],
            "buckets": 3,
        },
        "status": {"state": "Sealed", "createdAtEpoch": 2, "sealedAtEpoch": 5},
    }
    assert record_from_segment(body) == SegmentRecord(
        4, HashRange(0, 0xFF), (1, 2), SEALED, 3, 2, 5, "Segment t-4"
    )
    bare = record_from_segment({**body, "status": None})
    assert (bare.state, bare.created_at_epoch) == (PENDING, None)
    with pytest.raises(ValueError, match=r"Segment t-4: spec\.range\.end is None"):
        record_from_segment({**body, "spec": {**body["spec"], "range": {"start": 0}}})
    with pytest.raises(ValueError, match="Segment t-4: 'Gone' is not a valid SegmentPhase"):
        record_from_segment({**body, "status": {"state": "Gone"}})


# -- epochs --------------------------------------------------------------------------------------


def test_the_epoch_bound_counts_what_the_records_cannot_show() -> None:
    """Split (epoch 1), split (2), prune of #0 (3), prune of #1 (4): recorded epochs end at 2;
    the two missing ids may each stand for an operation and a prune."""
    layout = SegmentLayout.initial(1).split(0).split(1).prune(0).prune(1)
    origin = {1: (0,), 2: (0,), 3: (1,), 4: (1,)}
    assert layout.epoch == 4
    rebuilt = rebuild_layout(records_of(layout, origin))
    assert rebuilt.layout.epoch == 2 + 0 + 2 * 2 + 1
    blind = rebuild_layout(records_of(layout, origin, with_epochs=False))
    assert blind.layout.epoch == 0 + 3 + 2 * 2 + 1
    assert all(not s.parent_ids for s in rebuilt.layout.segments.values())


# -- the deletion rule ---------------------------------------------------------------------------


def test_only_pruned_segments_are_orphans_to_delete() -> None:
    fresh = SegmentLayout.initial(2)
    # A fresh (or missing, or rebuilt) layout next to segments it never had: nothing goes.
    assert orphans(fresh, range(7), ()).remove == ()
    assert orphans(fresh, range(7), ()).keep == (2, 3, 4, 5, 6)
    layout = SegmentLayout.initial(1).split(0).split(1).prune(0)
    assert orphans(layout, [0, 1, 2, 3, 4, 5, 6], in_flight=[5, 6]) == type(orphans(fresh, [], ()))(
        remove=(0,), keep=()
    )
    assert orphans(layout, [7], ()).keep == (7,)


def test_segment_info_defaults_used_by_the_rebuild() -> None:
    """An active segment has ``sealedAtEpoch`` 0 (the rebuild leaves it so)."""
    rebuilt = rebuild_layout([record(0, 0, 0xFFFF)])
    assert rebuilt.layout.segments[0] == SegmentInfo(0, HashRange(0, 0xFFFF))


# -- subscriptions -------------------------------------------------------------------------------


def test_subscription_entries_keep_the_backlog_of_sealed_segments() -> None:
    """#0 split into #1, #2; #1 split into #3, #4. billing drained #0 but not #1; audit was
    added after both seals (on neither broker); #0's data is on no broker any more for late."""
    layout = SegmentLayout.initial(1).split(0).split(1)

    def sealed(sid: int, subs: dict[str, bool]) -> BrokerReport:
        info = layout.segments[sid]
        return BrokerReport(
            sid,
            info.hash_range,
            1,
            True,
            True,
            info.child_ids,
            1.0,
            "b",
            "u",
            subscriptions=frozenset(subs),
            drained=frozenset(s for s, done in subs.items() if done),
        )

    reports = [sealed(0, {"billing": True, "late": False}), sealed(1, {"billing": False})]
    entries = subscription_entries(
        layout, reports, {"billing": "Stream", "audit": "Queue", "late": "Stream"}
    )
    assert entries == [
        {
            "name": "audit",
            "type": "Queue",
            "layoutEpoch": layout.epoch,
            "consumers": [],
            "drainedSegments": [0, 1],
        },
        {
            "name": "billing",
            "type": "Stream",
            "layoutEpoch": layout.epoch,
            "consumers": [],
            "drainedSegments": [0],
        },
        {
            "name": "late",
            "type": "Stream",
            "layoutEpoch": layout.epoch,
            "consumers": [],
            "drainedSegments": [1],
        },
    ]
    # Two copies of #1 (a move in progress): drained only where both say so.
    copy = sealed(1, {"billing": True})
    assert subscription_entries(layout, [*reports, copy], {"billing": "Stream"})[0][
        "drainedSegments"
    ] == [0]
    stats = {
        "segmentId": 1,
        "range": {"start": 0, "end": 0x7FFF},
        "sealed": True,
        "seal": {"lastPosition": 4, "successors": [], "sealedAt": 5.0},
        "subscriptions": {"billing": {"drained": True}, "audit": {"drained": False}},
    }
    report = broker_report(stats, "p", "u")
    assert report.subscriptions == {"billing", "audit"} and report.drained == {"billing"}


# -- the request annotation ----------------------------------------------------------------------


def test_a_request_runs_at_most_once_across_a_rebuild() -> None:
    split = rebuild_layout(
        [
            record(0, 0, 0x7FFF),
            record(1, 0x8000, 0xFFFF),
            record(2, 0x8000, 0xBFFF, (1,), PENDING),
            record(3, 0xC000, 0xFFFF, (1,), PENDING),
        ]
    ).operation
    assert split is not None
    now = "2024-01-01T00:00:00Z"
    # The annotation names the interrupted split: it is that request, reported on commit.
    same = '{"id": "r7", "op": "split", "segments": [1]}'
    resumed, last = request_after_rebuild(same, split, now)
    assert resumed is not None and resumed.request_id == "r7" and last is None
    assert resumed.to_status()["requestId"] == "r7"
    at = '{"id": "r7", "op": "split", "segments": [1], "at": 49151}'
    assert request_after_rebuild(at, split, now)[0] == resumed
    # Any other request: recorded as not run again.
    for other, op in (
        ('{"id": "r8", "op": "split", "segments": [0]}', split),
        ('{"id": "r8", "op": "split", "segments": [1], "at": 40000}', split),
        ('{"id": "r8", "op": "merge", "segments": [0, 1]}', None),
    ):
        kept, last = request_after_rebuild(other, op, now)
        assert kept == op
        assert last is not None
        assert (last["id"], last["result"], last["completedAt"]) == ("r8", "Rejected", now)
        assert "not run again" in last["message"] and "new id" in last["message"]
    assert request_after_rebuild(None, split, now) == (split, None)
    assert request_after_rebuild("{not json", None, now) == (None, None)


def test_a_second_rebuild_goes_above_the_first() -> None:
    """A rebuild raises the epoch without creating a segment; the epoch it reached is recorded
    on the Segments (``recordedAtEpoch``), so a rebuild of the rebuilt topic goes above it."""
    layout = SegmentLayout.initial(1).split(0).merge(1, 2)
    origin = {1: (0,), 2: (0,), 3: (1, 2)}
    first = rebuild_layout(records_of(layout, origin)).layout
    assert first.epoch > layout.epoch
    again = [replace(r, recorded_at_epoch=first.epoch) for r in records_of(layout, origin)]
    second = rebuild_layout(again).layout
    assert second.epoch > first.epoch
    assert shape(second) == shape(first)
    body: dict[str, Any] = {
        "metadata": {"name": "t-3"},
        "spec": {"segmentId": 3, "range": {"start": 0, "end": 0xFFFF}, "parents": [1, 2]},
        "status": {"state": "Active", "createdAtEpoch": 2, "recordedAtEpoch": 7},
    }
    assert record_from_segment(body).recorded_at_epoch == 7


# -- a creation that a pass did not finish ---------------------------------------------------


@given(
    count=st.integers(1, 8),
    data=st.data(),
)
@SETTINGS
def test_segments_of_the_first_layout_alone_are_a_creation_to_finish(
    count: int, data: st.DataObject
) -> None:
    """Any part of the first layout's Segments, Pending (not on a broker yet) or Active (on
    one, its epoch recorded or not), with brokers holding some of them: a creation that a pass
    began and did not finish."""
    first = SegmentLayout.initial(count)
    ids = data.draw(st.sets(st.sampled_from(sorted(first.segments)), min_size=1), label="ids")
    records = [
        SegmentRecord(
            segment_id=sid,
            hash_range=first.segments[sid].hash_range,
            state=data.draw(st.sampled_from([SegmentPhase.PENDING, SegmentPhase.ACTIVE])),
            created_at_epoch=data.draw(st.sampled_from([None, 0])),
        )
        for sid in sorted(ids)
    ]
    on_brokers = data.draw(st.sets(st.sampled_from(sorted(ids))), label="on brokers")
    reports = [r for r in reports_of(first) if r.segment_id in on_brokers]
    assert unfinished_creation(records, reports, first)


@given(histories())
@SETTINGS
def test_a_topic_that_ever_changed_its_layout_is_never_a_creation_to_finish(
    history: tuple[SegmentLayout, dict[int, tuple[int, ...]], list[int]],
) -> None:
    layout, origin, _ = history
    first = SegmentLayout.initial(sum(1 for sid in layout.segments if sid not in origin) or 1)
    if layout.next_segment_id == len(first.segments):
        return  # no operation ever ran: the first layout itself
    records = records_of(layout, origin)
    assert not unfinished_creation(records, reports_of(layout), first)
    assert not unfinished_creation(records, [], first)


def test_what_is_not_the_start_of_a_creation_is_rebuilt() -> None:
    first = SegmentLayout.initial(2)
    zero, one = (first.segments[i] for i in (0, 1))
    record = SegmentRecord(segment_id=0, hash_range=zero.hash_range, created_at_epoch=0)
    reports = reports_of(first)
    assert unfinished_creation([record], reports[:1], first)
    cases = {
        "nothing recorded": ([], []),
        "a broker holds a segment without its Segment": ([record], reports),
        "a sealed Segment": ([replace(record, state=SegmentPhase.SEALED)], []),
        "a seal's epoch": ([replace(record, sealed_at_epoch=1)], []),
        "a later epoch": ([replace(record, created_at_epoch=3)], []),
        "an epoch a rebuild recorded (the topic's epoch would go back to 0)": (
            [replace(record, recorded_at_epoch=4)],
            [],
        ),
        "a parent": ([replace(record, parent_ids=(5,))], []),
        "another range (initialSegments changed)": (
            [replace(record, hash_range=HashRange(0, 0x3FFF))],
            [],
        ),
        "an id the first layout does not have": ([replace(record, segment_id=2)], []),
        "a sealed segment on its broker": (
            [record],
            [replace(reports[0], sealed=True, successors=(2, 3))],
        ),
        "a broker's other range": ([record], [replace(reports[0], hash_range=one.hash_range)]),
    }
    for why, (records, found) in cases.items():
        assert not unfinished_creation(records, found, first), why
