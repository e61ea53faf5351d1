"""The split/merge/rebucket intent record: planning, round-trips, phases and recovery."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalable_topics.core.dagview import render_dag
from scalable_topics.core.layout import HashRange, SegmentLayout
from scalable_topics.core.operation import (
    Operation,
    OperationKind,
    Phase,
    Recovery,
    plan_merge,
    plan_rebucket,
    plan_split,
    recovery,
)


def test_split_plan_names_children_and_applies_deterministically() -> None:
    base = SegmentLayout.initial(2)
    op = plan_split("op-1", base, 0, parent_buckets=4, source="auto", reason="msg-rate-in")
    assert op.kind is OperationKind.SPLIT
    assert op.parents == (0,)
    assert [(c.segment_id, c.hash_range.hex(), c.buckets, c.parent_ids) for c in op.children] == [
        (2, "0000-3fff", 2, (0,)),
        (3, "4000-7fff", 2, (0,)),
    ]
    assert op.apply(base) == base.split(0)


def test_split_at_a_traffic_point() -> None:
    base = SegmentLayout.initial(1)
    op = plan_split("op", base, 0, parent_buckets=1, at=0x1000)
    assert [c.hash_range for c in op.children] == [HashRange(0, 0x1000), HashRange(0x1001, 0xFFFF)]
    assert [c.buckets for c in op.children] == [1, 1]
    assert Operation.from_status(op.to_status()) == op


def test_merge_plan_sums_buckets_and_keeps_argument_order() -> None:
    base = SegmentLayout.initial(3)
    op = plan_merge("m", base, [2, 1], parent_buckets={1: 2, 2: 3})
    (child,) = op.children
    assert child.segment_id == 3
    assert child.hash_range.hex() == "5555-ffff"
    assert child.parent_ids == (2, 1)
    assert child.buckets == 5
    assert op.apply(base).segments[3].parent_ids == (2, 1)


def test_rebucket_plan_keeps_ranges() -> None:
    base = SegmentLayout.initial(2)
    op = plan_rebucket("r", base, [1], buckets=8)
    (child,) = op.children
    assert child.hash_range == base.segments[1].hash_range
    assert child.parent_ids == (1,)
    assert child.buckets == 8
    after = op.apply(base)
    assert after.epoch == base.epoch + 1
    after.validate()


def test_invalid_plans_name_the_segment() -> None:
    base = SegmentLayout.initial(3)
    with pytest.raises(ValueError, match="segment 7"):
        plan_split("x", base, 7, parent_buckets=1)
    with pytest.raises(ValueError, match="not adjacent"):
        plan_merge("x", base, [0, 2], parent_buckets={0: 1, 2: 1})


def test_apply_refuses_another_epoch() -> None:
    base = SegmentLayout.initial(2)
    op = plan_split("op", base, 0, parent_buckets=1)
    with pytest.raises(ValueError, match="planned on epoch 0"):
        op.apply(base.split(1))


def test_phases_only_move_forward() -> None:
    op = plan_split("op", SegmentLayout.initial(1), 0, parent_buckets=1)
    sealed = op.advanced(Phase.CHILDREN_CREATED).advanced(Phase.PARENTS_SEALED)
    assert sealed.phase is Phase.PARENTS_SEALED
    with pytest.raises(ValueError, match="cannot go back"):
        sealed.advanced(Phase.INTENT)


def test_status_round_trip_and_malformed_status() -> None:
    op = plan_merge(
        "m", SegmentLayout.initial(2), [0, 1], parent_buckets={0: 2, 1: 2}, request_id="req-9"
    ).advanced(Phase.CHILDREN_CREATED)
    assert Operation.from_status(op.to_status()) == op
    with pytest.raises(ValueError, match=r"status\.operation"):
        Operation.from_status({"id": "x", "kind": "explode"})


@pytest.mark.parametrize(
    ("phase", "sealed_on_broker", "layout_moved", "expected"),
    [
        (Phase.INTENT, False, False, Recovery.ROLL_FORWARD),
        (Phase.CHILDREN_CREATED, False, False, Recovery.ROLL_FORWARD),
        (Phase.INTENT, False, True, Recovery.ROLL_BACK),
        (Phase.CHILDREN_CREATED, False, True, Recovery.ROLL_BACK),
        (Phase.CHILDREN_CREATED, True, False, Recovery.ROLL_FORWARD),
        (Phase.PARENTS_SEALED, False, False, Recovery.ROLL_FORWARD),
    ],
)
def test_recovery(
    phase: Phase, sealed_on_broker: bool, layout_moved: bool, expected: Recovery
) -> None:
    base = SegmentLayout.initial(2)
    op = plan_split("op", base, 0, parent_buckets=2).advanced(phase)
    current = base.split(1) if layout_moved else base
    assert recovery(op, current, any_parent_sealed=sealed_on_broker) is expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["split", "merge", "rebucket"]), st.integers(0, 10**6)),
        max_size=25,
    )
)
def test_operations_replayed_from_status_keep_the_ring_partitioned(
    steps: list[tuple[str, int]],
) -> None:
    layout = SegmentLayout.initial(2)
    buckets = {0: 2, 1: 2}
    for kind, pick in steps:
        active = layout.active()
        target = active[pick % len(active)]
        if kind == "split" and target.hash_range.size > 1:
            op = plan_split(
                "s", layout, target.segment_id, parent_buckets=buckets[target.segment_id]
            )
        elif kind == "merge" and len(active) > 1:
            i = pick % (len(active) - 1)
            ids = [active[i].segment_id, active[i + 1].segment_id]
            op = plan_merge("m", layout, ids, parent_buckets=buckets)
        elif kind == "rebucket":
            op = plan_rebucket("r", layout, [target.segment_id], buckets=4)
        else:
            continue
        restored = Operation.from_status(op.to_status())
        new_layout = restored.apply(layout)
        new_layout.validate()
        assert new_layout.epoch == layout.epoch + 1
        buckets.update({c.segment_id: c.buckets for c in restored.children})
        layout = new_layout
    assert render_dag(layout).startswith(f"epoch {layout.epoch}, {len(layout.active())} active")


def test_dag_drawing_shows_history_and_ring() -> None:
    layout = SegmentLayout.initial(2).split(0).split(3).merge(5, 1)
    text = render_dag(layout, rates_in={4: 1234.0}, backlog={4: 10})
    assert text.splitlines() == [
        "epoch 3, 3 active, 7 in DAG, next id 7",
        "  epoch   0  create   #0 0000-7fff, #1 8000-ffff",
        "  epoch   1  split    #0 0000-7fff -> #2 0000-3fff, #3 4000-7fff",
        "  epoch   2  split    #3 4000-7fff -> #4 4000-5fff, #5 6000-7fff",
        "  epoch   3  merge    #5 6000-7fff + #1 8000-ffff -> #6 6000-ffff",
        "  0000 |-------#2-------|---#4---|-------------------#6-------------------| ffff",
        "  active  0000-3fff-2",
        "  active  4000-5fff-4  (in 1.2k msg/s, backlog 10)",
        "  active  6000-ffff-6",
    ]
